"""What the page's controls do to a tab: Step, Run, the checks, Reset, a replay, moving between rounds, the node
inspector, the trace download, the session's supplement and the figure export. Step and Run take a
state.TabSettings (read by name from the controls); every session starts here only, as DecodeSession(pair, settings,
parts=...)."""

from __future__ import annotations

import dataclasses
import secrets
import time
from pathlib import Path

from ..analysis import first_divergence
from ..compare import finished, settings_b, start_b, step_both
from ..engine.engines import engine_for
from ..engine.check import TRANSFORMERS_REFERENCE
from ..engine.session import DecodeSession, SessionParts
from ..errors import InputError
from ..options import MAX_SEED, REFERENCE_NAMES
from ..render import export as exporter
from ..render import supplement
from ..render.text import esc
from ..trace import CompareTrace, Trace, load_any
from ..words import numbered, plural
from .host import ModelHost
from .progress import FIRST_CHUNK, CheckProgress, check_progress, round_s, turn_tokens
from .state import SAME, CompareSettings, TabSettings, TabState, rounds_shown, shown_step

REPLAY_END = ("this replay is at its last round ({n}): press Reset to start a live session from the Prompt box, or "
              "scrub back to look again")
RUN_REFRESH_S = 0.5  # Run redraws the page at most this often (and after the last round), not after every round
CHECK_REFRESH_S = 0.5  # a check redraws the page (and hears a Stop) at most this often
FINISHED = "this session has finished (end of text or max new tokens): press Reset or change the prompt"


def new_seed() -> int:
    """A fresh seed for the page's 'New seed' button."""
    return secrets.randbelow(MAX_SEED + 1)


def _ensure_session(host: ModelHost, tab: TabState, s: TabSettings) -> None:
    """Keep the tab's live session, or start a new one for a new prompt / changed settings / after a replay. A new
    prompt with the same settings keeps the tab's engines (the runner's preallocated state and CUDA graphs; the
    reference's too): the first Step after it costs the prefill and one round, no graph capture."""
    live = tab.session is not None and not tab.replay
    if live and s.same_session(tab.settings):
        return
    pair = host.require()
    decode = s.decode.replace(engine=engine_for(host.engine, s.decode.verify, pair.target))
    old = tab.session if live and s.same_shape(tab.settings) else None
    parts = SessionParts()
    if old is not None and old.engine == decode.engine:
        parts = SessionParts(engine=old.target_engine, reference_engine=old.reference_engine)
    session = DecodeSession(pair, decode, parts=parts)
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
    """Compare mode: keep B's session, or start it (prefilled) for new compare settings; switched on mid-session it
    catches up with A's rounds next (_catch_up, a round a turn), then the two step in lockstep. Off: drop it."""
    if c is None:
        tab.other = tab.other_settings = tab.other_trace = None
        return
    if tab.other is not None and tab.other_settings == c:
        return
    s = tab.settings
    pair = host.pair_for(None if c.dtype == SAME else c.dtype, None if c.drafter == SAME else c.drafter)
    engine = engine_for(host.engine if c.engine == SAME else c.engine, c.verify, pair.target)
    b = settings_b(s.decode, {"budget": c.budget, "block_size": min(c.block_size, pair.drafter.block_size),
                              "method": c.method, "verify": c.verify, "engine": engine,
                              "tree_scoring": c.tree_scoring})
    other = start_b(pair, b, s.prompt, tab.session.sampler)
    tab.other, tab.other_settings = other, c
    tab.other_trace = other.to_trace(extend=False)


def _start(host: ModelHost, tab: TabState, s: TabSettings) -> None:
    """Both sessions as the settings ask (held: host.lock and tab.lock)."""
    _ensure_session(host, tab, s)
    _ensure_other(host, tab, s.compare)


def _load(host: ModelHost, s: TabSettings) -> None:
    """The models B asks for in another dtype or with another drafter, loaded (once) before the model lock: a load
    takes seconds to minutes, and other tabs' work goes on meanwhile."""
    c = s.compare
    if c is not None:
        host.pair_for(None if c.dtype == SAME else c.dtype, None if c.drafter == SAME else c.drafter)


def _behind(tab: TabState) -> bool:
    """Compare mode switched on mid-session: B has fewer rounds than A and has not finished (held: tab.lock)."""
    a, b = tab.session, tab.other
    return a is not None and b is not None and not b.done and len(b.history) < len(a.history)


def _catch_up(host: ModelHost, tab: TabState) -> None:
    """B stepped to A's rounds (its end of text or max new tokens first), a round a turn of the model (a session of
    100 rounds caught up in one turn held every other tab up for all of them); a Reset, a new session or new compare
    settings in the tab meanwhile end it."""
    with tab.lock:
        a, b = tab.session, tab.other
    while True:
        with host.lock, tab.lock:
            if tab.session is not a or tab.other is not b or not _behind(tab):
                return
            b.step()


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
        tab.other_trace = tab.other.to_trace(extend=check)  # (B's reference as A's)
    if started is not None:
        new = tab.session.history[rounds_before:]
        tab.timing = {"rounds": sum(sum(r.timings_ms.values()) for r in new), "n_rounds": len(new),
                      "reference": (tab.greedy_s - before) * 1e3, "step": (time.perf_counter() - started) * 1e3}


def step(host: ModelHost, tab: TabState, settings: TabSettings, *, check: bool = True) -> TabState:
    """One round (of both configurations in compare mode). A new prompt or changed settings (a new seed, the chat
    template, system prompt or thinking switch included) start a new session first. check=False: the reference is
    not extended to the new tokens here (the page calls `check` right after, so the round shows at the speed of the
    round). While a replay is shown, Step goes on through it (the next round) and never replaces it: Reset first."""
    if tab.replay and tab.trace is not None:
        return _replay_next(tab)
    _load(host, settings)
    with host.lock, tab.lock:
        _start(host, tab, settings)
        session, behind = tab.session, _behind(tab)
        if not behind:
            return _step_turn(tab, check)
    _catch_up(host, tab)
    with host.lock, tab.lock:
        if tab.session is not session:  # a Reset or another session meanwhile: the tab as that left it
            return tab
        return _step_turn(tab, check)


def _step_turn(tab: TabState, check: bool) -> TabState:
    """Step's round, of both configurations (held: both locks; the sessions started, B caught up)."""
    tab.stop_ticket, tab.checking = tab.stops, None  # its check (chained after it) stops at a Stop from now on
    if _done_at_prefill(tab, check):
        return tab
    if finished(tab.session, tab.other):  # compare mode: B goes on alone once A has finished, as Run does
        raise InputError(FINISHED)
    started, before = time.perf_counter(), len(tab.session.history)
    step_both(tab.session, tab.other)
    _refresh(tab, check, started, before)
    tab.view = rounds_shown(tab) - 1
    tab.inspect = None
    return tab


def _done_at_prefill(tab: TabState, check: bool) -> bool:
    """A session that finished at its prefill (max new tokens 1, or end of text at once) has no round: shown as
    such (the status says why), not refused as finished (held: the tab's lock)."""
    if not tab.session.done or tab.session.history or (tab.other is not None and not tab.other.done):
        return False
    _refresh(tab, check)
    return True


def _replay_next(tab: TabState) -> TabState:
    """Step in a replay: the next recorded round (no model); at the last one, say how to go live."""
    with tab.lock:
        last = rounds_shown(tab) - 1
        if tab.view >= last:
            raise InputError(REPLAY_END.format(n=last + 1))
        tab.view, tab.inspect = tab.view + 1, None
    return tab


def replay_prompt(trace: Trace | None) -> str:
    """What the Prompt box holds for a replayed trace: the user's message as given (chat template), else its raw
    prompt text, so Reset then Step decodes the same prompt live."""
    if trace is None:
        return ""
    users = [m.get("content", "") for m in (trace.messages or ()) if m.get("role") == "user"]
    return str(users[-1]) if users else trace.prompt


def run_rounds(host: ModelHost, tab: TabState, settings: TabSettings, *, check: bool = True, views=None,
               min_interval: float = 0.0):
    """Run to the end (both configurations in compare mode, in lockstep), yielding the tab as the page should
    redraw: after every round (min_interval 0), or at most every `min_interval` seconds and after the last round
    (the page's Run: RUN_REFRESH_S); the reference keeps up round by round either way (a redraw never waits for a
    backlog of it), unless check=False: then it is left for `check` after the last round. The model is released
    between rounds (other tabs' work goes in turn); a Reset, a replay, a new prompt or another Run in this tab ends
    the Run at its next round, a Stop (`stop`) too, showing the rounds so far. A finished session is an InputError
    before anything changes. `views(tab)`: yield what it returns instead of the tab, made under the tab's lock once
    the Run is known to be still current (so a Reset is never followed by a round it ended)."""
    _load(host, settings)
    with host.lock, tab.lock:
        _start(host, tab, settings)
        session = tab.session
    _catch_up(host, tab)
    with host.lock, tab.lock:
        gone = tab.session is not session  # a Reset or another session meanwhile: the tab as that left it
        at_prefill = not gone and _done_at_prefill(tab, check)
        if not (gone or at_prefill) and finished(tab.session, tab.other):
            raise InputError(FINISHED)
        if not gone:
            tab.epoch += 1
            tab.stop_ticket, tab.checking = tab.stops, None
        mine, ticket, session, other = tab.epoch, tab.stop_ticket, tab.session, tab.other
    if gone or at_prefill:
        with tab.lock:
            shown = views(tab) if views is not None else tab
        yield shown
        return
    started, before, reference = time.perf_counter(), len(session.history), session.greedy_seconds
    while True:
        with host.lock, tab.lock:
            current = tab.epoch == mine
            stopped = current and tab.stops != ticket
            going = current and not stopped and not finished(session, other)
            if going:
                if session.done:  # A finished first: B goes on alone
                    other.step()
                else:
                    step_both(tab.session, tab.other)
                if not (finished(session, other) or time.perf_counter() - started >= min_interval):
                    if check:
                        session.greedy(len(session.generated))  # the reference, keeping up
                    continue
            if going or stopped:
                _refresh(tab, check, started, before, reference)
                tab.view = max(len(tab.trace.steps), len(tab.other_trace.steps) if tab.other_trace else 0) - 1
                tab.inspect = None
        if not current:  # ended by a Reset, a replay, a new prompt or another Run
            if views is not None:  # its last output is the tab as that left it (gradio shows a generator's last
                with tab.lock:  # output again when it completes)
                    shown = views(tab)
                yield shown
            return
        if not (going or stopped):  # finished
            return
        shown = _run_views(tab, mine, views)
        if shown is not None:
            yield shown
        if stopped:
            return
        started, before, reference = time.perf_counter(), len(session.history), session.greedy_seconds


def _run_views(tab: TabState, mine: int, views):
    """What a Run yields after its rounds: the tab, or `views(tab)` made while the Run is still the tab's (None:
    it no longer is; its next pass ends it)."""
    if views is None:
        return tab
    with tab.lock:
        return views(tab) if tab.epoch == mine else None


def check(host: ModelHost, tab: TabState) -> TabState:
    """Extend the reference to the tokens generated so far and compare (what Step does with check=True): the
    page's check_rounds run to its end."""
    for tab in check_rounds(host, tab):
        pass
    return tab


def check_transformers(host: ModelHost, tab: TabState) -> TabState:
    """The independent check: transformers' own forward, one token at a time, up to the tokens generated so far;
    its agreement with the output (and with the session's reference) and its own time go to tab.independent (the
    page's check_rounds(independent=True) run to its end)."""
    for tab in check_rounds(host, tab, independent=True):
        pass
    return tab


def stop(tab: TabState) -> TabState:
    """Stop: the tab's Run ends at its next round and its check at its next look (CHECK_REFRESH_S at most; the
    check chained after that Run or Step too), each showing what it reached (TabState.stops)."""
    with tab.lock:
        tab.stops += 1
    return tab


def check_rounds(host: ModelHost, tab: TabState, *, independent: bool = False,
                 min_interval: float = CHECK_REFRESH_S):
    """A check as the page runs it, yielding the tab to redraw: the session's reference extended to the output and
    compared (`check`; after a Step or Run), then in compare mode B's likewise, or with `independent` transformers'
    own forward (`check_transformers`). It takes the model about one round's time at a time (_check_turn: another
    tab's Step waits at most about one round of this tab's), and where it will take longer than `min_interval` it
    says so first (tab.checking: the tokens to check, an estimate of the time from this machine's measured pace),
    then its progress at most every `min_interval`, then the result. A Stop (`stop`) ends it at its next turn:
    tab.checking says what it reached and that the rest is unknown, and no verdict on the tokens not checked is
    shown. A Reset, a replay or a new session ends it with nothing more to say."""
    # never a yield while a lock is held: gradio resumes a generator on any of its worker threads, and the tab's
    # RLock released from another thread raises and stays held by the first for good (every later handler of the
    # tab then waited for ever: a Run's check after a Reset, under load, in CI)
    with host.lock, tab.lock:
        session = tab.session
        if independent and (session is None or tab.replay):
            raise InputError("nothing to check: step a live session first (a replayed trace has no model)")
        nothing = session is None or tab.replay or not session.started
        if not nothing:
            mine = tab.epoch
            if independent:  # a click of its own (the others take the Step's or Run's)
                tab.stop_ticket = tab.stops
            ticket, total = tab.stop_ticket, len(session.generated) if independent else session.reference_target()
            tab.checking = first = check_progress(host, session, independent, total)
    if nothing:
        yield tab
        return
    shown = time.perf_counter()
    if (first.left_s or 0.0) > min_interval or (first.left_s is None and first.total - first.done > FIRST_CHUNK):
        yield tab  # a wait worth a word: said before it starts
    try:
        while True:
            with host.lock, tab.lock:
                if tab.epoch != mine or tab.session is not session:
                    return
                stopped = tab.stops != ticket
                if stopped or not _check_turn(host, tab, independent, total):
                    _checked(host, tab, independent, total, stopped)
                    break
                due = time.perf_counter() - shown >= min_interval
                if due and not independent:
                    _refresh(tab, False)  # the output's tokens checked so far
            if due:
                yield tab
                shown = time.perf_counter()
    except BaseException:  # an error (the page says it), or the page gone: no check under way to show
        with tab.lock:
            tab.checking = None
        raise
    yield tab


def _check_turn(host: ModelHost, tab: TabState, independent: bool, total: int) -> bool:
    """One turn of a check on the shared model (held: both locks): about one round's time of the tab's sessions
    (progress.turn_tokens at the reference's pace) of the first reference still short, A's towards `total` (or
    transformers' forward with `independent`), then in compare mode B's towards B's output; tab.checking says how
    far it has come. False: nothing left to decode. (A check that took 0.5 s of tokens a turn held the model 2.2 s
    at once on a loaded 2-core machine, and another tab's Step waited for it: docs/PERFORMANCE.md section 39.)"""
    session, other = tab.session, tab.other
    turn = sum(round_s(s.history) or 0.0 for s in (session, other) if s is not None) or None  # (step_both's)
    if not _reached(session.check_reference(independent), total):
        pace = check_progress(host, session, independent, total).pace
        (session.check_transformers if independent else session.greedy)(total, turn_tokens(pace, turn))
        tab.checking = check_progress(host, session, independent, total)
        return True
    if independent or other is None or not other.started or _reached(other.check_reference(),
                                                                      other.reference_target()):
        return False
    b_total = other.reference_target()
    other.greedy(b_total, turn_tokens(check_progress(host, other, False, b_total).pace, turn))
    tab.checking = dataclasses.replace(check_progress(host, other, False, b_total),
                                       what=f"configuration B's reference ({other.reference})")
    return True


def _reached(ref, total: int) -> bool:
    """Whether a reference (a session.GreedyReference, None before it is made) has decoded `total` tokens, or its
    end of text before them."""
    return ref is not None and (len(ref.ids) >= total or ref.finished)


def _checked(host: ModelHost, tab: TabState, independent: bool, total: int, stopped: bool) -> None:
    """A check's end (held: both locks): its result, or where it stopped (tab.checking then says what is unknown)."""
    session = tab.session
    # stopped: where its last turn left it (B's reference, in compare mode, once A's is done)
    reached = (tab.checking if stopped and tab.checking is not None
               else check_progress(host, session, independent, total))
    tab.checking = dataclasses.replace(reached, stopped=True) if stopped else None
    if independent:
        tab.independent = _independent_words(session, total, reached if stopped else None)
    else:
        _refresh(tab, not stopped)  # stopped: compared only as far as the reference reached (reference_pending)


def _independent_words(session: DecodeSession, total: int, stopped: CheckProgress | None) -> str:
    """The check against transformers in words (Markdown): the verdict as far as it went, where it stopped."""
    ref = session.check_reference(independent=True)
    result, seconds = ref.result(total), ref.seconds
    n = len(result.ids)
    index = first_divergence(session.generated[:n], result.ids)
    if index is not None:
        verdict = f"**differs** from the output at token {index} (transformers' margin there {result.margins[index]:.3g})"
    elif stopped is not None and stopped.done < stopped.total:
        equal = {0: "none checked yet", 1: "that one equals the output"}.get(n, f"those {n:,} equal the output")
        rest = numbered("token", n + 1, stopped.total) + (" was" if n + 1 == stopped.total else " were")
        verdict = (f"**stopped** at {n:,} / {plural(stopped.total, 'token')}: {equal}; {rest} not checked, so whether "
                   "the output equals transformers' greedy is unknown (press Check vs transformers again to go on)")
    else:
        verdict = f"**agrees**: the output equals transformers' greedy for {plural(n, 'token')}"
    if session.reference != TRANSFORMERS_REFERENCE:
        verdict += _against_reference(session, result.ids)
    return (f"Check against transformers' forward, one token at a time: {verdict}. "
            f"It took {seconds * 1e3:.0f} ms in all ({n / seconds if seconds else 0:.1f} tokens/s), "
            "apart from the rounds and the reference.")


def _against_reference(session: DecodeSession, ids: tuple[int, ...]) -> str:
    """Transformers' tokens against the session's reference, as far as that has decoded (nothing decoded here:
    its own check may have been stopped)."""
    name = esc(REFERENCE_NAMES.get(session.reference, session.reference))
    own = session.check_reference()
    k = min(len(own.ids) if own is not None else 0, len(ids))
    if k == 0:
        return f"; the session's reference ({name}) has not decoded these tokens yet: not compared with it"
    same = "agrees with it" if tuple(own.ids[:k]) == tuple(ids[:k]) else "**differs from it**"
    return (f"; the session's reference ({name}) {same}"
            + (f" over the {plural(k, 'token')} it has decoded" if k < len(ids) else ""))


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


def write_trace(tab: TabState) -> Path:
    """'Download trace': saved_trace written to the tab's own folder (its earlier download deleted)."""
    saved = saved_trace(tab)  # InputError when there is nothing yet
    kind = "compare" if tab.other_trace is not None else "trace"
    path = tab.new_folder("trace") / f"ddtree-{kind}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    try:
        saved.save(path)
    except (OSError, UnicodeError) as exc:
        raise InputError(f"cannot write the trace: {exc}") from None
    return path


def write_supplement(tab: TabState) -> Path:
    """'Download session (.html)': the tab's session (configuration A's in compare mode) as one self-contained HTML
    file (render/supplement.py) in the tab's own folder, its earlier one deleted. A session past the file's bound is
    refused with its size, and how to thin it from a downloaded trace."""
    trace = tab.trace
    if trace is None or not trace.steps:
        raise InputError("nothing to save yet: step, run or replay first")
    try:
        text = supplement.supplement_html(trace)
    except InputError as exc:
        raise InputError(f"{exc}. From the page: download the trace, then `python -m ddtree_viz export --trace "
                         "TRACE.json --session --rounds A-B --out SESSION.html`") from None
    path = tab.new_folder("supplement") / supplement.supplement_name(trace)
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot write the session file: {exc}") from None
    return path


def tree_filter(min_lp, depth) -> tuple[int | None, float | None]:
    """The tree filters as typed in the page ('Max depth', 'Hide below log-prob'; blank: off) as (max depth, lowest
    log-prob): one reading for the tree on screen and the export."""
    return (exporter.optional_number(depth, "max depth", integer=True),
            exporter.optional_number(min_lp, "hide below log-prob"))


def set_tree_filter(tab: TabState, min_lp, depth) -> TabState:
    """The tree on screen hides what the filters say (never the accepted path); the views redraw it."""
    tab.tree_filter = tree_filter(min_lp, depth)
    return tab


def export_round(tab: TabState, phase: str, fmt, figure, show, colors, min_lp, depth, title,
                 width="column") -> tuple[Path, str]:
    """'Export figure': the round on screen as a file in the tab's own folder (render/export.py; blank filters:
    none), at a paper's column or full width; the file and what the export panel says of its size ('' for HTML and
    JSON)."""
    if tab.trace is None or not tab.trace.steps:
        raise InputError("nothing to export yet: step, run or replay a trace first")
    max_depth, min_logprob = tree_filter(min_lp, depth)
    path, size = exporter.export_round(
        tab.trace, tab.view, fmt, directory=tab.new_folder("export"), phase=phase, figure=figure, show=show,
        colors=colors, min_logprob=min_logprob, max_depth=max_depth, show_title=bool(title), width=width)
    return path, size_note(size)


def size_note(size) -> str:
    """The export panel's line for an export's print size (render.paper.PrintSize; None: none)."""
    return "" if size is None else f"Exported: {size.describe()}"


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
    step_ = shown_step(tab.trace, tab.view)
    if step_ is not None and 0 <= pos < len(step_.nodes):
        tab.inspect = pos
    return tab
