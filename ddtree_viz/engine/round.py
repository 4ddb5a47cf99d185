"""One DDTree round, written out plainly (gpt-fast's generate loop): draft, tree, verify, walk, commit, record.

    draft    the proposer's log-probs for the block [root, MASK, ...]     scheduler.draft (queued by the last round,
                                                                         or drafted now)
    tree     the shape's tree over them (or DFlash's chain)              scheduler.verify: where the plan builds it,
    verify   one target pass over [root, nodes...]                       then the engine's pass
    walk     along the target's choice (its argmax, or its position-     scheduler.walk: the engine's walk and
             keyed sample); the bonus token is its choice at the end     commit, the next round's work queued ahead
    commit   the prefix + accepted path stay in the cache; the           where the mode says
             drafter's next context is their features
    record   recorder.record: the StepRecord

The round branches on nothing: the method is the shape's (shapes.py), the engine's abilities its declared
capabilities (engines.py), the overlaps the scheduler's mode (scheduler.py), what is kept the recorder's
(recorder.py).
"""

from __future__ import annotations

from typing import Protocol

import torch

from ..trace import StepRecord
from .engines import TargetEngine
from .proposers import Proposer
from .recorder import Played, Recorder, TokenNames
from .sampling import Sampler
from .scheduler import Scheduler, Turn
from .shapes import Shape, Shaping
from .timing import Timing
from .tree import DeviceTree, DraftTree


class Decoding(Protocol):
    """What a round reads and moves (DecodeSession): its parts, its settings, and the output so far."""

    target_engine: TargetEngine
    proposer: Proposer
    shape: Shape
    sampler: Sampler
    scheduler: Scheduler
    recorder: Recorder
    timing: Timing
    names: TokenNames
    budget: int
    block_size: int
    max_new_tokens: int
    method: str
    verify: str
    generated: list[int]
    committed_len: int
    features: torch.Tensor | None  # the drafter's next context: the accepted positions' features
    history: list[StepRecord]
    done: bool
    nonfinite_round: int | None

    def extend(self, tokens: list[int]) -> list[int]: ...


def _untimed(name: str) -> None:
    """A phase's end where the round is not timed."""


def choices(sampler: Sampler, logits: torch.Tensor, tree: DraftTree | DeviceTree,
            committed_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's argmax at every tree position and its choice there: the argmax, or its position-keyed sample
    (the node at depth d chooses the token at position committed_len + d + 1)."""
    argmax = chosen = logits.argmax(-1)
    if not sampler.greedy:
        positions = torch.as_tensor(tree.depths, device=logits.device) + (committed_len + 1)
        chosen = sampler.choose(logits, positions)
    return argmax, chosen


@torch.no_grad()
def play_round(s: Decoding) -> StepRecord:
    """One round on `s` (module docstring), its record appended to `s.history` and returned."""
    engine, scheduler, recorder = s.target_engine, s.scheduler, s.recorder
    clock = s.timing.round_clock()
    lap = clock.lap if clock is not None else _untimed
    root, start = s.generated[-1], s.committed_len

    logprobs, drafted = scheduler.draft(root, start, s.features, s.block_size)  # drafted: the queued draft's clock
    if drafted is None:
        lap("draft")
    built = scheduler.verify(root, logprobs, lap, Shaping(s.budget, start, s.sampler, s.proposer))
    logits = built.tree_pass.logits
    argmax, chosen = choices(s.sampler, logits, built.tree, start)
    if not built.ahead:  # (a verify queued by the last round was timed by its clock, with its draft)
        lap("verify")
    before = recorder.before_commit(engine, len(built.tree))

    def reads(depth, bonus):  # queued after the commit, before the next draft; waited for last
        return recorder.reads(logits, argmax, chosen, logprobs, depth, bonus, s.budget)

    walk = scheduler.walk(built.tree_pass, chosen, lap, reads,
                          Turn(start, s.block_size, len(s.generated), s.max_new_tokens))
    accepted, bonus, s.features = walk.accepted, walk.bonus, walk.features
    tree = built.host_tree()
    new_tokens = tuple(s.extend([tree.token_ids[a] for a in accepted[1:]] + [bonus]))
    if not s.done:
        scheduler.after_read(walk, s.generated[-1], start + len(accepted), s.features, s.block_size)

    timings = {**(drafted.times() if drafted is not None else {}), **clock.times()} if clock is not None else {}
    host = recorder.wait(walk.reads)
    if not host.pop("finite") and s.nonfinite_round is None:
        s.nonfinite_round = len(s.history)
    played = Played(len(s.history), start, root, tree, built.scores, accepted, bonus, new_tokens, timings, host,
                    before, engine.state_error(tree, accepted), s.shape.own(len(tree), s.budget), s.method, s.verify)
    step = recorder.record(played, engine)
    s.committed_len += len(accepted)
    s.history.append(step)
    s.names.note(step)
    return step
