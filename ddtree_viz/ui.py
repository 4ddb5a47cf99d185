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
from dataclasses import dataclass, field
from pathlib import Path

from .engine.cache import cache_layout
from .engine.models import ModelPair, load_pair
from .engine.prompts import PromptSpec, check_spec, has_chat_template, takes_thinking
from .engine.sampling import Sampler
from .engine.session import DecodeSession, first_divergence
from .engine.engines import default_engine, engine_for, warm_runner
from .options import AUTO, DTYPES, ENGINE_CHOICES, MAX_BUDGET, MAX_SEED, REFERENCE_NAMES, VERIFY_LABELS, check_int
from .errors import DDTreeVizError, InputError, ModelLoadError
from .render.cache_view import cache_layout_table, cache_spec, cache_table, cache_table_html
from .render.diff_view import output_vs_greedy_html
from .render.divergence_view import divergence_html, divergence_rows
from .render.figure import FigureSpec
from .render.layout import PHASES, tree_layout
from .render.mask_plot import mask_spec
from .render.prompt_view import prompt_html
from .render.stats_view import acceptance_spec, stats_markdown, stats_summary
from .render.text import esc
from .render.tree_plot import tree_spec
from .render.budget_view import budget_spec, depth_spec
from .render.compare_view import compare_html
from .render.grid_view import grid_data, grid_spec
from .render.inspect_view import inspector_html, node_choices, stop_html
from .analysis import config_label
from .options import DFLASH
from .promptset.report import MAX_REPORT_TRACES, TRACE_NAME, read_report, report_files
from .promptset.summary import summarize_report
from .render import report as report_view
from .render.text import shorten
from .trace import MAX_ROUNDS, CompareTrace, Trace, is_sampled, load_any, sampling_flags, sampling_label

SAME = "same"  # compare mode: the engine / dtype of the first configuration
MAX_UPLOAD_BYTES = 16 * 1024 * 1024  # a trace uploaded to the page (the page says so; `replay FILE` takes up to
#                                      trace.MAX_TRACE_BYTES)
DIVERGENCE_ROUNDS = 20  # the page's divergence table shows the last this many rounds up to the one on screen
RUN_REFRESH_S = 0.5  # Run redraws the page at most this often (and after the last round), not after every round
ROUND_VIEW_CACHE = 64  # per tab: the views of this many (round, phase) pairs are kept (a round's never change)
MAX_REPORT_BYTES = 128 * 1024 * 1024  # the Analyze tab: a report's files together (a directory's or the uploads)
MAX_PATH_CHARS = 4096  # the Analyze tab's directory box


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
        self.lock = FairLock()
        self.replay_only = False  # `replay FILE` / app.py --replay without --target: no model, by design
        self._thread: threading.Thread | None = None
        self._pairs: dict[str, ModelPair] = {}  # compare mode: the pair in another dtype, loaded on first use
        self._layout_html: str | None = None
        self.warmup_s = 0.0  # the static runner's compile at load (engines.warm_runner; CUDA only)

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
            if self.engine in (AUTO, "runner") and engine_for(self.engine, "exact", pair.target) == "runner":
                # the runner compiles its fused pieces once per process (CUDA): here, not in the first Step
                self.stage = ("compiling the static runner's fused kernels (once per process: ~35 s on a fresh "
                              "machine, seconds with a warm cache)")
                self.warmup_s = warm_runner(pair.target)
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
            return (f"**Model:** {esc(p.describe())} — {esc(p.parameters_line())}; {len(p.layer_types)} layers: {n_gdn} Gated DeltaNet, "
                    f"{len(p.layer_types) - n_gdn} attention; drafter block size {p.drafter.block_size}; "
                    f"exact rounds on the {esc(self.exact_engine)} engine{self._engine_why()}; naive rounds on "
                    f"transformers; {_threads()} torch thread(s)"
                    + (f"; the runner's kernels compiled at load in {self.warmup_s:.1f} s" if self.warmup_s else "")
                    + f"; {esc(self.chat_note())}")
        if self.replay_only:
            return ("**Replay mode (no model):** step through the saved trace with Back / Forward and the round slider, "
                    "or load another; Step and Run need a model (start the app without --replay, or with --target).")
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

    @property
    def has_chat_template(self) -> bool:
        return self.pair is not None and has_chat_template(self.pair.tokenizer)

    @property
    def takes_thinking(self) -> bool:
        return self.pair is not None and takes_thinking(self.pair.tokenizer)

    def chat_note(self) -> str:
        """What the page says about the tokenizer's chat template (the 'Chat template' switch follows it)."""
        if self.pair is None:
            return ""
        if not self.has_chat_template:
            return ("its tokenizer has no chat template: prompts go in as raw text (the embedded pair has none; a "
                    "target that ships one, e.g. Qwen3.6-27B, switches 'Chat template' on)")
        return "chat template: yes" + (", with a thinking switch" if self.takes_thinking else ", no thinking switch")

    def require(self) -> ModelPair:
        if self.pair is None:
            if self.replay_only:
                raise ModelLoadError("replay mode (no model): Step and Run need a model; replay a trace instead, or "
                                     "start the app without --replay")
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
    prompt: PromptSpec  # the prompt box (the user's message with the chat template on), system prompt, thinking
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

    def __post_init__(self) -> None:
        self.lock = threading.Lock()  # two handlers of one tab may draw at once

    def for_source(self, source: object) -> "ViewCache":
        with self.lock:
            if source is not self.source:
                self.source, self.step_min, self.rounds, self.grids = source, [], {}, {}
        return self


@dataclass
class TabState:
    """One browser tab: its live session (or a replayed trace) and the round it shows; in compare mode a second
    session (B) on the same prompt, stepped in lockstep.

    Every change happens in place under `lock` (the page's handlers all hold the same object, and a Run going on in
    one handler must see a Reset made in another); `epoch` counts the changes that end a Run: a reset, a replay, a
    new session (a new prompt or settings) and a new Run."""

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
    independent: str = ""  # the last check against transformers' forward, in words (Markdown)
    epoch: int = 0
    views: ViewCache = field(default_factory=ViewCache)
    # the last Step (or Run refresh) on the server, ms: "rounds" (engine time of its rounds), "reference" (the
    # reference's model time), "step" (wall time of ui.step / the refresh), "views" (building the views)
    timing: dict = field(default_factory=dict)
    report: "LoadedReport | None" = None  # the Analyze tab's report (kept by a Reset or a replay: clear())

    def __post_init__(self) -> None:  # not fields: a copy (dataclasses.replace) gets its own
        self.lock = threading.RLock()
        self.folder: Path | None = None  # this tab's downloads and exports
        self.set_stop = threading.Event()  # the Analyze tab's Stop: the prompt set run from the page ends

    def __deepcopy__(self, memo) -> "TabState":  # gradio copies a tab's initial value: a fresh lock, no folder
        return dataclasses.replace(self)

    def clear(self) -> None:
        """Back to an empty tab (a Reset); a Run going on stops at its next round. The Analyze tab's report stays
        (opening one of its rounds replays it here)."""
        with self.lock:
            for f in dataclasses.fields(self):
                if f.name not in ("epoch", "report"):
                    setattr(self, f.name, f.default_factory() if f.default is dataclasses.MISSING else f.default)
            self.epoch += 1

    def free(self) -> None:
        """The tab is gone: drop its session and records and delete its files (a prompt set it runs stops)."""
        self.set_stop.set()
        self.clear()
        with self.lock:
            folder, self.folder, self.report = self.folder, None, None
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




def prompt_spec(host: ModelHost, prompt, chat=False, system="", thinking=True) -> PromptSpec:
    """The page's prompt controls as a PromptSpec. With the chat template off the system box is not used; the
    thinking switch is passed only to a template that has one (else the template's default, None)."""
    if not isinstance(prompt, str):
        raise InputError("the prompt must be text")
    if not chat:
        return check_spec(PromptSpec(text=prompt))
    if host.pair is not None and not host.has_chat_template:
        raise InputError("this target's tokenizer has no chat template: switch 'Chat template' off")
    system = system if isinstance(system, str) and system.strip() else None
    return check_spec(PromptSpec(text=prompt, chat=True, system=system,
                                 thinking=bool(thinking) if host.takes_thinking else None))


def _settings(host, prompt, budget, block_size, max_new_tokens, verify, method, temperature=0.0, top_p=1.0, top_k=0,
              seed=0, chat=False, system="", thinking=True) -> Settings:
    if verify not in VERIFY_LABELS:
        raise InputError(f"unknown verification mode {verify!r}")
    sampler = Sampler(temperature, check_int("top-k", top_k, 0, 2**31 - 1), top_p, check_int("seed", seed, 0, MAX_SEED))
    return Settings(prompt_spec(host, prompt, chat, system, thinking), budget, block_size, max_new_tokens,
                    VERIFY_LABELS[verify], method, sampler)


def compare_settings(on, budget=32, block_size=16, method="ddtree", verify="exact", engine=SAME,
                     dtype=SAME) -> CompareSettings | None:
    """The compare controls as settings (None when compare mode is off)."""
    if not on:
        return None
    if verify not in VERIFY_LABELS:
        raise InputError(f"unknown verification mode {verify!r}")
    if engine not in (SAME, *ENGINE_CHOICES):
        raise InputError(f"engine must be one of {SAME}, {', '.join(ENGINE_CHOICES)}, not {engine!r}")
    if dtype not in (SAME, *DTYPES):
        raise InputError(f"dtype must be one of {SAME}, {', '.join(DTYPES)}, not {dtype!r}")
    return CompareSettings(check_int("compare budget", budget, 1, MAX_BUDGET),
                           check_int("compare block size", block_size, 2, 4096), method, VERIFY_LABELS[verify],
                           engine, dtype)


def new_seed() -> int:
    """A fresh seed for the page's 'New seed' button."""
    return secrets.randbelow(MAX_SEED + 1)


def _same_shape(a: Settings | None, b: Settings) -> bool:
    """Settings that size the engines alike (only the prompt or the sampler differs)."""
    return a is not None and (a.budget, a.block_size, a.max_new_tokens, a.verify, a.method) == (
        b.budget, b.block_size, b.max_new_tokens, b.verify, b.method)


def _ensure_session(host: ModelHost, tab: TabState, s: Settings) -> None:
    """Keep the tab's live session, or start a new one for a new prompt / changed settings / after a replay. A new
    prompt with the same settings keeps the tab's engines (the runner's preallocated state and CUDA graphs; the
    reference's too): the first Step after it costs the prefill and one round, no graph capture."""
    if tab.session is not None and not tab.replay and tab.settings == s:
        return
    pair = host.require()
    engine, reference_engine = engine_for(host.engine, s.verify, pair.target), None
    old = tab.session if tab.session is not None and not tab.replay and _same_shape(tab.settings, s) else None
    if old is not None and old.engine == engine:
        engine, reference_engine = old.target_engine, old.reference_engine
    session = DecodeSession(pair, budget=s.budget, max_new_tokens=s.max_new_tokens, verify=s.verify,
                            method=s.method, block_size=s.block_size, engine=engine, sampler=s.sampler,
                            reference_engine=reference_engine)
    try:
        session.prefill(spec=s.prompt)
    except InputError:
        raise  # refused before any model work: the tab keeps its session
    except Exception:
        if old is not None:  # the shared engines may hold half of this prefill: the old session cannot go on
            tab.session, tab.settings = None, None
        raise
    tab.session, tab.settings, tab.replay, tab.view, tab.independent = session, s, False, -1, ""
    tab.other = tab.other_settings = tab.other_trace = None
    tab.inspect = None
    tab.epoch += 1  # a Run of the old session in this tab ends


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
    other.prefill(spec=s.prompt)
    while len(other.history) < len(tab.session.history) and not other.done:
        other.step()
    tab.other, tab.other_settings = other, c
    tab.other_trace = other.to_trace()


def _step_both(tab: TabState) -> None:
    """One round of A and (compare mode) of B, unless B has finished."""
    tab.session.step()
    if tab.other is not None and not tab.other.done:
        tab.other.step()


def _refresh(tab: TabState, check: bool = True, started: float | None = None, rounds_before: int | None = None,
             reference_before: float | None = None) -> None:
    """Re-read the live sessions' records: with `check`, A's reference extended to the tokens generated so far;
    without, as far as it has decoded (the page shows the round first and checks it next: `check`). With `started`
    (perf_counter at the Step's start) and `rounds_before`, note what the Step cost in tab.timing: its rounds'
    engine time (A's), the reference's model time, the wall time."""
    before = tab.session.greedy_seconds if reference_before is None else reference_before
    tab.trace = tab.session.to_trace(extend=check)
    tab.greedy_s = tab.session.greedy_seconds
    if tab.other is not None:
        tab.other_trace = tab.other.to_trace()
    if started is not None:
        new = tab.session.history[rounds_before:]
        tab.timing = {"rounds": sum(sum(r.timings_ms.values()) for r in new), "n_rounds": len(new),
                      "reference": (tab.greedy_s - before) * 1e3, "step": (time.perf_counter() - started) * 1e3}


def step(host: ModelHost, tab: TabState, prompt, budget, block_size, max_new_tokens, verify, method, temperature=0.0,
         top_p=1.0, top_k=0, seed=0, chat=False, system="", thinking=True, *compare, check: bool = True) -> TabState:
    """One round (of both configurations in compare mode: `compare` = compare_settings' arguments). A new prompt or
    changed settings (a new seed, the chat template, system prompt or thinking switch included) start a new session
    first. check=False: the reference is not extended to the new tokens here (the page calls `check` right after,
    so the round shows at the speed of the round)."""
    s = _settings(host, prompt, budget, block_size, max_new_tokens, verify, method, temperature, top_p, top_k, seed,
                  chat, system, thinking)
    c = compare_settings(*compare) if compare else None
    with host.lock, tab.lock:
        _ensure_session(host, tab, s)
        _ensure_other(host, tab, c)
        if tab.session.done:
            raise InputError(FINISHED)
        started, before = time.perf_counter(), len(tab.session.history)
        _step_both(tab)
        _refresh(tab, check, started, before)
        tab.view = len(tab.trace.steps) - 1
        tab.inspect = None
    return tab


FINISHED = "this session has finished (end of text or max new tokens): press Reset or change the prompt"


def run_rounds(host: ModelHost, tab: TabState, prompt, budget, block_size, max_new_tokens, verify, method,
               temperature=0.0, top_p=1.0, top_k=0, seed=0, chat=False, system="", thinking=True, *compare,
               check: bool = True, views=None, min_interval: float = 0.0):
    """Run to the end (both configurations in compare mode, in lockstep), yielding the tab as the page should
    redraw: after every round (min_interval 0), or at most every `min_interval` seconds and after the last round
    (the page's Run: RUN_REFRESH_S); the reference keeps up round by round either way (a redraw never waits for a
    backlog of it), unless check=False: then it is left for `check` after the last round. The model is released
    between rounds (other tabs' work goes in turn); a Reset, a replay, a new prompt or another Run in this tab ends
    the Run at its next round. A finished session is an InputError before anything changes. `views(tab)`: yield
    what it returns instead of the tab, made under the tab's lock once the Run is known to be still current (so a
    Reset is never followed by a round it ended)."""
    s = _settings(host, prompt, budget, block_size, max_new_tokens, verify, method, temperature, top_p, top_k, seed,
                  chat, system, thinking)
    c = compare_settings(*compare) if compare else None
    with host.lock, tab.lock:
        _ensure_session(host, tab, s)
        _ensure_other(host, tab, c)
        if tab.session.done and (tab.other is None or tab.other.done):
            raise InputError(FINISHED)
        tab.epoch += 1
        mine, session, other = tab.epoch, tab.session, tab.other
    started, before, reference = time.perf_counter(), len(session.history), session.greedy_seconds
    while True:
        with host.lock, tab.lock:
            current = tab.epoch == mine
            going = current and not _finished(session, other)
            if going:
                if session.done:  # A finished first: B goes on alone
                    other.step()
                else:
                    _step_both(tab)
                if not (_finished(session, other) or time.perf_counter() - started >= min_interval):
                    if check:
                        session.greedy(len(session.generated))  # the reference, keeping up
                    continue
                _refresh(tab, check, started, before, reference)
                tab.view = max(len(tab.trace.steps), len(tab.other_trace.steps) if tab.other_trace else 0) - 1
                tab.inspect = None
        if not current:  # ended by a Reset, a replay, a new prompt or another Run
            if views is not None:  # its last output is the tab as that left it (gradio shows a generator's last
                with tab.lock:  # output again when it completes)
                    shown = views(tab)
                yield shown
            return
        if not going:  # finished
            return
        if views is None:
            yield tab
            started, before, reference = time.perf_counter(), len(session.history), session.greedy_seconds
            continue
        with tab.lock:
            if tab.epoch != mine:
                continue  # the next pass ends it
            shown = views(tab)
        yield shown
        started, before, reference = time.perf_counter(), len(session.history), session.greedy_seconds


def _finished(session: DecodeSession, other: DecodeSession | None) -> bool:
    return session.done and (other is None or other.done)


def check(host: ModelHost, tab: TabState) -> TabState:
    """Extend the reference to the tokens generated so far and compare (what Step does with check=True)."""
    with host.lock, tab.lock:
        if tab.session is None or tab.replay or not tab.session.started:
            return tab
        _refresh(tab, True)
    return tab


def check_transformers(host: ModelHost, tab: TabState) -> TabState:
    """The independent check: transformers' own forward, one token at a time, up to the tokens generated so far;
    its agreement with the output (and with the session's reference) and its own time go to tab.independent."""
    if tab.session is None or tab.replay:
        raise InputError("nothing to check: step a live session first (a replayed trace has no model)")
    session = tab.session
    with host.lock:
        result, seconds = session.check_transformers()
        reference = session.greedy(len(session.generated)).ids
    n = len(result.ids)
    index = first_divergence(session.generated[:n], result.ids)
    same_ref = tuple(reference[:n]) == tuple(result.ids)
    if index is None:
        verdict = f"**agrees**: the output equals transformers' greedy for {n} tokens"
    else:
        verdict = f"**differs** from the output at token {index} (transformers' margin there {result.margins[index]:.3g})"
    if session.reference != "transformers":
        verdict += (f"; the session's reference ({esc(REFERENCE_NAMES.get(session.reference, session.reference))}) "
                    + ("agrees with it" if same_ref else "**differs from it**"))
    tab.independent = (f"Check against transformers' forward, one token at a time: {verdict}. "
                       f"It took {seconds * 1e3:.0f} ms in all ({n / seconds if seconds else 0:.1f} tokens/s), "
                       "apart from the rounds and the reference.")
    return tab


def reset(tab: TabState) -> TabState:
    """An empty tab (in place: a Run going on in this tab stops at its next round)."""
    tab.clear()
    return tab


def load_replay(tab: TabState, path: str, name: str | None = None) -> TabState:
    """A saved trace, or a compare trace (both configurations), to replay with no model; in place (a Run going on
    in this tab stops). `name`: how messages call the file (the page passes the uploaded file's name, never the
    server's temporary path)."""
    loaded = load_any(path, name=name)
    with tab.lock:
        tab.clear()
        if isinstance(loaded, CompareTrace):
            tab.trace, tab.other_trace = loaded.a, loaded.b
            tab.view = max(len(loaded.a.steps), len(loaded.b.steps)) - 1
        else:
            tab.trace, tab.view = loaded, len(loaded.steps) - 1
        tab.replay = True
    return tab


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
    with tab.lock:
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
# The Analyze tab: a report written by `analyze`, read from a directory or uploaded
# ------------------------------------------------------------------------------------------------------------


@dataclass
class LoadedReport:
    """A report the Analyze tab shows: its figures computed again from its (validated) traces, the report's body as
    report.html has it with round links that open the step view, and the trace files those links may open (by
    their names in the report: "traces/0000.json")."""

    name: str  # how the page names it: the directory as typed, or "N uploaded files"
    summary: dict
    html: str
    files: dict[str, Path]
    note: str = ""  # what else the page should say (summary.json differs from its traces, files ignored, ...)


@dataclass(frozen=True)
class ReportDirs:
    """Which directories the Analyze tab reads when typed in: none (allowed=False: a page shared beyond this machine,
    where anyone could probe the server's files), those under `root` (relative paths from it), or any."""

    allowed: bool = True
    root: str | None = None

    def label(self) -> str:
        if not self.allowed:
            return "Report directory on the server: off (this page is reachable beyond this machine; start it with " \
                   "--report-root DIR to read reports under DIR)"
        where = f" under {self.root}" if self.root is not None else ""
        return f"Report directory on the server{where} (analyze --out DIR)"


def load_report_dir(tab: TabState, text, dirs: ReportDirs = ReportDirs()) -> TabState:
    """The Analyze tab's 'Load directory': a report directory the server can read, as typed (~ expanded; under
    dirs.root when set, relative paths from it). It must be a directory holding summary.json and traces/; anything
    else is an InputError that names it as typed."""
    if not dirs.allowed:
        raise InputError("this page reads no directories typed in (it is reachable beyond this machine): upload the "
                         "report's files, or start the page with --report-root DIR")
    if not isinstance(text, str) or not text.strip():
        raise InputError("type the path of a report directory (the --out DIR of an analyze run)")
    text = text.strip()
    shown = _named(text)
    if len(text) > MAX_PATH_CHARS or "\0" in text:
        raise InputError(f"not a directory path: {shown}")
    try:
        folder = Path(text).expanduser()
        if dirs.root is not None:
            root = Path(dirs.root).expanduser().resolve()
            folder = (root / folder).resolve()  # an absolute path stays itself; symbolic links followed
            if not folder.is_relative_to(root):
                raise InputError(f"{shown} is not under the page's report root ({_named(dirs.root)})")
        if not folder.is_dir():
            raise InputError(f"{shown} is not a directory the server can read")
        if not (folder / "summary.json").is_file():
            raise InputError(f"{shown} has no summary.json: it is not a report directory (analyze --out DIR writes one)")
        if not (folder / "traces").is_dir():
            raise InputError(f"{shown} has no traces/ folder: it is not a report directory")
    except OSError as exc:  # a name too long, a permission denied on the way
        raise InputError(f"cannot read {shown}: {exc.strerror or type(exc).__name__}") from None
    loaded = _read_report(report_files(folder), name=text)
    with tab.lock:
        tab.report = loaded
    return tab


def load_report_upload(tab: TabState, paths) -> TabState:
    """The Analyze tab's upload: summary.json, prompts.json (optional) and the traces/ files of a report, each at
    most MAX_UPLOAD_BYTES, together at most MAX_REPORT_BYTES. Files are known by their own names (0000.json,
    0000.dflash.json, 0000.error.json, ...); other files (report.html, figures) are left out and said so. They are
    copied to the tab's own folder (gradio deletes its copies of uploads after a while; a round opened later reads
    them there). Messages name the files as uploaded, never the server's paths."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    paths = [p for p in (paths or []) if p]
    if not paths:
        raise InputError("upload a report's summary.json and its traces (traces/*.json)")
    if len(paths) > 3 * MAX_REPORT_TRACES + 2:
        raise InputError(f"{len(paths):,} files: a report upload takes at most {3 * MAX_REPORT_TRACES + 2:,}")
    names: dict[str, Path] = {}
    ignored = 0
    total = 0
    for p in paths:
        base = os.path.basename(str(p))
        shown = _named(base, 80)
        if base in ("summary.json", "prompts.json"):
            name = base
        elif TRACE_NAME.fullmatch(base):
            name = f"traces/{base}"
        else:
            ignored += 1
            continue
        if name in names:
            raise InputError(f"two uploaded files are named {shown}: upload one report at a time")
        try:
            size = Path(p).stat().st_size
        except OSError:
            raise InputError(f"cannot read the uploaded file {shown}") from None
        if size > MAX_UPLOAD_BYTES:
            raise InputError(f"{shown} is {size:,} bytes; an uploaded file may be at most "
                             f"{MAX_UPLOAD_BYTES // 2**20} MB")
        total += size
        if total > MAX_REPORT_BYTES:
            raise InputError(f"the uploaded files hold more than {MAX_REPORT_BYTES // 2**20} MB; a report upload may "
                             "hold at most that much")
        names[name] = Path(p)
    if "summary.json" not in names:
        raise InputError("the upload has no summary.json: upload a report's summary.json with its traces/*.json")
    if not any(n.startswith("traces/") for n in names):
        raise InputError("the upload has no traces (traces/0000.json, ...): upload them with summary.json")
    folder = tab.new_folder("report")
    (folder / "traces").mkdir()
    files = {}
    try:
        for name, src in names.items():
            shutil.copyfile(src, folder / name)
            files[name] = folder / name
    except OSError as exc:
        raise InputError(f"cannot keep the uploaded files: {exc.strerror or type(exc).__name__}") from None
    note = f"{ignored} other uploaded file(s) left out (only summary.json, prompts.json and traces/*.json are read)" \
        if ignored else ""
    loaded = _read_report(files, name=f"{len(names)} uploaded files", note=note)
    with tab.lock:
        tab.report = loaded
    return tab


PAGE_SET_MAX_PROMPTS = 32  # a prompt set run from the page: at most this many prompts (the CLI's analyze: any)
PAGE_SET_MAX_TOKENS = 256  # ... and new tokens a prompt


def prompt_sets() -> list[str]:
    """The shipped prompt sets (ddtree_viz/prompts/) the Analyze tab can run, by name."""
    from .promptset.files import PROMPTS_DIR

    return sorted(p.stem for p in PROMPTS_DIR.iterdir() if p.suffix in (".txt", ".jsonl"))


def default_prompt_set() -> str | None:
    """The set the page offers first: the held-out code prompts (never seen in training), else the first."""
    names = prompt_sets()
    return "heldout-code" if "heldout-code" in names else (names[0] if names else None)


def _set_spec(host: ModelHost, item: dict, chat, system, thinking) -> PromptSpec:
    """One prompt of a set as the Step tab's chat controls say: text, or a conversation (needs the template)."""
    if "messages" not in item:
        return prompt_spec(host, item["prompt"], chat, system, thinking)
    if not chat:
        raise InputError("a chat prompt ({'messages': [...]}) needs the chat template: switch 'Chat template' on")
    messages = item["messages"]
    if not all(isinstance(m, dict) for m in messages):
        raise InputError("each message must be an object with 'role' and 'content'")
    spec = prompt_spec(host, "", True, system, thinking)
    return check_spec(dataclasses.replace(spec, messages=tuple((m.get("role"), m.get("content")) for m in messages)))


def run_prompt_set(host: ModelHost, tab: TabState, source, upload, budget, max_new_tokens, limit, chat=False,
                   system="", thinking=True):
    """The Analyze tab's 'Run the set': the first `limit` prompts of a shipped set (`source`, by name) or of an
    uploaded prompt file (`upload`, a path; it wins), each decoded with DDTree (exact, greedy) and checked against
    greedy as `analyze` does, into this tab's folder (a report directory: prompts.json, traces/, summary.json),
    then shown in the tab. A generator: it yields a progress line after each prompt. The model is taken round by
    round (other tabs' Steps go in between); the tab's Stop (`tab.set_stop`) ends it after the round going on, and
    the report covers the prompts done. A prompt that fails is recorded with its error and the set goes on."""
    from .promptset.files import read_prompts, record_failure, run_settings, trace_path, write_json as _write_json

    budget = check_int("budget", budget, 1, MAX_BUDGET)
    max_new = check_int("max new tokens", max_new_tokens, 1, PAGE_SET_MAX_TOKENS)
    limit = check_int("prompts", limit, 1, PAGE_SET_MAX_PROMPTS)
    if upload:
        path = Path(upload)
        if not path.is_file() or path.stat().st_size > MAX_UPLOAD_BYTES:
            raise InputError(f"the prompt file must be a file of at most {MAX_UPLOAD_BYTES // (1024 * 1024)} MB")
        name, items = _named(path.name), read_prompts(path)
    else:
        if source not in prompt_sets():
            raise InputError(f"no prompt set named {_named(source or '')}: choose one of {', '.join(prompt_sets())}")
        name, items = source, read_prompts(source)
    pair = host.require()
    items = items[:limit]
    tab.set_stop.clear()
    out = tab.new_folder("prompt-set")
    (out / "traces").mkdir()
    settings = run_settings(budget, max_new, dtype=host.args[2], device=host.args[3])
    _write_json(out / "prompts.json", {"file": name, "prompts": items, "settings": settings})
    engine, reference = engine_for(host.engine, "exact", pair.target), None
    start, tokens, done = time.perf_counter(), 0, 0
    for item in items:
        if tab.set_stop.is_set():
            break
        i = item["index"]
        try:
            session = DecodeSession(pair, budget=budget, max_new_tokens=max_new, engine=engine,
                                    reference_engine=reference)
            with host.lock:
                session.prefill(spec=_set_spec(host, item, chat, system, thinking))
            engine, reference = session.target_engine, session.reference_engine  # kept for the next prompt
            while not session.done and not tab.set_stop.is_set():
                with host.lock:
                    session.step()
            if not session.done:
                break  # stopped inside this prompt: it is left out
            with host.lock:
                trace = session.to_trace(with_greedy=True)
            trace.save(trace_path(out, i))
            tokens += len(trace.output_ids)
        except Exception as exc:  # recorded, as analyze does; the set goes on (on fresh engines: the shared ones may
            record_failure(out, i, exc)  # hold half of the failed prompt)
            engine, reference = engine_for(host.engine, "exact", pair.target), None
        done += 1
        elapsed = time.perf_counter() - start
        eta = elapsed / done * (len(items) - done)
        yield (f"{done} of {len(items)} prompts, {tokens / elapsed:.1f} tokens/s, "
               f"about {int(eta) // 60}:{int(eta) % 60:02d} left")
    stopped = tab.set_stop.is_set() and done < len(items)
    if done == 0:
        raise InputError("stopped before the first prompt was done: nothing to show")
    note = f"run on this page: {done} of {len(items)} prompts" + (" (stopped)" if stopped else "")
    loaded = _read_report(report_files(out), f"{name} (run here)", note)  # the summary, from the traces once
    _write_json(out / "summary.json", _plain(loaded.summary))  # a report directory like analyze's
    with tab.lock:
        tab.report = loaded
    yield f"done: {note}"


def _read_report(files: dict[str, Path], name: str, note: str = "") -> LoadedReport:
    """Read and validate a report's files (analyze.read_report: every trace through Trace.load), compute its figures
    again from the traces (at summary.json's budgets) and build its body with page links."""
    report = read_report(files, names=True, max_bytes=MAX_REPORT_BYTES)
    written = report.summary or {}
    # the budgets the run asked for (prompts.json), else those summary.json's curve was written at
    summary = summarize_report(report, report.budgets if "prompts.json" in files else _budgets(written))
    notes = [note] if note else []
    if "prompts.json" not in files:
        notes.append("no prompts.json: the prompts' text and sources are not shown")
    elif written and _plain(summary) != written:
        notes.append("summary.json differs from what its traces give (a run still going, or an edited file): the "
                     "figures shown are computed from the traces")
    svgs = report_view.figures(summary, "svg")
    body = report_view.report_body(summary, svgs, report.items, report.metas, link=report_view.page_round_link,
                                   files=False)
    return LoadedReport(name=name, summary=summary, html='<div class="ddv-report">' + body + "</div>",
                        files=dict(report.files), note="; ".join(notes))


def _budgets(summary: dict) -> list[int] | None:
    """The budgets summary.json's budget curve was written at (its keys), or None (every budget) when unreadable."""
    curve = summary.get("budget_curve")
    if not isinstance(curve, dict) or not curve or len(curve) > MAX_BUDGET:
        return None
    try:
        budgets = [int(k) for k in curve]
    except (TypeError, ValueError):
        return None
    return budgets if all(1 <= b <= MAX_BUDGET for b in budgets) else None


def _plain(summary: dict) -> dict:
    """The summary as summary.json holds it (JSON types: tuples as lists)."""
    import json

    return json.loads(json.dumps(summary))


def _named(text: str, limit: int = 120) -> str:
    """A name from the user or a file (a typed path, an uploaded file's name) for a message or the page: one line,
    at most `limit` characters, HTML-escaped."""
    return esc(shorten("".join(" " if ord(c) < 32 or ord(c) == 127 else c for c in str(text)), limit))


def report_status(tab: TabState | None) -> str:
    """The Analyze tab's line over the report (HTML, escaped)."""
    r = tab.report if tab is not None else None
    if r is None:
        return ("<p>Load a report written by <code>analyze</code> (a directory on the server, or its files uploaded): "
                "its figures and tables as report.html shows them; click a trace's round (top misses, prompts) to "
                "open it in the <b>Step</b> tab (replay, no model needed).</p>")
    s = r.summary
    sides = [s] + ([s[DFLASH]] if DFLASH in s else [])
    figures = "; ".join(f"{esc(report_view.side_label(x))}: mean acceptance "
                        f"{'-' if x['mean_acceptance'] is None else format(x['mean_acceptance'], '.2f')} over "
                        f"{x['rounds']} rounds" for x in sides)
    line = (f"<p><b>Report:</b> {_named(r.name)} — {s['prompts']} of {s['prompts_total']} prompts; {figures}. Click a "
            "trace's round (top misses, prompts) to open it in the <b>Step</b> tab.</p>")
    return line + (f"<p><i>Note:</i> {esc(r.note)}</p>" if r.note else "")


def report_html(tab: TabState) -> str:
    return tab.report.html if tab.report is not None else ""


def open_report_round(tab: TabState, file, k) -> TabState:
    """A round of the Analyze tab's report in the step view: the trace replayed (ui.load_replay, no model) at round
    k (0-based). `file`: a trace's name in the report ("traces/0000.json"); nothing else is opened."""
    report = tab.report
    if report is None:
        raise InputError("no report loaded: load a report directory or upload one in the Analyze tab first")
    path = report.files.get(file) if isinstance(file, str) else None
    if path is None:
        raise InputError(f"{_named(str(file), 80)} is not a trace of the loaded report")
    k = check_int("round", k, 0, MAX_ROUNDS - 1)
    load_replay(tab, str(path), name=file)
    return move(tab, to=k)


def open_report_click(tab: TabState, value) -> TabState:
    """A click on a round link of the report ('traces/0000.json|3|nonce', from the page's script)."""
    parts = str(value or "").rsplit("|", 2)
    if len(parts) != 3:
        raise InputError("not a round of the report")
    try:
        k = int(parts[1])
    except ValueError:
        raise InputError("not a round of the report") from None
    return open_report_round(tab, parts[0], k)


# ------------------------------------------------------------------------------------------------------------
# Views
# ------------------------------------------------------------------------------------------------------------


def _checked(fig):
    """A FigureSpec as its checked go.Figure (other figures as they are)."""
    return fig.figure() if isinstance(fig, FigureSpec) else fig


@dataclass
class Views:
    """Everything the page shows. The main figures are FigureSpecs (plain plotly JSON: what the page sends, as
    gr.Plot calls their to_json); the properties tree, mask, cache_chart, acceptance, tree_b, grid, budget and depth
    give them as checked go.Figures (scripts, tests)."""

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
    prompt: str = ""  # the prompt as prefilled (templated, special tokens marked), escaped HTML
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
    cache = tab.views
    with cache.lock:
        grid = cache.grids.get(step.index) if trace is tab.trace else None
    if grid is None and step.draft_top_ids:
        grid = grid_spec(grid_data(step, text))  # a round's grid never changes: built once per tab
        if trace is tab.trace:
            with cache.lock:
                cache.grids[step.index] = grid
                while len(cache.grids) > ROUND_VIEW_CACHE:
                    cache.grids.pop(next(iter(cache.grids)))
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


@dataclass
class CheckViews:
    """What a check changes on the page: the status line, the output-vs-reference view and the statistics."""

    status: str
    diff_html: str
    stats: str


def snapshot(tab: TabState) -> TabState:
    """A consistent copy of the tab to draw from (a Run in another handler may be changing the tab itself)."""
    with tab.lock:
        return dataclasses.replace(tab)


def render_check(host: ModelHost, tab: TabState, phase: str = "verified") -> CheckViews:
    """The views a reference check changes, without redrawing the figures."""
    tab = snapshot(tab)
    if tab.trace is None or not tab.trace.steps:
        return CheckViews(_empty_status(), "", "")
    k = _shown_step(tab.trace, max(0, min(tab.view, rounds_shown(tab) - 1))).index
    text = _token_text(tab)
    return CheckViews(_status(tab, k), output_vs_greedy_html(tab.trace, text, upto_step=k), _stats(tab))


def _empty_status() -> str:
    return "Type a prompt and press **Step** (one round) or **Run** (to the end). Keys: s = step, ← / → = back / forward."


def _stats(tab: TabState) -> str:
    trace = tab.trace
    greedy_tok_s = ddtree_tok_s = None
    if tab.session is not None and not tab.replay:
        # the same clock for both: model time only, prefill included, none of the page's own work
        round_s = sum(sum(s.timings_ms.values()) for s in trace.steps) / 1e3 + trace.prefill_ms / 1e3
        ddtree_tok_s = len(trace.output_ids) / round_s if round_s > 0 else None
        if tab.greedy_s > 0 and not trace.reference_pending:  # pending: the check is still to come
            # a reference on the session's engine starts from a copy of the session's prefilled state (no prefill
            # of its own): the prefill is counted on its side too, as greedy decoding alone would have paid it
            shared = tab.session.reference_shares_prefill
            greedy_tok_s = len(trace.greedy_ids or ()) / (tab.greedy_s + (trace.prefill_ms / 1e3 if shared else 0.0))
    summary = stats_summary(trace, greedy_tok_s=greedy_tok_s, ddtree_tok_s=ddtree_tok_s)
    return (stats_markdown(summary, extra=_page_timing(tab, trace))
            + (f"\n{tab.independent}\n" if tab.independent else ""))


def _page_timing(tab: TabState, trace: Trace) -> list[tuple[str, str]]:
    """Rows for the stats table saying what each time measures."""
    rows = []
    t = tab.timing
    if "step" in t and tab.session is not None and not tab.replay:
        n = t.get("n_rounds", 1)
        what = "round" if n == 1 else f"{n} rounds"
        rows.append(("last Step on the server, wall time (not the browser's drawing)",
                     f"{t['step'] + t.get('views', 0):.0f} ms: {what} {t['rounds']:.0f} ms engine time + reference "
                     f"{t['reference']:.0f} ms + bookkeeping {max(t['step'] - t['rounds'] - t['reference'], 0):.0f} ms "
                     f"+ building the views {t.get('views', 0):.0f} ms"))
    engine = trace.settings.get("engine")
    if engine:
        rows.insert(0, ("engine", esc(engine)))
    return rows


def _status(tab: TabState, k: int) -> str:
    trace = tab.trace
    step = trace.steps[k]
    mode = "replay of a saved trace (no model)" if tab.replay else "live"
    naive = " — **naive verification: the known-wrong flattened-tree behaviour**" if step.verify == "naive" else ""
    status = (f"Round {k + 1} of {len(trace.steps)} ({mode}){naive}: accepted {step.acceptance - 1} drafted tokens "
              f"+ bonus, {len(step.nodes)} tree positions, committed length {step.committed_len}.")
    if is_sampled(trace.settings):
        status += (f" Target's choice: {esc(sampling_label(trace.settings))}, noise "
                   f"{esc(trace.settings.get('noise'))} (reproduce: `run {esc(sampling_flags(trace.settings))}`).")
    if tab.session is not None and not tab.replay and tab.session.done:
        status += " Finished."
    if trace.reference_pending:
        status += f" Checking against the reference ({len(trace.greedy_ids or ())} of {len(trace.output_ids)} tokens so far)…"
    if tab.other_trace is not None and tab.other_trace.steps:
        status += f" Compare mode: A = {esc(config_label(trace.settings))}, B = {esc(config_label(tab.other_trace.settings))}."
    return status


def _divergence(trace: Trace, k: int, text) -> str:
    """The divergence table for rounds 1..k+1: the last DIVERGENCE_ROUNDS of them (what the browser gets stays
    bounded however long the session), saying so when earlier ones are left out."""
    first = max(0, k + 1 - DIVERGENCE_ROUNDS)
    table = divergence_html(divergence_rows(trace.steps[first: k + 1], text))
    if first:
        table = (f'<div style="color:#777;font-size:85%">rounds {first + 1}–{k + 1} of {len(trace.steps)} (the '
                 f"{DIVERGENCE_ROUNDS} up to the round shown; scrub back for earlier ones, or export the trace)</div>"
                 + table)
    return table


def _color_floor(tab: TabState) -> float:
    """The lowest drafter log-prob over the session's rounds (the tree's colour range, the same for every round),
    kept per round as rounds arrive."""
    cache, steps = tab.views, tab.trace.steps
    with cache.lock:
        for s in steps[len(cache.step_min):]:
            cache.step_min.append(min((n.logprob for n in s.nodes[1:]), default=float("inf")))
        lo = min(cache.step_min, default=float("inf"))
    return lo if lo != float("inf") else -1.0


def _round_views(tab: TabState, k: int, phase: str, lo: float, title: str | None = None) -> RoundViews:
    """Round k's tree, mask and cache views, built once per tab (the ROUND_VIEW_CACHE most recent are kept)."""
    cache = tab.views
    key = (k, phase, lo, title)
    with cache.lock:
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


def render_views(host: ModelHost, tab: TabState, phase: str = "verified") -> Views:
    """Everything the page shows for the round on screen. A round's tree, mask, cache views and grid are built once
    per tab (RoundViews); the rest is bounded (the disagreement table: the last DIVERGENCE_ROUNDS rounds)."""
    started = time.perf_counter()
    tab = snapshot(tab)
    if tab.trace is not None and not tab.trace.steps and tab.replay:
        status = ("This trace has **no rounds**: its session was prefilled but never stepped, so there is no tree to "
                  f"show. Its output so far: {len(tab.trace.output_ids)} token(s). Load another trace, or type a prompt.")
        return Views(status, None, None, host.layout, None, "", None, "", "", 0, 0, layout_html=layout_html(host))
    if tab.trace is None or not tab.trace.steps:
        return Views(_empty_status(), None, None, host.layout, None, "", None, "", "", 0, 0, layout_html=layout_html(host))
    trace, k = tab.trace, max(0, min(tab.view, rounds_shown(tab) - 1))
    tab.views.for_source(tab.session if tab.session is not None and not tab.replay else trace)
    step = _shown_step(trace, k)
    text = _token_text(tab)
    compare = tab.other_trace is not None and bool(tab.other_trace.steps)
    rv = _round_views(tab, step.index, phase, _color_floor(tab), _side_title("A", trace, k) if compare else None)
    k = step.index
    extra = {}
    if compare:
        kb = max(0, min(tab.view, len(tab.other_trace.steps) - 1))
        extra = dict(tree_b_spec=_tree_of(tab.other_trace, kb, phase, _other_text(tab),
                                          _side_title("B", tab.other_trace, kb)),
                     compare=compare_html(trace, tab.other_trace, text, view=tab.view))
    views = Views(
        status=_status(tab, k), tree_spec=rv.tree, mask_spec=rv.mask, cache_rows=rv.cache_rows,
        cache_spec=rv.cache_chart, diff_html=output_vs_greedy_html(trace, text, upto_step=k),
        acceptance_spec=acceptance_spec(trace.steps[: k + 1]), stats="", divergence=_divergence(trace, k, text),
        rounds=rounds_shown(tab), view=max(0, min(tab.view, rounds_shown(tab) - 1)), prompt=prompt_html(trace),
        cache_html=rv.cache_html, layout_html=layout_html(host), **_analysis_views(tab, trace, k, text), **extra,
    )
    tab.timing["views"] = (time.perf_counter() - started) * 1e3
    views.stats = _stats(tab)
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
