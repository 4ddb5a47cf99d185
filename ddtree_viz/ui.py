"""What the web page shows, as plain functions over one browser tab's state. No gradio here, no maths.

`ModelHost` loads the models once (in the background, so the page can show progress) and serialises model
work; `TabState` is one browser tab's session and the round it looks at; `render_views` turns records into
everything the page shows. ddtree_viz/web.py (the page app.py serves) wires these to widgets.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from dataclasses import dataclass, field

from .engine.cache import cache_layout
from .engine.models import ModelPair, load_pair
from .engine.sampling import MAX_SEED, Sampler
from .engine.session import DecodeSession, _check_int
from .engine.engines import AUTO, default_engine, engine_for
from .errors import DDTreeVizError, InputError, ModelLoadError
from .render.cache_view import cache_layout_table, cache_spec, cache_table, cache_table_html
from .render.diff_view import output_vs_greedy_html
from .render.divergence_view import divergence_html, divergence_rows
from .render.figure import FigureSpec
from .render.layout import tree_layout
from .render.mask_plot import mask_spec
from .render.stats_view import acceptance_spec, stats_markdown, stats_summary
from .render.text import esc
from .render.tree_plot import tree_spec
from .trace import Trace, is_sampled, sampling_flags, sampling_label

VERIFY_CHOICES = {"exact": "exact", "naive (known-wrong: flattened tree)": "naive"}
PHASES = ("drafted", "verified")
RUN_REFRESH_S = 0.5  # Run redraws the page at most this often (and after the last round), not after every round
DIVERGENCE_ROUNDS = 20  # the disagreement table shows the rounds up to the one on screen, at most this many
ROUND_VIEW_CACHE = 64  # per tab: the views of this many (round, phase) pairs are kept (a round's never change)


def cpu_threads(device: str = "cpu", cores: int | None = None) -> int:
    """Torch threads for the page's model work: one core less than this process may use (at least one), leaving a
    core to the server and the browser. On the CPU, two threads against a busy browser spin-wait in every
    operation's barrier: on a 2-core machine a DDTree round went from ~25 ms to ~450 ms while the page drew
    (docs/PERFORMANCE.md, the page). On a GPU the host needs one thread."""
    if device != "cpu":
        return 1
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores - 1)


class ModelHost:
    """Loads the target + drafter once, shared by every tab; one lock so model work never interleaves."""

    def __init__(self, target: str | None, draft: str | None, dtype: str, device: str, engine: str = AUTO):
        self.args = (target, draft, dtype, device)
        # exact sessions run on it ("auto": engines.default_engine, the fastest exact engine for the target);
        # naive sessions always on transformers' forward
        self.engine = engine
        self.pair: ModelPair | None = None
        self.layout: list[dict] = []
        self.error: str | None = None
        self.stage = "waiting to load"
        self.started = time.monotonic()
        self.lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._layout_html: str | None = None

    def start(self, background: bool = True) -> None:
        if background:
            self._thread = threading.Thread(target=self._load, name="model-loader", daemon=True)
            self._thread.start()
        else:
            self._load()

    def _load(self) -> None:
        target, draft, dtype, device = self.args
        self.stage = f"loading target {target or 'embedded default'} and its drafter ({dtype}, {device})"
        try:
            pair = load_pair(target, draft, dtype=dtype, device=device)
            self.stage = "measuring the cache layout"
            self.layout = cache_layout_table(cache_layout(pair.target, pair.layer_types))
            self.pair = pair
            self.stage = "ready"
        except DDTreeVizError as exc:
            self.error, self.stage = str(exc), "failed"
        except Exception as exc:  # noqa: BLE001 - the page must say what happened and keep serving
            self.error, self.stage = f"{type(exc).__name__}: {exc}", "failed"

    def wait(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def ready(self) -> bool:
        return self.pair is not None

    def status_markdown(self) -> str:
        if self.pair is not None:
            p = self.pair
            n_gdn = sum(t == "linear_attention" for t in p.layer_types)
            return (f"**Model:** {esc(p.describe())} — {len(p.layer_types)} layers: {n_gdn} Gated DeltaNet, "
                    f"{len(p.layer_types) - n_gdn} attention; drafter block size {p.drafter.block_size}; "
                    f"exact rounds on the {esc(self.exact_engine)} engine{self._engine_why()}; naive rounds on "
                    f"transformers; {_threads()} torch thread(s)")
        if self.error is not None:
            return f"**Model load failed:** {esc(self.error)}. The page still serves: you can replay a saved trace."
        return f"**Loading models…** {esc(self.stage)} ({time.monotonic() - self.started:.0f} s)"

    @property
    def exact_engine(self) -> str:
        """The engine exact rounds run on (the named one, or auto's choice for the loaded target)."""
        if self.engine != AUTO or self.pair is None:
            return self.engine
        return default_engine(self.pair.target)

    def _engine_why(self) -> str:
        if self.engine != AUTO:
            return " (chosen with --engine)"
        return " (auto: the fastest exact engine for this target)"

    def require(self) -> ModelPair:
        if self.pair is None:
            raise ModelLoadError(self.error or "the models are still loading; try again in a moment")
        return self.pair


@dataclass
class Settings:
    prompt: str
    budget: int
    block_size: int
    max_new_tokens: int
    verify: str
    method: str
    sampler: Sampler


@dataclass
class RoundViews:
    """What one round shows (it never changes once recorded, so a tab keeps it: scrubbing redraws nothing)."""

    tree: FigureSpec
    mask: FigureSpec
    cache_chart: FigureSpec
    cache_rows: list[dict]
    cache_html: str


@dataclass
class ViewCache:
    """Per tab: views already built, for the records of one session or trace (`source`)."""

    source: object = None
    step_min: list[float] = field(default_factory=list)  # each round's lowest drafter log-prob (the colour range)
    rounds: dict = field(default_factory=dict)  # (round, phase, colour range) -> RoundViews, oldest first

    def for_source(self, source: object) -> "ViewCache":
        if source is not self.source:
            self.source, self.step_min, self.rounds = source, [], {}
        return self


@dataclass
class TabState:
    """One browser tab: its live session (or a replayed trace) and the round it shows."""

    session: DecodeSession | None = None
    settings: Settings | None = None
    trace: Trace | None = None  # the records on screen (a live session's snapshot, or a replayed file)
    view: int = -1  # round index shown
    replay: bool = False
    greedy_s: float = 0.0
    views: ViewCache = field(default_factory=ViewCache)
    # the last Step (or Run refresh) on the server, ms: "rounds" (engine time of its rounds), "reference" (the
    # greedy reference's model time), "step" (wall time of ui.step / the refresh), "views" (building the views)
    timing: dict = field(default_factory=dict)


def _settings(prompt, budget, block_size, max_new_tokens, verify, method, temperature=0.0, top_p=1.0, top_k=0,
              seed=0) -> Settings:
    if verify not in VERIFY_CHOICES:
        raise InputError(f"unknown verification mode {verify!r}")
    sampler = Sampler(temperature, _check_int("top-k", top_k, 0, 2**31 - 1), top_p, _check_int("seed", seed, 0, MAX_SEED))
    return Settings(prompt, budget, block_size, max_new_tokens, VERIFY_CHOICES[verify], method, sampler)


def new_seed() -> int:
    """A fresh seed for the page's 'New seed' button."""
    return secrets.randbelow(MAX_SEED + 1)


def _ensure_session(host: ModelHost, tab: TabState, s: Settings) -> None:
    """Keep the tab's live session, or start a new one for a new prompt / changed settings / after a replay."""
    if tab.session is not None and not tab.replay and tab.settings == s:
        return
    pair = host.require()
    engine = engine_for(host.engine, s.verify, pair.target)
    session = DecodeSession(pair, budget=s.budget, max_new_tokens=s.max_new_tokens, verify=s.verify,
                            method=s.method, block_size=s.block_size, engine=engine, sampler=s.sampler)
    session.prefill(s.prompt)
    tab.session, tab.settings, tab.replay, tab.view = session, s, False, -1


def _refresh(tab: TabState, started: float, rounds_before: int, reference_before: float | None = None) -> None:
    """Re-read the live session's records (greedy reference extended to the tokens generated so far) and note
    what the Step cost: its rounds' engine time, the reference's model time, the wall time."""
    before = tab.session.greedy_seconds if reference_before is None else reference_before
    tab.trace = tab.session.to_trace()
    tab.greedy_s = tab.session.greedy_seconds
    new = tab.session.history[rounds_before:]
    tab.timing = {"rounds": sum(sum(r.timings_ms.values()) for r in new), "n_rounds": len(new),
                  "reference": (tab.greedy_s - before) * 1e3, "step": (time.perf_counter() - started) * 1e3}


def step(host: ModelHost, tab: TabState, prompt, budget, block_size, max_new_tokens, verify, method, temperature=0.0,
         top_p=1.0, top_k=0, seed=0) -> TabState:
    """One round. A new prompt or changed settings (a new seed included) start a new session first."""
    s = _settings(prompt, budget, block_size, max_new_tokens, verify, method, temperature, top_p, top_k, seed)
    with host.lock:
        _ensure_session(host, tab, s)
        if tab.session.done:
            raise InputError("this session has finished (end of text or max new tokens): press Reset or change the prompt")
        started, before = time.perf_counter(), len(tab.session.history)
        tab.session.step()
        _refresh(tab, started, before)
    tab.view = len(tab.trace.steps) - 1
    return tab


def run_rounds(host: ModelHost, tab: TabState, prompt, budget, block_size, max_new_tokens, verify, method,
               temperature=0.0, top_p=1.0, top_k=0, seed=0, *, min_interval: float = 0.0):
    """Run to the end, yielding the tab as the page should redraw: after every round (min_interval 0), or at most
    every `min_interval` seconds and after the last round (the page's Run: RUN_REFRESH_S). The greedy reference
    keeps up round by round either way (so a redraw never waits for a backlog of it)."""
    s = _settings(prompt, budget, block_size, max_new_tokens, verify, method, temperature, top_p, top_k, seed)
    with host.lock:
        _ensure_session(host, tab, s)
    started, before, reference = time.perf_counter(), len(tab.session.history), tab.session.greedy_seconds
    while not tab.session.done:
        with host.lock:
            tab.session.step()
            if not (tab.session.done or time.perf_counter() - started >= min_interval):
                tab.session.greedy(len(tab.session.generated))  # the reference, keeping up
                continue
            _refresh(tab, started, before, reference)
        tab.view = len(tab.trace.steps) - 1
        yield tab
        started, before, reference = time.perf_counter(), len(tab.session.history), tab.session.greedy_seconds


def reset(tab: TabState) -> TabState:
    return TabState()


def load_replay(tab: TabState, path: str) -> TabState:
    trace = Trace.load(path)
    return TabState(trace=trace, view=len(trace.steps) - 1, replay=True)


def move(tab: TabState, delta: int | None = None, to: int | None = None) -> TabState:
    if tab.trace is None or not tab.trace.steps:
        return tab
    last = len(tab.trace.steps) - 1
    tab.view = max(0, min(last, (tab.view + delta) if delta is not None else int(to)))
    return tab


# ------------------------------------------------------------------------------------------------------------
# Views
# ------------------------------------------------------------------------------------------------------------


@dataclass
class Views:
    """Everything the page shows. Figures are FigureSpecs (plain plotly JSON, what the page sends); `tree`, `mask`,
    `cache_chart` and `acceptance` give them as checked go.Figures (scripts, tests)."""

    status: str
    tree_spec: FigureSpec | None
    mask_spec: FigureSpec | None
    cache_rows: list[dict]
    cache_spec: FigureSpec | None
    diff_html: str
    acceptance_spec: FigureSpec | None
    stats: str
    divergence: str
    rounds: int
    view: int
    cache_html: str = ""
    layout_html: str = ""

    @property
    def tree(self):
        return self.tree_spec.figure() if self.tree_spec is not None else None

    @property
    def mask(self):
        return self.mask_spec.figure() if self.mask_spec is not None else None

    @property
    def cache_chart(self):
        return self.cache_spec.figure() if self.cache_spec is not None else None

    @property
    def acceptance(self):
        return self.acceptance_spec.figure() if self.acceptance_spec is not None else None


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def layout_html(host: ModelHost) -> str:
    """The per-layer cache layout measured at load (before the first step), as the page's compact table."""
    if host.layout and getattr(host, "_layout_html", None) is None:
        host._layout_html = cache_table_html(host.layout)
    return host._layout_html or ""


def _token_text(tab: TabState):
    if tab.session is not None and not tab.replay:
        return tab.session.token_text
    texts = tab.trace.token_texts if tab.trace is not None else {}
    return lambda i: texts.get(str(i), f"⟨{i}⟩")


def _color_floor(tab: TabState) -> float:
    """The lowest drafter log-prob over the session's rounds (the tree's colour range, the same for every round),
    kept per round as rounds arrive."""
    cache, steps = tab.views, tab.trace.steps
    for s in steps[len(cache.step_min):]:
        cache.step_min.append(min((n.logprob for n in s.nodes[1:]), default=float("inf")))
    lo = min(cache.step_min, default=float("inf"))
    return lo if lo != float("inf") else -1.0


def _round_views(tab: TabState, k: int, phase: str, lo: float) -> RoundViews:
    cache = tab.views
    key = (k, phase, lo)
    got = cache.rounds.pop(key, None)
    if got is None:
        step, text = tab.trace.steps[k], _token_text(tab)
        rows = cache_table(step)
        got = RoundViews(
            tree=tree_spec(tree_layout(step, phase=phase, token_text=text), phase=phase, token_text=text, cmin=lo,
                           cmax=0.0),
            mask=mask_spec(step), cache_chart=cache_spec(step), cache_rows=rows, cache_html=cache_table_html(rows))
    cache.rounds[key] = got  # most recent last
    while len(cache.rounds) > ROUND_VIEW_CACHE:
        cache.rounds.pop(next(iter(cache.rounds)))
    return got


def _page_timing(tab: TabState, trace: Trace) -> list[tuple[str, str]]:
    """Rows for the stats table saying what each time measures."""
    rows = []
    t = tab.timing
    if "step" in t and tab.session is not None and not tab.replay:
        n = t.get("n_rounds", 1)
        what = "round" if n == 1 else f"{n} rounds"
        rows.append(("last Step on the server, wall time (not the browser's drawing)",
                     f"{t['step'] + t.get('views', 0):.0f} ms: {what} {t['rounds']:.0f} ms engine time + greedy reference "
                     f"{t['reference']:.0f} ms + bookkeeping {max(t['step'] - t['rounds'] - t['reference'], 0):.0f} ms "
                     f"+ building the views {t.get('views', 0):.0f} ms"))
    engine = trace.settings.get("engine")
    if engine:
        rows.insert(0, ("engine", esc(engine)))
    return rows


def render_views(host: ModelHost, tab: TabState, phase: str = "verified") -> Views:
    """Everything the page shows for the round on screen. A round's tree, mask and cache views are built once per
    tab (RoundViews); the rest is bounded (the disagreement table: the last DIVERGENCE_ROUNDS rounds)."""
    started = time.perf_counter()
    if tab.trace is None or not tab.trace.steps:
        status = "Type a prompt and press **Step** (one round) or **Run** (to the end). Keys: s = step, ← / → = back / forward."
        return Views(status, None, None, host.layout, None, "", None, "", "", 0, 0, cache_html="",
                     layout_html=layout_html(host))
    trace, k = tab.trace, max(0, min(tab.view, len(tab.trace.steps) - 1))
    tab.views.for_source(tab.session if tab.session is not None and not tab.replay else trace)
    step = trace.steps[k]
    text = _token_text(tab)
    lo = _color_floor(tab)
    rv = _round_views(tab, k, phase, lo)
    greedy_tok_s = ddtree_tok_s = None
    if tab.session is not None and not tab.replay and tab.greedy_s > 0:
        # the same clock for both: model time only (prefill included), none of the page's own work
        greedy_tok_s = len(trace.greedy_ids or ()) / tab.greedy_s
        round_s = sum(sum(s.timings_ms.values()) for s in trace.steps) / 1e3 + trace.prefill_ms / 1e3
        ddtree_tok_s = len(trace.output_ids) / round_s if round_s > 0 else None
    summary = stats_summary(trace, greedy_tok_s=greedy_tok_s, ddtree_tok_s=ddtree_tok_s)
    mode = "replay of a saved trace (no model)" if tab.replay else "live"
    naive = " — **naive verification: the known-wrong flattened-tree behaviour**" if step.verify == "naive" else ""
    status = (f"Round {k + 1} of {len(trace.steps)} ({mode}){naive}: accepted {step.acceptance - 1} drafted tokens "
              f"+ bonus, {len(step.nodes)} tree positions, committed length {step.committed_len}.")
    if is_sampled(trace.settings):
        status += (f" Target's choice: {esc(sampling_label(trace.settings))}, noise "
                   f"{esc(trace.settings.get('noise'))} (reproduce: `run {esc(sampling_flags(trace.settings))}`).")
    if tab.session is not None and not tab.replay and tab.session.done:
        status += " Finished."
    first = max(0, k + 1 - DIVERGENCE_ROUNDS)
    divergence = divergence_html(divergence_rows(trace.steps[first: k + 1], text))
    if first > 0:
        divergence = (f'<div style="color:#777;font-size:85%">rounds {first + 1}–{k + 1} of {len(trace.steps)} (the '
                      f"{DIVERGENCE_ROUNDS} up to the round shown; scrub back for earlier ones)</div>" + divergence)
    views = Views(
        status=status, tree_spec=rv.tree, mask_spec=rv.mask, cache_rows=rv.cache_rows, cache_spec=rv.cache_chart,
        diff_html=output_vs_greedy_html(trace, text, upto_step=k), acceptance_spec=acceptance_spec(trace.steps[: k + 1]),
        stats="", divergence=divergence, rounds=len(trace.steps), view=k, cache_html=rv.cache_html,
        layout_html=layout_html(host),
    )
    tab.timing["views"] = (time.perf_counter() - started) * 1e3
    views.stats = stats_markdown(summary, extra=_page_timing(tab, trace))
    return views
