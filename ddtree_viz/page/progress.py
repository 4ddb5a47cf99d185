"""A check's progress as the page shows it: how far the reference has decoded, how long the rest should take (an
estimate from time measured on this machine, never a number written here), and, once stopped, what is left
unknown. Arithmetic and words over a reference's own counters (session.GreedyReference: ids, prompt_ids,
prefill_seconds, token_seconds, shared_prefill) and a session's check_reference; no model work, no torch."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ..registry import REFERENCE_ENGINE
from ..words import numbered, plural

FIRST_CHUNK = 2  # tokens a check decodes before it tells the page anything, where nothing is measured yet
TURN_ROUNDS = 8  # a round's time, for a check's turn of the model: the mean of the session's last rounds


@dataclass(frozen=True)
class Pace:
    """A reference's measured speed: seconds a token after its first (its noise chains included), over `tokens`
    tokens; its own prefill's seconds per prompt token (None: not measured, as for a reference that started from
    the session's prefilled state); `where` it was measured, in words."""

    token_s: float
    tokens: int
    prefill_s: float | None = None  # seconds per prompt token
    where: str = "by this check"


def pace_of(ref, where: str) -> Pace | None:
    """`ref`'s pace so far (a session.GreedyReference), or None before it has decoded two tokens."""
    steps = len(ref.ids) - 1
    if steps < 1 or ref.token_seconds <= 0:
        return None
    prefill = (ref.prefill_seconds / len(ref.prompt_ids)
               if ref.ids and not ref.shared_prefill and ref.prompt_ids else None)
    return Pace(ref.token_seconds / steps, steps, prefill, where)


def estimate_s(pace: Pace | None, tokens_left: int, prompt_tokens: int = 0, prefilled: bool = True) -> float | None:
    """Seconds the rest of a check should take: `tokens_left` steps at the pace's seconds a token; a reference that
    has not prefilled yet pays its prefill first (its `prompt_tokens` at the pace's prefill seconds a prompt token,
    which give the first token) and one step fewer. None where the pace (or its prefill, when one is due) is
    unknown; 0.0 with nothing left."""
    if tokens_left <= 0:
        return 0.0
    if pace is None:
        return None
    if prefilled:
        return tokens_left * pace.token_s
    if pace.prefill_s is None:
        return None
    return prompt_tokens * pace.prefill_s + (tokens_left - 1) * pace.token_s


def chunk_tokens(pace: Pace | None, seconds: float) -> int:
    """Tokens to decode before looking up again (the page told, a Stop heard): about `seconds` worth at `pace`, at
    least one; FIRST_CHUNK while nothing is measured."""
    if pace is None or pace.token_s <= 0:
        return FIRST_CHUNK
    return max(1, int(seconds / pace.token_s))


def round_s(history) -> float | None:
    """A round's engine time in seconds: the mean of the last TURN_ROUNDS rounds' (StepRecord.timings_ms) of a
    session's `history`; None with no rounds."""
    last = history[-TURN_ROUNDS:]
    return sum(sum(r.timings_ms.values()) for r in last) / len(last) / 1e3 if last else None


def turn_tokens(pace: Pace | None, round_seconds: float | None) -> int:
    """Tokens a check decodes in one turn of the shared model: about one round's time at `pace` (so another tab's
    Step, waiting its turn, waits about one round of this tab's), at least one; one while either is unknown."""
    if pace is None or round_seconds is None:
        return 1
    return chunk_tokens(pace, round_seconds)


@dataclass(frozen=True)
class CheckProgress:
    """A check under way (or about to start, or stopped): against `what` (words), `done` of `total` tokens, the
    estimate of the rest (None: nothing measured yet) and the pace it comes from."""

    what: str
    done: int
    total: int
    left_s: float | None
    pace: Pace | None
    running: bool = False  # False: next (the page has not started it yet)
    stopped: bool = False
    independent: bool = False  # transformers' own forward (Check vs transformers), not the session's reference


def progress_of(ref, what: str, total: int, pace: Pace | None, prompt_tokens: int, *, running: bool = False,
                independent: bool = False) -> CheckProgress:
    """Where a check stands: `ref` (a session.GreedyReference, or None before it is made) towards `total` tokens,
    the estimate of the rest at `pace`."""
    done = min(len(ref.ids), total) if ref is not None else 0
    prefilled = ref is not None and (bool(ref.ids) or ref.shared_prefill)
    return CheckProgress(what, done, total, estimate_s(pace, total - done, prompt_tokens, prefilled), pace, running,
                         independent=independent)


def check_progress(host, session, independent: bool, total: int, running: bool = True) -> CheckProgress:
    """Where a check of `session` (a DecodeSession) towards `total` tokens stands: its reference's own pace so far,
    else this machine's last for that kind of reference (host.paces; a pace measured here is noted there for the
    next check). An output that ended at end of text counts its own tokens while the reference agrees that far (it
    then ends there too)."""
    kind = REFERENCE_ENGINE if independent else session.reference
    ref = session.check_reference(independent)
    own = pace_of(ref, "by this session's check") if ref is not None else None
    if own is not None:
        host.paces[kind] = dataclasses.replace(own, where="on this machine by an earlier check")
    if ref is None or len(ref.ids) <= len(session.generated):
        total = min(total, len(session.generated))
    what = "transformers" if independent else f"the reference ({session.reference})"
    return progress_of(ref, what, total, own or host.paces.get(kind), len(session.prompt_ids), running=running,
                       independent=independent)


def shown_check(host, tab) -> CheckProgress | None:
    """The check a tab (state.TabState) shows: the one under way or stopped (tab.checking), else the one to come
    after a Step or Run (the tokens so far, an estimate of the rest); None with nothing to check."""
    if tab.checking is not None:
        return tab.checking
    session = tab.session
    if session is None or tab.replay or not session.started:
        return None
    return check_progress(host, session, False, session.reference_target(), running=False)


def duration(seconds: float) -> str:
    """A rough duration in words: 'under a second', 'about 8 s', 'about 3 min'."""
    if seconds < 1:
        return "under a second"
    if seconds < 90:
        return f"about {math.ceil(seconds)} s"
    return f"about {math.ceil(seconds / 60)} min"


def pace_words(pace: Pace) -> str:
    """'17 ms a token, measured by this check over 36 tokens'."""
    per = pace.token_s * 1e3
    return f"{per:.3g} ms a token, measured {pace.where} over {plural(pace.tokens, 'token')}"


def _estimate(p: CheckProgress, rest: str) -> str:
    if p.left_s is None:
        return "no estimate yet: nothing measured on this machine so far (its first tokens measure it)"
    return f"{duration(p.left_s)} {rest} (an estimate: {pace_words(p.pace)})"


def status_line(p: CheckProgress) -> str:
    """The status line's words for a check (Markdown)."""
    if p.stopped:
        return stopped_line(p)
    if p.running:
        return (f"**Checking against {p.what}: {p.done:,} / {plural(p.total, 'token')}**, {_estimate(p, 'left')}. "
                "**Stop** stops it.")
    return (f"Checking against {p.what} next ({p.done:,} of {plural(p.total, 'token')} so far): "
            f"{_estimate(p, 'for the rest')}…")


def stopped_line(p: CheckProgress) -> str:
    """What a stopped check leaves: the tokens it reached, and that the rest is unknown (no verdict on them)."""
    if p.done >= p.total:
        unchecked = "every token was checked before the stop"
    else:
        one = p.done + 1 == p.total
        unchecked = (f"{numbered('token', p.done + 1, p.total)} {'was' if one else 'were'} not checked, so whether "
                     f"{'it equals' if one else 'they equal'} it is unknown (no verdict on {'it' if one else 'them'})")
    again = "press **Check vs transformers** again to go on" if p.independent else "the next Step's check goes on"
    return f"**Stopped:** the check against {p.what} reached {p.done:,} / {plural(p.total, 'token')}; {unchecked}; {again}."
