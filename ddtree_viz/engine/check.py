"""The reference check: a session's output against the target's own decoding, and the verdict where they part.

`ReferenceCheck` is the session's check (its interface): the reference made on demand, on the session's kind of
engine (EngineGreedy on a second engine that starts from a copy of the session's state after the prefill) or on
transformers' own forward (GreedyReference: the independent check), extended as far as asked (`greedy`,
`transformers`), and `divergence`: where the output first differs, the reference's margin there, its own noise and
the tree pass's drift, and the verdict (docs/EXACTNESS.md, "Noise or bug"). It reads the session at each call
(`Decoded`); the reference's time is kept apart from the rounds'.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Protocol

from ..analysis import first_divergence
from ..errors import InputError
from ..options import REFERENCE_ENGINE
from ..trace import VERDICT_MISMATCH, VERDICT_NOISE, StepRecord
from .engines import TargetEngine, make_engine
from .reference import EngineGreedy, GreedyReference, GreedyResult
from .sampling import Sampler

TRANSFORMERS_REFERENCE = REFERENCE_ENGINE  # transformers' own forward: the independent check


@dataclass(frozen=True)
class DivergenceCheck:
    """The output against the reference, and the verdict on where they part (docs/EXACTNESS.md)."""

    index: int | None  # first generated token that differs from the reference (None: identical so far)
    margin: float | None  # the reference's decision margin there
    noise: float | None  # the reference's own numerical noise (GreedyResult.noise)
    noise_positions: int
    drift: float | None  # max |tree pass margin - reference margin| over agreeing accepted positions before it
    drift_positions: int
    verdict: str | None  # VERDICT_NOISE, VERDICT_MISMATCH, or None (no divergence, or nothing to judge it by)
    reference: str  # what the reference ran on: "runner" or "transformers"
    pending: bool  # the reference has not reached the end of the output yet (compared as far as it has)
    result: GreedyResult
    invalid: str | None = None  # why no verdict stands (logits held NaN or inf: invalid_reason); None: it does


def invalid_reason(round_index: int | None, reference_token: int | None, reference: str) -> str | None:
    """Why a comparison with the reference proves nothing, or None: a round's verify logits or the reference's held
    NaN or inf (argmax then picks whatever the NaN sits on, both sides alike: '!!!!' equal to '!!!!')."""
    where = [f"round {round_index}'s verify logits"] if round_index is not None else []
    where += [f"the reference's logits at generated token {reference_token}"] if reference_token is not None else []
    if not where:
        return None
    return (f"{' and '.join(where)} hold NaN or inf ({reference} reference), so the tokens chosen there mean nothing "
            "and agreeing with the reference proves nothing: the target's weights (or a quantization scale) or its "
            "arithmetic are not finite; load a checkpoint whose weights are finite, or a wider dtype")


def verdict(margin: float | None, noise: float | None) -> str | None:
    """A divergence whose reference margin is at most the measured noise is a numerical tie; one beyond it is a
    mismatch. A margin of 0 is an exact tie (the reference's top two are equal, as bf16 logits often are over a
    large vocabulary): either token is its argmax, so it is noise whatever was measured. None when either is
    unknown otherwise."""
    if margin == 0.0:
        return VERDICT_NOISE
    if margin is None or noise is None:
        return None
    return VERDICT_NOISE if margin <= noise else VERDICT_MISMATCH


class Decoded(Protocol):
    """What the check reads of a session (DecodeSession), at each call: its output so far and how it was made."""

    target: object
    engine: str  # the session's engine (an engine reference runs on a second one of its kind)
    reference: str  # where the reference decodes: that engine's name, or TRANSFORMERS_REFERENCE
    prompt_ids: list[int]
    eos_ids: set[int]
    generated: list[int]
    history: list[StepRecord]
    started: bool
    done: bool
    record: bool
    max_new_tokens: int
    block_size: int
    sampler: Sampler
    nonfinite_round: int | None


class ReferenceCheck:
    """A session's reference and the check of its output against it (module docstring). `engine`: the engine an
    engine reference decodes on (made at the first, kept from prompt to prompt; a page reuses its engines)."""

    def __init__(self, engine: TargetEngine | None = None):
        self.engine = engine
        self.reset()

    def reset(self) -> None:
        """A new prompt: no reference yet."""
        self.own: GreedyReference | None = None  # the session's reference
        self.independent: GreedyReference | None = None  # transformers' own, beside an engine reference
        # _drift's rounds already compared in full: (the reference, their count, their deltas, the limit then)
        self._drift_done: tuple = (None, 0, (), 0)

    def start(self, out: Decoded, engine: TargetEngine, logits) -> None:
        """At the prefill, where the rounds are recorded and the reference decodes on an engine: it starts from a
        copy of the session's state (`engine`'s) and the prefill's last logits, no prefill of its own."""
        if not out.record or out.reference == TRANSFORMERS_REFERENCE:
            return
        start = time.perf_counter()
        self.own = self._engine_reference(out)
        self.own.engine.load_state(engine)
        self.own.start_from(logits)
        self.own.engine.sync()
        self.own.seconds += time.perf_counter() - start

    def _engine_reference(self, out: Decoded) -> EngineGreedy:
        if self.engine is None:
            self.engine = make_engine(out.engine, out.target, None, tree_size=out.block_size,
                                      block_size=out.block_size, max_new_tokens=out.max_new_tokens)
        return EngineGreedy(self.engine, out.prompt_ids, out.eos_ids, sampler=out.sampler, chain=out.block_size)

    def reference(self, out: Decoded) -> GreedyReference:
        """The session's reference, made at its first use (after the prefill)."""
        if not out.started:
            raise InputError("prefill a prompt first")
        if self.own is None:
            self.own = (GreedyReference(out.target, out.prompt_ids, out.eos_ids, sampler=out.sampler,
                                        chain=out.block_size)
                        if out.reference == TRANSFORMERS_REFERENCE else self._engine_reference(out))
        return self.own

    def greedy(self, out: Decoded, upto: int | None = None, most: int | None = None) -> GreedyResult:
        """The reference's first `upto` tokens (default: all max_new_tokens); `most`: at most this many more
        decoded by this call (GreedyReference.extend_to)."""
        n = out.max_new_tokens if upto is None else min(upto, out.max_new_tokens)
        return self.reference(out).extend_to(n, out.generated, most)

    def current(self, out: Decoded, independent: bool = False) -> GreedyReference | None:
        """The reference a check extends, as far as it has gone (None: not made yet): the session's, or with
        `independent` transformers' own forward."""
        if independent and out.reference != TRANSFORMERS_REFERENCE:
            return self.independent
        return self.own

    @staticmethod
    def target(out: Decoded) -> int:
        """How far the check of the output extends the reference: every token a finished session could have had
        (max new tokens: an output ended at end of text is checked past its end), else the tokens so far."""
        return out.max_new_tokens if out.done else len(out.generated)

    @property
    def shares_prefill(self) -> bool:
        """True when the reference started from a copy of the session's prefilled state (its `seconds` hold no
        prefill of its own)."""
        return isinstance(self.own, EngineGreedy) and self.own.shared_prefill

    @property
    def seconds(self) -> float:
        """Time the reference has spent so far (for tokens/s side by side with the rounds)."""
        return self.own.seconds if self.own is not None else 0.0

    def transformers(self, out: Decoded, upto: int | None = None,
                     most: int | None = None) -> tuple[GreedyResult, float]:
        """The independent check: transformers' own forward, one token at a time, over the first `upto` tokens
        (default: those generated so far; `most`: at most this many more in this call). Returns its tokens and the
        seconds it has spent in all."""
        if not out.started:
            raise InputError("prefill a prompt first")
        if out.reference == TRANSFORMERS_REFERENCE:
            ref = self.reference(out)
        else:
            if self.independent is None:
                self.independent = GreedyReference(out.target, out.prompt_ids, out.eos_ids, sampler=out.sampler,
                                                   chain=out.block_size)
            ref = self.independent
        n = len(out.generated) if upto is None else upto
        return ref.extend_to(min(n, out.max_new_tokens), out.generated, most), ref.seconds

    def divergence(self, out: Decoded, extend: bool = True) -> DivergenceCheck:
        """The first divergence from the reference, its margin, and the verdict on it (noise or mismatch) with
        its evidence. extend=False: compare with the reference only as far as it has decoded (pending = True
        when that is short of the output)."""
        ref = self.reference(out)
        result = self.greedy(out, self.target(out)) if extend else ref.result()
        pending = (not extend and len(result.ids) < len(out.generated) and not ref.finished
                   and len(result.ids) < out.max_new_tokens)
        output = out.generated[:len(result.ids)] if pending else out.generated
        idx = first_divergence(output, result.ids)
        gap = result.margins[idx] if idx is not None and idx < len(result.margins) else None
        gap = gap if gap is not None and math.isfinite(gap) else None
        drift, drift_n = self._drift(out, result, len(output) if idx is None else idx)
        invalid = invalid_reason(out.nonfinite_round, result.nonfinite, out.reference)
        return DivergenceCheck(idx, gap, result.noise, result.noise_positions, drift, drift_n,
                               verdict(gap, result.noise) if idx is not None and invalid is None else None,
                               out.reference, pending, result, invalid)

    def _drift(self, out: Decoded, ref: GreedyResult, upto: int) -> tuple[float | None, int]:
        """max |tree pass margin - reference margin| over the output tokens before `upto` that the rounds chose
        at an accepted position (greedy only: a sampled round records logit margins, the reference score gaps).
        The leading rounds compared in full are kept (_drift_done) and not compared again: the reference's tokens
        and margins never change once decoded, and a page asks twice a Step over every round so far."""
        if not out.sampler.greedy or not out.record:
            return None, 0
        limit = min(upto, len(ref.ids), len(ref.margins))
        owner, done, kept, then = self._drift_done
        if owner is not self.own or then > limit:  # (a smaller limit: never from the page, whose only grows)
            done, kept = 0, ()
        deltas = list(kept)
        complete, counted = done, len(deltas)  # the leading rounds compared in full, and their deltas
        offset = len(out.prompt_ids)
        for k in range(done, len(out.history)):
            r = out.history[k]
            first = r.committed_len - offset + 1  # the output index the root's choice decides
            if r.target_margin:
                for j, a in enumerate(r.accepted):
                    i = first + j
                    if i >= limit:
                        break
                    if r.choices[a] == ref.ids[i]:
                        delta = abs(r.target_margin[a] - ref.margins[i])
                        if math.isfinite(delta):
                            deltas.append(delta)
            if complete == k and first + len(r.accepted) <= limit:
                complete, counted = k + 1, len(deltas)
        if complete > done:
            self._drift_done = (self.own, complete, tuple(deltas[:counted]), limit)
        return (max(deltas) if deltas else None), len(deltas)
