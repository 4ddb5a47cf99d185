"""One browser tab's state, and the settings its controls give, read by name.

`TabState` is a tab's live session (or replayed trace) and the round it shows; `read_settings` turns the Step tab's
controls, a mapping from a control's name (SETTINGS) to its value, into `TabSettings`: the prompt and the session's
options.DecodeSettings (and compare mode's B), checked before any model work."""

from __future__ import annotations

import atexit
import dataclasses
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..engine.prompts import PromptSpec, check_spec
from ..engine.sampling import Sampler
from ..engine.session import DecodeSession
from ..errors import InputError
from ..options import (DRAFTER_FAMILIES, DTYPES, ENGINE_CHOICES, MARGINAL, MAX_BUDGET, MAX_SEED, TREE_SCORINGS,
                       VERIFY_LABELS, DecodeSettings, check_int)
from ..trace import Trace
from ..words import plural
from .host import ModelHost
from .progress import CheckProgress

SAME = "same"  # compare mode: the engine / dtype of the first configuration
MAX_UPLOAD_BYTES = 16 * 1024 * 1024  # a trace uploaded to the page (the page says so; `replay FILE` takes up to
#                                      trace.MAX_TRACE_BYTES)

# The Step tab's controls by name, each with its value when not given (None: it must be given). Step and Run read
# these (read_settings); the page's widgets carry the same names, in this order (the served /step and /run inputs).
SETTINGS: dict[str, object] = {
    "prompt": None, "budget": None, "block_size": None, "max_new_tokens": None, "verify": None, "method": None,
    "temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": 0, "chat": False, "system": "", "thinking": True,
    # compare mode: configuration B, on the same prompt
    "compare_on": False, "compare_budget": 32, "compare_block_size": 16, "compare_method": "ddtree",
    "compare_verify": "exact", "compare_engine": SAME, "compare_dtype": SAME, "compare_drafter": SAME,
    # how DDTree scores a node (marginal, or a DFlash2 drafter's selector), for A and for B
    "tree_scoring": MARGINAL, "compare_tree_scoring": MARGINAL,
}


@dataclass(frozen=True)
class CompareSettings:
    """Compare mode: the second configuration (same prompt, max new tokens and sampler as the first)."""

    budget: int
    block_size: int
    method: str
    verify: str
    engine: str  # an engine name, or SAME
    dtype: str  # a dtype, or SAME
    tree_scoring: str = MARGINAL
    drafter: str = SAME  # beside the embedded target: its drafter of another family (DRAFTER_FAMILIES), or SAME


@dataclass(frozen=True)
class TabSettings:
    """What Step and Run are asked for: the prompt (the user's message with the chat template on, the system
    prompt, thinking), the session's settings (engine: the host's, chosen per verify mode when the session starts),
    and compare mode's B (None: off)."""

    prompt: PromptSpec
    decode: DecodeSettings
    compare: CompareSettings | None = None

    def same_session(self, other: TabSettings | None) -> bool:
        """The same session: nothing but compare mode differs."""
        return other is not None and (self.prompt, self.decode) == (other.prompt, other.decode)

    def same_shape(self, other: TabSettings | None) -> bool:
        """Settings that size the engines alike (only the prompt or the sampler differs)."""
        return other is not None and _shape(self.decode) == _shape(other.decode)


def _shape(d: DecodeSettings) -> tuple:
    return d.budget, d.block_size, d.max_new_tokens, d.verify, d.method, d.tree_scoring


def read_settings(host: ModelHost, values: Mapping[str, object]) -> TabSettings:
    """The Step tab's controls (`values`: name -> value, names from SETTINGS) as TabSettings, checked here, where they
    enter (an InputError before any model work): the verify mode, the sampler, the prompt, and the rest as
    DecodeSettings checks itself (budget, max new tokens, block size, method, tree scoring); the block size
    against the drafter's by the session."""
    v = _named_values(values)
    if v["verify"] not in VERIFY_LABELS:
        raise InputError(f"unknown verification mode {v['verify']!r}")
    sampler = Sampler(v["temperature"], check_int("top-k", _typed(v["top_k"]), 0, 2**31 - 1), v["top_p"],
                      check_int("seed", _typed(v["seed"]), 0, MAX_SEED))
    prompt = prompt_spec(host, v["prompt"], v["chat"], v["system"], v["thinking"])
    decode = DecodeSettings(budget=v["budget"], max_new_tokens=v["max_new_tokens"], block_size=v["block_size"],
                            method=v["method"], verify=VERIFY_LABELS[v["verify"]], temperature=sampler.temperature,
                            top_k=sampler.top_k, top_p=sampler.top_p, seed=sampler.seed,
                            tree_scoring=v["tree_scoring"])
    return TabSettings(prompt, decode, _compare_settings(v))


def _typed(value):
    """A whole number typed in a text box (top-k, seed: text boxes, so that what was typed reaches check_int, which
    names the field; a gradio Number refuses it first in words of its own): its int, blank as 0; anything else as
    typed, for check_int to refuse by name."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if not text:
        return 0
    try:
        return int(text)
    except ValueError:
        return value


def _named_values(values: Mapping[str, object]) -> dict:
    """`values` over SETTINGS' defaults; a name SETTINGS does not know, or one it needs and lacks, is a bug."""
    unknown = sorted(set(values) - set(SETTINGS))
    missing = [name for name, default in SETTINGS.items() if default is None and name not in values]
    if unknown or missing:
        raise TypeError(f"the Step tab's settings: unknown {unknown}, missing {missing}")
    return {**SETTINGS, **values}


def _compare_settings(v: dict) -> CompareSettings | None:
    """The compare controls as settings (None when compare mode is off)."""
    if not v["compare_on"]:
        return None
    verify, engine, dtype = v["compare_verify"], v["compare_engine"], v["compare_dtype"]
    if verify not in VERIFY_LABELS:
        raise InputError(f"unknown verification mode {verify!r}")
    if engine not in (SAME, *ENGINE_CHOICES):
        raise InputError(f"engine must be one of {SAME}, {', '.join(ENGINE_CHOICES)}, not {engine!r}")
    if dtype not in (SAME, *DTYPES):
        raise InputError(f"dtype must be one of {SAME}, {', '.join(DTYPES)}, not {dtype!r}")
    drafter = v["compare_drafter"]
    if drafter not in (SAME, *DRAFTER_FAMILIES):
        raise InputError(f"B's drafter must be one of {SAME}, {', '.join(DRAFTER_FAMILIES)}, not {drafter!r}")
    return CompareSettings(check_int("compare budget", v["compare_budget"], 1, MAX_BUDGET),
                           check_int("compare block size", v["compare_block_size"], 2, 4096), v["compare_method"],
                           VERIFY_LABELS[verify], engine, dtype, _scoring(v["compare_tree_scoring"]), drafter)


def _scoring(value) -> str:
    """A tree scoring from the page's dropdown, or an InputError naming the choices."""
    if value not in TREE_SCORINGS:
        raise InputError(f"tree scoring must be one of {', '.join(TREE_SCORINGS)}, not {value!r}")
    return value


def prompt_spec(host: ModelHost, prompt, chat=False, system="", thinking=True) -> PromptSpec:
    """The page's prompt controls as a PromptSpec. With the chat template off the system box is not used; the
    thinking switch is passed only to a template that has one (else the template's default, None)."""
    if not isinstance(prompt, str):
        raise InputError("the prompt must be text")
    check_prompt_chars(host, len(prompt) + (len(system) if chat and isinstance(system, str) else 0), "the prompt")
    if not chat:
        return check_spec(PromptSpec(text=prompt))
    if host.pair is not None and not host.has_chat_template:
        raise InputError("this target's tokenizer has no chat template: switch 'Chat template' off")
    system = system if isinstance(system, str) and system.strip() else None
    return check_spec(PromptSpec(text=prompt, chat=True, system=system,
                                 thinking=bool(thinking) if host.takes_thinking else None))


def check_prompt_chars(host: ModelHost, chars: int, what: str) -> None:
    """Refuse a prompt of `chars` characters that cannot fit the target (host.max_prompt_chars), before any model
    work: tokenizing megabytes under the shared model lock would hold every other tab up. `what` names the user's
    own input ("the prompt", "prompt 3 of bad.txt")."""
    limit = host.max_prompt_chars()
    if limit is not None and chars > limit:
        raise InputError(f"{what} is {plural(chars, 'character')}; the page takes at most {limit:,} (the target has "
                         f"{plural(host.pair.max_positions, 'position')})")


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
class ViewCache:
    """Per tab: views already built, for the records of one session or trace (`source`)."""

    source: object = None
    step_min: list[float] = field(default_factory=list)  # each round's lowest drafter log-prob (the colour range)
    rounds: dict = field(default_factory=dict)  # (round, phase, colour range, title) -> views.RoundViews, oldest first
    grids: dict = field(default_factory=dict)  # round -> the drafter's grid figure

    def __post_init__(self) -> None:
        self.lock = threading.Lock()  # two handlers of one tab may draw at once

    def for_source(self, source: object) -> "ViewCache":
        with self.lock:
            if source is not self.source:
                self.source, self.step_min, self.rounds, self.grids = source, [], {}, {}
        return self


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
    folder: Path | None = None  # the tab's own copy its files are in (uploads, a set run here): deleted when replaced
    misses: tuple[dict, ...] = ()  # misses.jsonl's rows for it (promptset/misses.py), its 'Download misses' file
    set_name: str = ""  # the set's name in those rows ("" without prompts.json)


@dataclass
class TabState:
    """One browser tab: its live session (or a replayed trace) and the round it shows; in compare mode a second
    session (B) on the same prompt, stepped in lockstep.

    Every change happens in place under `lock` (the page's handlers all hold the same object, and a Run going on in
    one handler must see a Reset made in another); `epoch` counts the changes that end a Run: a reset, a replay, a
    new session (a new prompt or settings) and a new Run."""

    session: DecodeSession | None = None
    settings: TabSettings | None = None
    trace: Trace | None = None  # the records on screen (a live session's snapshot, or a replayed file)
    view: int = -1  # round index shown
    replay: bool = False
    greedy_s: float = 0.0
    other: DecodeSession | None = None  # compare mode: configuration B's live session
    other_settings: CompareSettings | None = None
    other_trace: Trace | None = None  # B's records (live snapshot, or the replayed compare trace's)
    inspect: int | None = None  # tree position the node inspector shows (None: the first rejected, or the root)
    independent: str = ""  # the last check against transformers' forward, in words (Markdown)
    checking: CheckProgress | None = None  # a check under way, about to start or stopped (None: none to show)
    # Stop: `stops` counts its clicks; a Step, a Run or a check notes the count when it starts (`stop_ticket`: a
    # check chained after a Step or Run takes theirs) and ends at its next look once the count has moved (both
    # kept by a Reset)
    stops: int = 0
    stop_ticket: int = 0
    notice: str = ""  # the last action's error, as the status line shows it (cleared by the next view of the tab)
    epoch: int = 0
    views: ViewCache = field(default_factory=ViewCache)
    # the last Step (or Run refresh) on the server, ms: "rounds" (engine time of its rounds), "reference" (the
    # reference's model time), "step" (wall time of actions.step / the refresh), "views" (building the views)
    timing: dict = field(default_factory=dict)
    report: LoadedReport | None = None  # the Analyze tab's report (kept by a Reset or a replay: clear())
    # the tree's filters as set in the page's boxes, (max depth, lowest log-prob shown), None: off (actions.tree_filter;
    # kept by a Reset or a replay, as the boxes keep them)
    tree_filter: tuple = (None, None)
    # the page's settings as a changed setting last sent them, and when (time.monotonic()): a handler's inputs are
    # the page's when the browser sent them, so one that ends after a change reads the change from here
    # (newest_settings)
    edited: tuple = (0.0, None)
    # when the last Step or Run answered (time.monotonic()): a check chained after it got its inputs from the page
    # after that answer, however late the server starts it
    answered: float = 0.0
    # when the last check made its last answer (time.monotonic()): the page's settings read after that answer came
    # are as new as any change sent before it (newest_settings)
    settled: float = 0.0

    def __post_init__(self) -> None:  # not fields: a copy (dataclasses.replace) gets its own
        self.lock = threading.RLock()
        self.folder: Path | None = None  # this tab's downloads and exports
        self.set_stop = threading.Event()  # the Analyze tab's Stop: the prompt set run from the page ends
        self.set_running = threading.Lock()  # held by the tab's prompt set: one at a time, whatever the buttons say
        self.closed = False  # the tab went (free): a prompt set still running ends quietly, its files gone

    def __deepcopy__(self, memo) -> "TabState":  # gradio copies a tab's initial value: a fresh lock, no folder
        return dataclasses.replace(self)

    def edit(self, values: dict) -> None:
        """Record the page's settings sent by a changed setting (its `.input` event)."""
        self.edited = (time.monotonic(), dict(values))

    def newest_settings(self, values: dict, since: float) -> dict:
        """The page's settings now: `values` (a handler's inputs, read by the page at `since` or later), unless a
        setting changed after that."""
        at, edited = self.edited
        return edited if edited is not None and at > since else values

    def snapshot(self) -> "TabState":
        """A consistent copy of the tab to draw from (a Run in another handler may be changing the tab itself)."""
        with self.lock:
            return dataclasses.replace(self)

    def clear(self) -> None:
        """Back to an empty tab (a Reset); a Run going on stops at its next round. The Analyze tab's report stays
        (opening one of its rounds replays it here)."""
        with self.lock:
            for f in dataclasses.fields(self):
                if f.name not in ("epoch", "report", "tree_filter", "stops", "stop_ticket"):
                    setattr(self, f.name, f.default_factory() if f.default is dataclasses.MISSING else f.default)
            self.epoch += 1

    def free(self) -> None:
        """The tab is gone: drop its session and records and delete its files (a prompt set it runs stops)."""
        self.set_stop.set()
        self.clear()
        with self.lock:
            self.closed = True
            folder, self.folder, self.report = self.folder, None, None
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)

    def new_folder(self, kind: str) -> Path:
        """An empty folder for the file this tab offers for download (`kind`: "trace", "supplement", "export" or
        "misses"): the tab's earlier file of that kind is deleted first (gradio serves its own copy of what a handler
        returned)."""
        with self.lock:
            sub = self._own_folder() / kind
            shutil.rmtree(sub, ignore_errors=True)
            sub.mkdir()
            return sub

    def report_folder(self) -> Path:
        """A new, empty folder for a report's files (an upload's copies, a prompt set run here), never one a report
        on screen reads: the report shown keeps its files until show_report swaps the new one in (its links never
        open another report's files)."""
        with self.lock:
            return Path(tempfile.mkdtemp(prefix="report-", dir=self._own_folder()))

    def show_report(self, report: LoadedReport) -> None:
        """Show `report` in the Analyze tab; the files of the report it replaces go when they were the tab's own."""
        with self.lock:
            old, self.report = self.report, report
        drop_report_folder(old, keep=report.folder)

    def _own_folder(self) -> Path:
        if self.folder is None or not self.folder.is_dir():
            self.folder = Path(tempfile.mkdtemp(prefix="tab-", dir=files_root()))
        return self.folder

    def token_text(self):
        """Token id -> text for A's records: the live session's, or the replayed trace's."""
        return _texts(self.session, self.trace, self.replay)

    def other_token_text(self):
        """The same for B (compare mode)."""
        return _texts(self.other, self.other_trace, self.replay)


def drop_report_folder(report: LoadedReport | None, keep: Path | None = None) -> None:
    """Delete the tab's own copy of a report no longer shown (not a directory the user typed: folder None)."""
    if report is not None and report.folder is not None and report.folder != keep:
        shutil.rmtree(report.folder, ignore_errors=True)


def _texts(session: DecodeSession | None, trace: Trace | None, replay: bool):
    if session is not None and not replay:
        return session.token_text
    texts = trace.token_texts if trace is not None else {}
    return lambda i: texts.get(str(i), f"⟨{i}⟩")


def rounds_shown(tab: TabState) -> int:
    """Rounds the round slider spans: the longer of the two sessions in compare mode."""
    n = len(tab.trace.steps) if tab.trace is not None else 0
    return max(n, len(tab.other_trace.steps) if tab.other_trace is not None else 0)


def shown_step(trace: Trace | None, k: int):
    """Round k of a trace (its last one when it has fewer: compare mode's shorter side), or None."""
    if trace is None or not trace.steps:
        return None
    return trace.steps[max(0, min(k, len(trace.steps) - 1))]


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
