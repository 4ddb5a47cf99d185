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
from .engine.session import MAX_BUDGET, DecodeSession, _check_int
from .engine.engines import AUTO, ENGINES, default_engine, engine_for
from .errors import DDTreeVizError, InputError, ModelLoadError
from .render.cache_view import cache_layout_table, cache_spec, cache_table, cache_table_html
from .render.diff_view import output_vs_greedy_html
from .render.divergence_view import divergence_html, divergence_rows
from .render.figure import FigureSpec
from .render.layout import PHASES, tree_layout
from .render.mask_plot import mask_spec
from .render.stats_view import acceptance_spec, stats_markdown, stats_summary
from .render.text import esc
from .render.tree_plot import tree_spec
from .render.budget_view import budget_spec, depth_spec
from .render.compare_view import compare_html
from .render.grid_view import grid_data, grid_spec
from .render.inspect_view import inspector_html, node_choices, stop_html
from .analysis import config_label
from .trace import CompareTrace, Trace, is_sampled, load_any, sampling_flags, sampling_label

VERIFY_CHOICES = {"exact": "exact", "naive (known-wrong: flattened tree)": "naive"}
SAME = "same"  # compare mode: the engine / dtype of the first configuration
DTYPES = ("float32", "bfloat16", "float16")
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
        self._pairs: dict[str, ModelPair] = {}  # compare mode: the pair in another dtype, loaded on first use
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

    def pair_for(self, dtype: str | None) -> ModelPair:
        """The loaded pair, or (compare mode) the same models in another dtype, loaded once on first use."""
        pair = self.require()
        if dtype in (None, "", SAME) or dtype == self.args[2]:
            return pair
        if dtype not in DTYPES:
            raise InputError(f"dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
        if dtype not in self._pairs:
            target, draft, _, device = self.args
            self._pairs[dtype] = load_pair(target, draft, dtype=dtype, device=device)
        return self._pairs[dtype]


@dataclass
class Settings:
    prompt: str
    budget: int
    block_size: int
    max_new_tokens: int
    verify: str
    method: str
    sampler: Sampler


@dataclass(frozen=True)
class CompareSettings:
    """Compare mode: the second configuration (same prompt, max new tokens and sampler as the first)."""

    budget: int
    block_size: int
    method: str
    verify: str
    engine: str  # an engine name, or SAME
    dtype: str  # a dtype, or SAME


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
    rounds: dict = field(default_factory=dict)  # (round, phase, colour range, title) -> RoundViews, oldest first
    grids: dict = field(default_factory=dict)  # round -> the drafter's grid figure

    def for_source(self, source: object) -> "ViewCache":
        if source is not self.source:
            self.source, self.step_min, self.rounds, self.grids = source, [], {}, {}
        return self


@dataclass
class TabState:
    """One browser tab: its live session (or a replayed trace) and the round it shows; in compare mode a second
    session (B) on the same prompt, stepped in lockstep."""

    session: DecodeSession | None = None
    settings: Settings | None = None
    trace: Trace | None = None  # the records on screen (a live session's snapshot, or a replayed file)
    view: int = -1  # round index shown
    replay: bool = False
    greedy_s: float = 0.0
    other: DecodeSession | None = None  # compare mode: configuration B's live session
    other_settings: CompareSettings | None = None
    other_trace: Trace | None = None  # B's records (live snapshot, or the replayed compare trace's)
    inspect: int | None = None  # tree position the node inspector shows (None: the first rejected, or the root)
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


def compare_settings(on, budget=32, block_size=16, method="ddtree", verify="exact", engine=SAME,
                     dtype=SAME) -> CompareSettings | None:
    """The compare controls as settings (None when compare mode is off)."""
    if not on:
        return None
    if verify not in VERIFY_CHOICES:
        raise InputError(f"unknown verification mode {verify!r}")
    if engine not in (SAME, AUTO, *ENGINES):
        raise InputError(f"engine must be one of {SAME}, {AUTO}, {', '.join(ENGINES)}, not {engine!r}")
    if dtype not in (SAME, *DTYPES):
        raise InputError(f"dtype must be one of {SAME}, {', '.join(DTYPES)}, not {dtype!r}")
    return CompareSettings(_check_int("compare budget", budget, 1, MAX_BUDGET),
                           _check_int("compare block size", block_size, 2, 4096), method, VERIFY_CHOICES[verify],
                           engine, dtype)


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
    tab.other = tab.other_settings = tab.other_trace = None
    tab.inspect = None


def _ensure_other(host: ModelHost, tab: TabState, c: CompareSettings | None) -> None:
    """Compare mode: keep B's session, or start it for new compare settings and catch it up with A's rounds (the
    two step in lockstep). Off: drop it."""
    if c is None:
        tab.other = tab.other_settings = tab.other_trace = None
        return
    if tab.other is not None and tab.other_settings == c:
        return
    s = tab.settings
    pair = host.pair_for(None if c.dtype == SAME else c.dtype)
    engine = engine_for(host.engine if c.engine == SAME else c.engine, c.verify, pair.target)
    other = DecodeSession(pair, budget=c.budget, max_new_tokens=s.max_new_tokens, verify=c.verify, method=c.method,
                          block_size=min(c.block_size, pair.drafter.block_size), engine=engine, sampler=s.sampler)
    other.prefill(s.prompt)
    while len(other.history) < len(tab.session.history) and not other.done:
        other.step()
    tab.other, tab.other_settings = other, c
    tab.other_trace = other.to_trace()


def _step_both(tab: TabState) -> None:
    """One round of A and (compare mode) of B, unless B has finished."""
    tab.session.step()
    if tab.other is not None and not tab.other.done:
        tab.other.step()


def _refresh(tab: TabState, started: float, rounds_before: int, reference_before: float | None = None) -> None:
    """Re-read the live sessions' records (greedy reference extended to the tokens generated so far) and note what
    the Step cost: its rounds' engine time (A's), the reference's model time, the wall time."""
    before = tab.session.greedy_seconds if reference_before is None else reference_before
    tab.trace = tab.session.to_trace()
    tab.greedy_s = tab.session.greedy_seconds
    if tab.other is not None:
        tab.other_trace = tab.other.to_trace()
    new = tab.session.history[rounds_before:]
    tab.timing = {"rounds": sum(sum(r.timings_ms.values()) for r in new), "n_rounds": len(new),
                  "reference": (tab.greedy_s - before) * 1e3, "step": (time.perf_counter() - started) * 1e3}


def step(host: ModelHost, tab: TabState, prompt, budget, block_size, max_new_tokens, verify, method, temperature=0.0,
         top_p=1.0, top_k=0, seed=0, *compare) -> TabState:
    """One round (of both configurations in compare mode: `compare` = compare_settings' arguments). A new prompt or
    changed settings (a new seed included) start a new session first."""
    s = _settings(prompt, budget, block_size, max_new_tokens, verify, method, temperature, top_p, top_k, seed)
    c = compare_settings(*compare) if compare else None
    with host.lock:
        _ensure_session(host, tab, s)
        _ensure_other(host, tab, c)
        if tab.session.done:
            raise InputError("this session has finished (end of text or max new tokens): press Reset or change the prompt")
        started, before = time.perf_counter(), len(tab.session.history)
        _step_both(tab)
        _refresh(tab, started, before)
    tab.view = len(tab.trace.steps) - 1
    tab.inspect = None
    return tab


def run_rounds(host: ModelHost, tab: TabState, prompt, budget, block_size, max_new_tokens, verify, method,
               temperature=0.0, top_p=1.0, top_k=0, seed=0, *compare, min_interval: float = 0.0):
    """Run to the end (both configurations in compare mode, in lockstep), yielding the tab as the page should
    redraw: after every round (min_interval 0), or at most every `min_interval` seconds and after the last round
    (the page's Run: RUN_REFRESH_S). The greedy reference keeps up round by round either way (a redraw never
    waits for a backlog of it)."""
    s = _settings(prompt, budget, block_size, max_new_tokens, verify, method, temperature, top_p, top_k, seed)
    c = compare_settings(*compare) if compare else None
    with host.lock:
        _ensure_session(host, tab, s)
        _ensure_other(host, tab, c)
    started, before, reference = time.perf_counter(), len(tab.session.history), tab.session.greedy_seconds
    while not tab.session.done or (tab.other is not None and not tab.other.done):
        with host.lock:
            if tab.session.done:  # A finished first: B goes on alone
                tab.other.step()
            else:
                _step_both(tab)
            if not (_finished(tab) or time.perf_counter() - started >= min_interval):
                tab.session.greedy(len(tab.session.generated))  # the reference, keeping up
                continue
            _refresh(tab, started, before, reference)
        tab.view = max(len(tab.trace.steps), len(tab.other_trace.steps) if tab.other_trace else 0) - 1
        tab.inspect = None
        yield tab
        started, before, reference = time.perf_counter(), len(tab.session.history), tab.session.greedy_seconds


def _finished(tab: TabState) -> bool:
    return tab.session.done and (tab.other is None or tab.other.done)


def reset(tab: TabState) -> TabState:
    return TabState()


def load_replay(tab: TabState, path: str) -> TabState:
    """A saved trace, or a compare trace (both configurations), to replay with no model."""
    loaded = load_any(path)
    if isinstance(loaded, CompareTrace):
        return TabState(trace=loaded.a, other_trace=loaded.b, replay=True,
                        view=max(len(loaded.a.steps), len(loaded.b.steps)) - 1)
    return TabState(trace=loaded, view=len(loaded.steps) - 1, replay=True)


def saved_trace(tab: TabState) -> Trace | CompareTrace:
    """What 'Download trace' writes: the session's trace, or in compare mode both (a compare trace)."""
    if tab.trace is None:
        raise InputError("nothing to download yet: step or replay first")
    return CompareTrace(tab.trace, tab.other_trace) if tab.other_trace is not None else tab.trace


def rounds_shown(tab: TabState) -> int:
    """Rounds the round slider spans: the longer of the two sessions in compare mode."""
    n = len(tab.trace.steps) if tab.trace is not None else 0
    return max(n, len(tab.other_trace.steps) if tab.other_trace is not None else 0)


def move(tab: TabState, delta: int | None = None, to: int | None = None) -> TabState:
    if tab.trace is None or not rounds_shown(tab):
        return tab
    last = rounds_shown(tab) - 1
    tab.view = max(0, min(last, (tab.view + delta) if delta is not None else int(to)))
    tab.inspect = None
    return tab


def inspect(tab: TabState, node) -> TabState:
    """Point the node inspector at tree position `node` of the round shown (a number, its text, or a selector
    label '3 · ...'); blank or unknown leaves it as it was."""
    if node is None or (isinstance(node, str) and not node.strip()):
        return tab
    try:
        pos = int(str(node).split("·")[0].strip())
    except ValueError:
        raise InputError(f"not a tree position: {node!r}") from None
    step = _shown_step(tab.trace, tab.view)
    if step is not None and 0 <= pos < len(step.nodes):
        tab.inspect = pos
    return tab


# ------------------------------------------------------------------------------------------------------------
# Views
# ------------------------------------------------------------------------------------------------------------


def _checked(fig):
    """A FigureSpec as its checked go.Figure (other figures as they are)."""
    return fig.figure() if isinstance(fig, FigureSpec) else fig


@dataclass
class Views:
    """Everything the page shows. The main figures are FigureSpecs (plain plotly JSON: what the page sends, as
    gr.Plot calls their to_json); the properties tree, mask, cache_chart, acceptance and tree_b give them as
    checked go.Figures (scripts, tests)."""

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
    grid_spec: FigureSpec | None = None  # the drafter's grid of the round (None: not recorded)
    budget_spec: FigureSpec | None = None  # the budget that would have done: the round's curve and the session's
    depth_spec: FigureSpec | None = None  # acceptance histogram and per-depth conditional acceptance
    stop: str = ""  # where and why the round's walk stopped
    inspector: str = ""  # the node inspector
    node_choices: list = field(default_factory=list)  # the inspector's selector: (label, tree position)
    inspect: int | None = None  # the node it shows
    tree_b_spec: FigureSpec | None = None  # compare mode: configuration B's tree of the round
    compare: str = ""  # compare mode: both outputs token by token, where they part, verdicts
    cache_html: str = ""  # the per-layer cache of the round as the page's compact table
    layout_html: str = ""  # the cache layout measured at load, the same way

    @property
    def tree(self):
        return _checked(self.tree_spec)

    @property
    def mask(self):
        return _checked(self.mask_spec)

    @property
    def cache_chart(self):
        return _checked(self.cache_spec)

    @property
    def acceptance(self):
        return _checked(self.acceptance_spec)

    @property
    def tree_b(self):
        return _checked(self.tree_b_spec)

    @property
    def grid(self):
        return _checked(self.grid_spec)

    @property
    def budget(self):
        return _checked(self.budget_spec)

    @property
    def depth(self):
        return _checked(self.depth_spec)


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def layout_html(host: ModelHost) -> str:
    """The per-layer cache layout measured at load (before the first step), as the page's compact table."""
    if host.layout and host._layout_html is None:
        host._layout_html = cache_table_html(host.layout)
    return host._layout_html or ""


def _shown_step(trace: Trace | None, k: int):
    """Round k of a trace (its last one when it has fewer: compare mode's shorter side), or None."""
    if trace is None or not trace.steps:
        return None
    return trace.steps[max(0, min(k, len(trace.steps) - 1))]


def _tree_of(trace: Trace, k: int, phase: str, text, title: str | None = None, lo: float | None = None) -> FigureSpec:
    step = _shown_step(trace, k)
    layout = tree_layout(step, phase=phase, token_text=text)
    if lo is None:
        lo = (min(n.logprob for s in trace.steps for n in s.nodes[1:])
              if any(len(s.nodes) > 1 for s in trace.steps) else -1.0)
    return tree_spec(layout, phase=phase, token_text=text, cmin=lo, cmax=0.0, title=title)


def _analysis_views(tab: TabState, trace: Trace, k: int, text) -> dict:
    """The 'why did this round stop there' views of round k (grid, budget curve, acceptance by depth, the stop and
    the node inspector)."""
    step = _shown_step(trace, k)
    steps = trace.steps[: step.index + 1]
    html, choices, node = inspector_view(tab)
    grid = tab.views.grids.get(step.index) if trace is tab.trace else None
    if grid is None and step.draft_top_ids:
        grid = grid_spec(grid_data(step, text))  # a round's grid never changes: built once per tab
        if trace is tab.trace:
            tab.views.grids[step.index] = grid
            while len(tab.views.grids) > ROUND_VIEW_CACHE:
                tab.views.grids.pop(next(iter(tab.views.grids)))
    return dict(
        grid_spec=grid, budget_spec=budget_spec(steps),
        depth_spec=depth_spec(steps, trace.settings.get("block_size")), stop=stop_html(step, text) if step.nodes else "",
        inspector=html, node_choices=choices, inspect=node,
    )


def inspector_view(tab: TabState) -> tuple[str, list, int | None]:
    """The node inspector for the round shown: (its HTML, the selector's choices, the node shown). With no node
    picked it shows the last accepted one, where the walk stopped."""
    step = _shown_step(tab.trace, tab.view)
    if step is None or not step.nodes:
        return inspector_html(None, None), [], None
    node = tab.inspect if tab.inspect is not None and tab.inspect < len(step.nodes) else step.accepted[-1]
    text = _token_text(tab)
    return inspector_html(step, node, text), node_choices(step, text), node


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


def _round_views(tab: TabState, k: int, phase: str, lo: float, title: str | None = None) -> RoundViews:
    cache = tab.views
    key = (k, phase, lo, title)
    got = cache.rounds.pop(key, None)
    if got is None:
        step, text = tab.trace.steps[k], _token_text(tab)
        rows = cache_table(step)
        got = RoundViews(tree=_tree_of(tab.trace, k, phase, text, title, lo=lo), mask=mask_spec(step),
                         cache_chart=cache_spec(step), cache_rows=rows, cache_html=cache_table_html(rows))
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
    """Everything the page shows for the round on screen. A round's tree, mask, cache views and grid are built once
    per tab (RoundViews); the rest is bounded (the disagreement table: the last DIVERGENCE_ROUNDS rounds)."""
    started = time.perf_counter()
    if tab.trace is None or not tab.trace.steps:
        status = "Type a prompt and press **Step** (one round) or **Run** (to the end). Keys: s = step, ← / → = back / forward."
        return Views(status, None, None, host.layout, None, "", None, "", "", 0, 0, layout_html=layout_html(host))
    trace, k = tab.trace, max(0, min(tab.view, rounds_shown(tab) - 1))
    tab.views.for_source(tab.session if tab.session is not None and not tab.replay else trace)
    step = _shown_step(trace, k)
    text = _token_text(tab)
    compare = tab.other_trace is not None and bool(tab.other_trace.steps)
    k = step.index
    rv = _round_views(tab, k, phase, _color_floor(tab), _side_title("A", trace, tab.view) if compare else None)
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
    extra = {}
    if compare:
        other_text = _other_text(tab)
        kb = max(0, min(tab.view, len(tab.other_trace.steps) - 1))
        extra = dict(tree_b_spec=_tree_of(tab.other_trace, kb, phase, other_text, _side_title("B", tab.other_trace, kb)),
                     compare=compare_html(trace, tab.other_trace, text, view=tab.view))
        status += f" Compare mode: A = {esc(config_label(trace.settings))}, B = {esc(config_label(tab.other_trace.settings))}."
    first = max(0, k + 1 - DIVERGENCE_ROUNDS)
    divergence = divergence_html(divergence_rows(trace.steps[first: k + 1], text))
    if first > 0:
        divergence = (f'<div style="color:#777;font-size:85%">rounds {first + 1}–{k + 1} of {len(trace.steps)} (the '
                      f"{DIVERGENCE_ROUNDS} up to the round shown; scrub back for earlier ones)</div>" + divergence)
    views = Views(
        status=status, tree_spec=rv.tree, mask_spec=rv.mask, cache_rows=rv.cache_rows, cache_spec=rv.cache_chart,
        diff_html=output_vs_greedy_html(trace, text, upto_step=k), acceptance_spec=acceptance_spec(trace.steps[: k + 1]),
        stats="", divergence=divergence, rounds=rounds_shown(tab), view=max(0, min(tab.view, rounds_shown(tab) - 1)),
        cache_html=rv.cache_html, layout_html=layout_html(host), **_analysis_views(tab, trace, k, text), **extra,
    )
    tab.timing["views"] = (time.perf_counter() - started) * 1e3
    views.stats = stats_markdown(summary, extra=_page_timing(tab, trace))
    return views


def _side_title(side: str, trace: Trace, k: int) -> str:
    step = _shown_step(trace, k)
    note = "" if step.index == k else " (finished)"
    return (f"{side}: {config_label(trace.settings)} · round {step.index + 1}{note} · {step.acceptance} token(s)"
            + (" · NAIVE (known-wrong)" if step.verify == "naive" else ""))


def _other_text(tab: TabState):
    if tab.other is not None and not tab.replay:
        return tab.other.token_text
    texts = tab.other_trace.token_texts
    return lambda i: texts.get(str(i), f"⟨{i}⟩")
