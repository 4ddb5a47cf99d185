"""What the web page shows, as plain functions over one browser tab's state. No gradio here, no maths.

`ModelHost` loads the models once (in the background, so the page can show progress) and serialises model
work; `TabState` is one browser tab's session and the round it looks at; `render_views` turns records into
everything the page shows. ddtree_viz/web.py (the page app.py serves) wires these to widgets.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import secrets
import shutil
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path

from .engine.cache import cache_layout
from .engine.models import ModelPair, load_pair
from .engine.sampling import MAX_SEED, Sampler
from .engine.session import DecodeSession, _check_int
from .engine.engines import engine_for
from .errors import DDTreeVizError, InputError, ModelLoadError
from .render.cache_view import cache_figure, cache_layout_table, cache_table
from .render.diff_view import output_vs_greedy_html
from .render.divergence_view import divergence_html, divergence_rows
from .render.layout import tree_layout
from .render.mask_plot import mask_figure
from .render.stats_view import acceptance_figure, stats_markdown, stats_summary
from .render.text import esc
from .render.tree_plot import tree_figure
from .trace import MAX_TRACE_BYTES, Trace, is_sampled, sampling_flags, sampling_label

VERIFY_CHOICES = {"exact": "exact", "naive (known-wrong: flattened tree)": "naive"}
PHASES = ("drafted", "verified")
MAX_UPLOAD_BYTES = 16 * 1024 * 1024  # a trace uploaded to the page (the page says so; `replay FILE` takes up to
#                                      trace.MAX_TRACE_BYTES)
DIVERGENCE_ROUNDS = 100  # the page's divergence table shows the last this many rounds up to the one on screen


class FairLock:
    """A lock granted in the order it was asked for. The model is shared by every tab: a Run releases it between
    rounds, and a Step another tab asked for meanwhile goes next (threading.Lock lets the Run take it straight back)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._next = 0  # the next ticket to hand out
        self._serving = 0  # the ticket that holds the lock

    def __enter__(self) -> "FairLock":
        with self._cond:
            ticket = self._next
            self._next += 1
            while ticket != self._serving:
                self._cond.wait()
        return self

    def __exit__(self, *exc) -> None:
        with self._cond:
            self._serving += 1
            self._cond.notify_all()


class ModelHost:
    """Loads the target + drafter once, shared by every tab; one fair lock so model work never interleaves and tabs
    take turns round by round."""

    def __init__(self, target: str | None, draft: str | None, dtype: str, device: str, engine: str = "transformers"):
        self.args = (target, draft, dtype, device)
        self.engine = engine  # exact sessions run on it; naive sessions always on transformers' forward
        self.pair: ModelPair | None = None
        self.layout: list[dict] = []
        self.error: str | None = None
        self.stage = "waiting to load"
        self.started = time.monotonic()
        self.lock = FairLock()
        self.replay_only = False  # `replay FILE` / app.py --replay without --target: no model, by design
        self._thread: threading.Thread | None = None

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
                    f"exact rounds on the {esc(self.engine)} engine")
        if self.replay_only:
            return ("**Replay mode (no model):** step through the saved trace with Back / Forward and the round slider, "
                    "or load another; Step and Run need a model (start the app without --replay, or with --target).")
        if self.error is not None:
            return f"**Model load failed:** {esc(self.error)}. The page still serves: you can replay a saved trace."
        return f"**Loading models…** {esc(self.stage)} ({time.monotonic() - self.started:.0f} s)"

    def require(self) -> ModelPair:
        if self.pair is None:
            if self.replay_only:
                raise ModelLoadError("replay mode (no model): Step and Run need a model; replay a trace instead, or "
                                     "start the app without --replay")
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


# Files the page writes for a tab to download (a trace, an export) live in one folder per server process, one
# sub-folder per tab: a tab keeps only its latest of each, its folder goes when the tab does, the whole folder at exit.
_FILES: Path | None = None
_FILES_LOCK = threading.Lock()


def files_root() -> Path:
    global _FILES
    with _FILES_LOCK:
        if _FILES is None or not _FILES.is_dir():
            _FILES = Path(tempfile.mkdtemp(prefix="ddtree-viz-files-"))
            atexit.register(shutil.rmtree, _FILES, True)
        return _FILES


@dataclass
class TabState:
    """One browser tab: its live session (or a replayed trace) and the round it shows.

    Every change happens in place under `lock` (the page's handlers all hold the same object, and a Run going on in
    one handler must see a Reset made in another); `epoch` counts the changes that end a Run: a reset, a replay, a
    new session (a new prompt or settings) and a new Run."""

    session: DecodeSession | None = None
    settings: Settings | None = None
    trace: Trace | None = None  # the records on screen (a live session's snapshot, or a replayed file)
    view: int = -1  # round index shown
    replay: bool = False
    greedy_s: float = 0.0
    epoch: int = 0

    def __post_init__(self) -> None:  # not fields: a copy (dataclasses.replace) gets its own
        self.lock = threading.RLock()
        self.folder: Path | None = None  # this tab's downloads and exports

    def __deepcopy__(self, memo) -> "TabState":  # gradio copies a tab's initial value: a fresh lock, no folder
        return dataclasses.replace(self)

    def clear(self) -> None:
        """Back to an empty tab (a Reset); a Run going on stops at its next round."""
        with self.lock:
            self.session, self.settings, self.trace, self.view, self.replay, self.greedy_s = None, None, None, -1, False, 0.0
            self.epoch += 1

    def free(self) -> None:
        """The tab is gone: drop its session and records and delete its files."""
        self.clear()
        with self.lock:
            folder, self.folder = self.folder, None
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)

    def new_folder(self, kind: str) -> Path:
        """An empty folder for the file this tab offers for download (`kind`: "trace" or "export"): the tab's
        earlier file of that kind is deleted first (gradio serves its own copy of what a handler returned)."""
        with self.lock:
            if self.folder is None or not self.folder.is_dir():
                self.folder = Path(tempfile.mkdtemp(prefix="tab-", dir=files_root()))
            sub = self.folder / kind
            shutil.rmtree(sub, ignore_errors=True)
            sub.mkdir()
            return sub


class Tabs:
    """The tabs the page serves, by gradio session: a tab that goes away (its browser tab closed: gradio's unload)
    is freed at once, not when gradio drops its state an hour later. Weak: a tab gradio dropped is not kept here."""

    def __init__(self) -> None:
        self._tabs: weakref.WeakValueDictionary[str, TabState] = weakref.WeakValueDictionary()
        self._lock = threading.Lock()

    def add(self, session: str | None, tab: TabState) -> None:
        if session:
            with self._lock:
                self._tabs[session] = tab

    def close(self, session: str | None) -> bool:
        """Free the session's tab (its records, its session, its files); False when it had none."""
        with self._lock:
            tab = self._tabs.pop(session, None) if session else None
        if tab is None:
            return False
        tab.free()
        return True

    def __len__(self) -> int:
        return len(self._tabs)


def free_tab(tab: object) -> None:
    """gradio's delete_callback for a tab's state (its time to live passed)."""
    if isinstance(tab, TabState):
        tab.free()


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
    """Keep the tab's live session, or start a new one for a new prompt / changed settings / after a replay (which
    ends a Run going on in this tab). Call with host.lock and tab.lock held."""
    if tab.session is not None and not tab.replay and tab.settings == s:
        return
    pair = host.require()
    engine = engine_for(host.engine, s.verify)
    session = DecodeSession(pair, budget=s.budget, max_new_tokens=s.max_new_tokens, verify=s.verify,
                            method=s.method, block_size=s.block_size, engine=engine, sampler=s.sampler)
    session.prefill(s.prompt)
    tab.session, tab.settings, tab.replay, tab.view = session, s, False, -1
    tab.epoch += 1


def _refresh(tab: TabState) -> None:
    """Re-read the live session's records (greedy reference extended to the tokens generated so far)."""
    tab.trace = tab.session.to_trace()
    tab.greedy_s = tab.session.greedy_seconds


FINISHED = "this session has finished (end of text or max new tokens): press Reset or change the prompt"


def step(host: ModelHost, tab: TabState, prompt, budget, block_size, max_new_tokens, verify, method, temperature=0.0,
         top_p=1.0, top_k=0, seed=0) -> TabState:
    """One round. A new prompt or changed settings (a new seed included) start a new session first."""
    s = _settings(prompt, budget, block_size, max_new_tokens, verify, method, temperature, top_p, top_k, seed)
    with host.lock, tab.lock:
        _ensure_session(host, tab, s)
        if tab.session.done:
            raise InputError(FINISHED)
        tab.session.step()
        _refresh(tab)
        tab.view = len(tab.trace.steps) - 1
    return tab


def run_rounds(host: ModelHost, tab: TabState, prompt, budget, block_size, max_new_tokens, verify, method,
               temperature=0.0, top_p=1.0, top_k=0, seed=0):
    """Run to the end, yielding the tab after every round (the page updates live). The model is released between
    rounds (other tabs' work goes in turn); a Reset, a replay, a new prompt or another Run in this tab ends the Run
    at its next round. A finished session is an InputError before anything changes."""
    s = _settings(prompt, budget, block_size, max_new_tokens, verify, method, temperature, top_p, top_k, seed)
    with host.lock, tab.lock:
        _ensure_session(host, tab, s)
        if tab.session.done:
            raise InputError(FINISHED)
        tab.epoch += 1
        mine, session = tab.epoch, tab.session
    while True:
        with host.lock, tab.lock:
            if tab.epoch != mine or session.done:
                return
            session.step()
            _refresh(tab)
            tab.view = len(tab.trace.steps) - 1
        yield tab


def still_running(tab: TabState, epoch: int) -> bool:
    """Is the Run that started at `epoch` still this tab's current work?"""
    return tab.epoch == epoch


def reset(tab: TabState) -> TabState:
    """An empty tab (in place: a Run going on in this tab stops at its next round)."""
    tab.clear()
    return tab


def load_replay(tab: TabState, path: str, name: str | None = None) -> TabState:
    """Show a saved trace (in place; a Run going on in this tab stops). `name`: how messages call the file (the
    page passes the uploaded file's name, never the server's temporary path)."""
    trace = Trace.load(path, name=name)
    with tab.lock:
        tab.clear()
        tab.trace, tab.view, tab.replay = trace, len(trace.steps) - 1, True
    return tab


def move(tab: TabState, delta: int | None = None, to: int | None = None) -> TabState:
    with tab.lock:
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
    status: str
    tree: object
    mask: object
    cache_rows: list[dict]
    cache_chart: object
    diff_html: str
    acceptance: object
    stats: str
    divergence: str
    rounds: int
    view: int


def _token_text(tab: TabState):
    if tab.session is not None and not tab.replay:
        return tab.session.token_text
    texts = tab.trace.token_texts if tab.trace is not None else {}
    return lambda i: texts.get(str(i), f"⟨{i}⟩")


def _divergence(trace: Trace, k: int, text) -> str:
    """The divergence table for rounds 1..k+1: the last DIVERGENCE_ROUNDS of them (what the browser gets stays
    bounded however long the session), saying so when earlier ones are left out."""
    first = max(0, k + 1 - DIVERGENCE_ROUNDS)
    table = divergence_html(divergence_rows(trace.steps[first: k + 1], text))
    if first:
        table = (f"<div><i>Rounds {first + 1} to {k + 1} (the last {DIVERGENCE_ROUNDS}); earlier rounds: go back with "
                 "the round slider, or export the trace.</i></div>") + table
    return table


def render_views(host: ModelHost, tab: TabState, phase: str = "verified") -> Views:
    with tab.lock:  # one consistent snapshot of the tab (a Run may be changing it)
        trace, view, replay, session, greedy_s = tab.trace, tab.view, tab.replay, tab.session, tab.greedy_s
        done = session is not None and session.done
    if trace is not None and not trace.steps and replay:
        status = ("This trace has **no rounds**: its session was prefilled but never stepped, so there is no tree to "
                  f"show. Its output so far: {len(trace.output_ids)} token(s). Load another trace, or type a prompt.")
        return Views(status, None, None, host.layout, None, "", None, "", "", 0, 0)
    if trace is None or not trace.steps:
        status = "Type a prompt and press **Step** (one round) or **Run** (to the end). Keys: s = step, ← / → = back / forward."
        return Views(status, None, None, host.layout, None, "", None, "", "", 0, 0)
    tab = dataclasses.replace(tab, trace=trace, view=view, replay=replay, session=session, greedy_s=greedy_s)
    k = max(0, min(view, len(trace.steps) - 1))
    step = trace.steps[k]
    text = _token_text(tab)
    layout = tree_layout(step, phase=phase, token_text=text)
    lo = min(n.logprob for s in trace.steps for n in s.nodes[1:]) if any(len(s.nodes) > 1 for s in trace.steps) else -1.0
    tree = tree_figure(layout, phase=phase, token_text=text, cmin=lo, cmax=0.0)
    greedy_tok_s = ddtree_tok_s = None
    if tab.session is not None and not tab.replay and tab.greedy_s > 0:
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
    if session is not None and not replay and done:
        status += " Finished."
    return Views(
        status=status, tree=tree, mask=mask_figure(step), cache_rows=cache_table(step), cache_chart=cache_figure(step),
        diff_html=output_vs_greedy_html(trace, text, upto_step=k), acceptance=acceptance_figure(trace.steps[: k + 1]),
        stats=stats_markdown(summary), divergence=_divergence(trace, k, text),
        rounds=len(trace.steps), view=k,
    )
