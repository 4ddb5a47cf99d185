"""THE prompt-set loop, written once: every prompt of a set decoded into a report directory (one trace per prompt
and side, a failure recorded with its error and the set going on), for `analyze` and for the page's Analyze tab.

The caller's differences are hooks, not copies: how an item becomes a PromptSpec (`spec_of`), the model lock taken
around each piece of model work (the page's shared lock; other tabs' work goes in between rounds and between the
reference's tokens), `stop()` (the page's Stop: checked before each prompt, between rounds and between the
reference's tokens; a prompt stopped inside is left out), `resume`,
`--method both`, the meta records, the engines kept from prompt to prompt (the page's). Progress is what the loop
yields: one PromptDone after each prompt. Ctrl-C (KeyboardInterrupt) is not caught: the caller decides.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ContextManager, Iterator

from ..engine.models import ModelPair
from ..engine.prompts import PromptSpec
from ..engine.session import DecodeSession
from ..options import DFLASH, DecodeSettings
from ..errors import TraceError
from ..trace import Trace
from .files import record_failure, trace_path, write_json


@dataclass(frozen=True)
class PromptDone:
    """One prompt of the set handled: decoded (each side's trace or error record written), or skipped (resume:
    every side's trace was there already)."""

    index: int  # the item's index in the set
    done: int  # prompts handled so far, this one included
    total: int  # prompts of this call
    tokens: int  # tokens its decodes generated now (0 when skipped or failed)
    decoded: bool  # whether any side was decoded now (False: skipped by resume)


def decode_set(pair: ModelPair, items: list[dict], out: Path, settings: DecodeSettings,
               spec_of: Callable[[dict], PromptSpec], *, both: bool = False, resume: bool = False,
               stop: Callable[[], bool] = lambda: False, lock: ContextManager = contextlib.nullcontext(),
               keep_engines: bool = False, process: int | None = None, side: str = "") -> Iterator[PromptDone]:
    """Decode `items` (read_prompts' dicts) into out/traces/ with `settings`, yielding a PromptDone after each.

    both: each prompt with `settings` (DDTree) and then with the DFlash chain (NNNN.dflash.json), the same settings
    otherwise. resume: a side whose trace exists and loads is skipped (one that does not load is decoded again).
    stop: checked before each prompt, between rounds and between the reference's tokens; once true the loop ends (a
    prompt stopped inside writes nothing). lock: held around each prefill, round, token of the reference and trace
    (a reusable context manager). keep_engines: a prompt's engines (and its reference's) go on to the next prompt of
    that side (no new static state or graph capture per prompt); fresh ones after a failure, which may have left
    them half-way. process: written in each side's meta record (traces/NNNN.meta.json: wall time,
    process); None writes none. side: the files' side (PRECISION_B: the audit's second configuration, NNNN.b.json)."""
    sides = [(settings, side)] + ([(settings.replace(method=DFLASH), DFLASH)] if both else [])
    engines: dict[str, dict] = {name: {} for _, name in sides}  # side -> DecodeSession's runtime engines
    for done, item in enumerate(items, 1):
        if stop():
            return
        i, tokens, decoded = item["index"], 0, False
        for side_settings, name in sides:
            dest = trace_path(out, i, side=name)
            if resume and _loads(dest):
                continue
            trace_path(out, i, "error", name).unlink(missing_ok=True)
            start = time.perf_counter()
            try:
                trace = _decode_one(pair, item, side_settings, spec_of, stop, lock, engines[name] if keep_engines
                                    else None)
                if trace is None:
                    return  # stopped inside this prompt: it is left out
                tmp = dest.with_name(dest.name + ".tmp")
                trace.save(tmp)
                os.replace(tmp, dest)
                tokens += len(trace.output_ids)
            except Exception as exc:  # a failed prompt (too long, out of memory, a bug) is recorded; the set goes on
                record_failure(out, i, exc, name)
                engines[name].clear()
            if process is not None:
                wall = round(time.perf_counter() - start, 3)
                write_json(trace_path(out, i, "meta", name), {"index": i, "wall_s": wall, "process": process})
            decoded = True
        yield PromptDone(i, done, len(items), tokens, decoded)


def _loads(path: Path) -> bool:
    """Whether resume may keep this trace: it is there and loads (a truncated or corrupt one is decoded again)."""
    if not path.exists():
        return False
    try:
        Trace.load(path)
    except TraceError:
        return False
    return True


def _decode_one(pair: ModelPair, item: dict, settings: DecodeSettings, spec_of, stop, lock,
                engines: dict | None) -> Trace | None:
    """One prompt decoded round by round under `lock`; its trace checked against the reference, or None when
    `stop()` came first. `engines`: the engines to decode on (updated to this session's), or None (new ones)."""
    session = DecodeSession.from_settings(pair, settings, **(engines or {}))
    with lock:
        session.prefill(spec=spec_of(item))
    if engines is not None:
        engines.update(engine=session.target_engine, reference_engine=session.reference_engine)
    while not session.done and not stop():
        with lock:
            session.step()
    if not session.done:
        return None
    # the reference a token a turn (a one-token pass, or a noise chain and one: at most about a round), stop heard
    # between: in one turn it held the page's model for all of a prompt's tokens (seconds) and every tab waited
    end, ref = session.reference_target(), session.check_reference()
    while ref is None or (len(ref.ids) < end and not ref.finished):
        if stop():
            return None
        with lock:
            session.greedy(end, 1)
        ref = session.check_reference()
    with lock:
        return session.to_trace(with_greedy=True)
