"""The overlap scheduler: where a round's tree is built, and how much of the next round is queued before the host
reads this one. The round (round.py) asks it for the draft, the tree and its verify, and the walk; the overlaps
live here, in one typed plan and one typed piece of pending work, never in flags.

The plan (`Plan`, resolved once from the caller's `Overlap` and what the engine and the drafter declare):

    tree   TreeWhere.HOST      build_tree on the host over the top-k copied back; the engine's forward
           TreeWhere.LAUNCHED  the same, the verify graph queued before the tree exists (engine/launch.py), so the
                               host's launch overlaps the draft still running
           TreeWhere.DEVICE    DDTree's marginal tree where the log-probs are (tree.DeviceTreeBuilder: a CUDA graph on
                               a GPU), handed to the engine as tensors (forward_tensors), its host copy read after the walk
    ahead  Ahead.NONE          a round drafts at its start
           Ahead.DRAFT         the next draft queued once the walk is read, before the host waits for the record's
                               copies (on a GPU the host builds the record, and a page renders it, while the drafter runs)
           Ahead.DRAFT_EARLY   queued before the walk is read, from its result on the device (engines.QueuedWalk)
           Ahead.VERIFY        and the next round's tree and verify behind that draft, rooted at the walk's bonus
                               token on the device: the host has a whole round before the device waits for it

A round runs `mode()`: the plan's `ahead`, cut to what can run now (a draft from the device's walk needs the
engine's queued walk and a static drafter made on the target's device; a CPU's timed rounds queue nothing unless
asked). The pending work (`pending`) is None or one `Drafted` (the next round's draft, keyed by its root and
committed length), which may hold the `Verified` tree and pass queued behind it; `stage` names it (Stage). A draft
is spent only when its round commits, so a round that fails before its commit leaves it for the next try; a piece
queued ahead that fails is dropped (`queue_error` says why): its round stands and the next step makes its own.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Callable

import torch

from ..errors import InputError
from .kernels.device import triton_available
from .dflash2 import SelectorScores
from .engines import EngineCapabilities, TargetEngine, TreePass
from .proposers import Proposer
from .shapes import Shape, Shaping
from .timing import PhaseClock, Timing
from .tree import DeviceTree, DeviceTreeBuilder, DraftTree


class TreeWhere(enum.Enum):
    """Where a round's tree is built (module docstring)."""

    HOST = "host"
    LAUNCHED = "launched"
    DEVICE = "device"


class Ahead(enum.IntEnum):
    """How much of the next round is queued before the host reads this one, each more than the one before."""

    NONE = 0
    DRAFT = 1
    DRAFT_EARLY = 2
    VERIFY = 3


class Stage(enum.Enum):
    """The pending work: nothing, the next round's draft, or its draft with its tree and verify."""

    IDLE = "idle"
    DRAFTED = "drafted"
    VERIFIED = "verified"


@dataclass(frozen=True)
class Overlap:
    """What a caller asks of the overlaps (None: where they were measured to pay); resolved once into a Plan.
    `tree_on_device` (run --[no-]tree-on-device), `launch_ahead` (run --[no-]launch-ahead), `queue_draft` (a round
    queues the next round's draft), `draft_ahead` (before the walk is read), `verify_ahead` (and the next tree and
    verify); the same rounds and records whatever they are."""

    tree_on_device: bool | None = None
    launch_ahead: bool | None = None
    queue_draft: bool | None = None
    draft_ahead: bool = True
    verify_ahead: bool = True


@dataclass(frozen=True)
class Plan:
    """A session's overlaps, resolved (module docstring). `untimed_only`: queue only in rounds whose phases are not
    timed by the wall clock (queue_draft not asked, and no one GPU whose CUDA events cost no wait)."""

    tree: TreeWhere = TreeWhere.HOST
    ahead: Ahead = Ahead.NONE
    untimed_only: bool = False


@dataclass(frozen=True)
class Facts:
    """What a plan is resolved from beside the caller's asks: the shape's and the engine's declarations, where the
    models sit, and whether the rounds are recorded."""

    shape: Shape
    capabilities: EngineCapabilities
    drafter_on_gpu: bool  # a drafter's pass on the one GPU the target is on (the log-probs where the tree is built)
    one_gpu: bool  # every model on one CUDA device (phases timed by CUDA events, no device-wide waits)
    record: bool
    refusal: str  # why a tree on the device cannot be asked for (the method, scoring and engine named)


def plan(ask: Overlap, facts: Facts) -> Plan:
    """THE choice of a session's overlaps. The tree: on the device as asked (refused where the shape is not
    DDTree's marginal tree or the engine takes no tree as tensors), or for None where it was measured to cost the
    host least and the round no more (docs/lab/NOTEBOOK.md sections 20-21: a drafter and the target on one GPU,
    the best-first kernel in Triton), unless a launch ahead was asked for; else a verify launched ahead of a host
    tree as asked, or for None where the rounds keep no record (a recorded round's reads may wait on the whole
    device, which would wait on the launch: section 19), where the engine can and both models are on one GPU.
    Ahead: as far as asked; the next verify only behind a tree on the device."""
    shape, caps = facts.shape, facts.capabilities
    device_tree = shape.marginal and caps.tree_tensors
    if ask.tree_on_device is None:
        on_device = device_tree and facts.drafter_on_gpu and ask.launch_ahead is not True and triton_available()
    elif ask.tree_on_device and not device_tree:
        raise InputError(facts.refusal)
    else:
        on_device = bool(ask.tree_on_device)
    launch = not facts.record if ask.launch_ahead is None else bool(ask.launch_ahead)
    launched = launch and caps.launch_ahead and facts.one_gpu and not on_device and shape.marginal
    tree = TreeWhere.DEVICE if on_device else TreeWhere.LAUNCHED if launched else TreeWhere.HOST
    if ask.queue_draft is False:
        ahead = Ahead.NONE
    elif not ask.draft_ahead:
        ahead = Ahead.DRAFT
    elif not (ask.verify_ahead and on_device):
        ahead = Ahead.DRAFT_EARLY
    else:
        ahead = Ahead.VERIFY
    return Plan(tree, ahead, untimed_only=ask.queue_draft is None and not facts.one_gpu)


@dataclass(frozen=True)
class Verified:
    """The next round's tree and verify, queued behind its draft before the host read this round's walk."""

    tree: DeviceTree
    read: Callable[[], DraftTree]  # the tree's host copy, read after the walk
    tree_pass: TreePass


@dataclass(frozen=True)
class Drafted:
    """The next round's draft, queued by this one (or made by a round that then failed before its commit)."""

    key: tuple[int, int]  # (its root, the committed length it drafts after)
    logprobs: torch.Tensor  # [block_size - 1, vocab]
    clock: PhaseClock | None  # what timed it (its time is the next round's "draft" phase); None: made in the round
    verified: Verified | None = None


@dataclass(frozen=True)
class Built:
    """A round's tree and the engine's pass over it. `ahead`: the last round queued both (timed by its clock)."""

    tree: DraftTree | DeviceTree
    scores: SelectorScores | None  # the selector's, where the tree came from them
    tree_pass: TreePass
    ahead: bool = False
    read: Callable[[], DraftTree] | None = None  # a DeviceTree's host copy

    def host_tree(self) -> DraftTree:
        """The tree on the host (a device tree's copy read: after the walk's own wait)."""
        return self.read() if self.read is not None else self.tree


@dataclass(frozen=True)
class Turn:
    """Where a round stands when it walks: its committed length, block, the output's length before it, the limit."""

    committed_len: int
    block_size: int
    generated: int
    max_new_tokens: int


@dataclass(frozen=True)
class Walk:
    """A round's walk and commit: the accepted path, the bonus token, the path's context features, the record's
    reads (queued where the mode says), and the mode it ran in."""

    accepted: list[int]
    bonus: int
    features: torch.Tensor | None
    reads: tuple
    mode: Ahead


class Scheduler:
    """A session's overlaps (module docstring): `plan` resolved once, `pending` the one piece of work in flight."""

    def __init__(self, engine: TargetEngine, proposer: Proposer, shape: Shape, plan: Plan, timing: Timing, *,
                 tree_size: int, budget: int, target_device: torch.device):
        self.engine, self.proposer, self.shape, self.plan, self.timing = engine, proposer, shape, plan, timing
        self.tree_size, self.target_device = tree_size, target_device
        self.tree_builder = DeviceTreeBuilder(budget) if plan.tree is TreeWhere.DEVICE else None
        self.reset()

    def reset(self) -> None:
        """A new prompt: nothing pending."""
        self.pending: Drafted | None = None
        self.verified_ahead = 0  # rounds whose tree and verify the round before queued
        self.queue_error: str | None = None  # why the last piece queued ahead that failed did (the next step made its own)

    @property
    def stage(self) -> Stage:
        if self.pending is None:
            return Stage.IDLE
        return Stage.DRAFTED if self.pending.verified is None else Stage.VERIFIED

    @property
    def tree_on_device(self) -> bool:
        return self.plan.tree is TreeWhere.DEVICE

    @property
    def launch_ahead(self) -> bool:
        return self.plan.tree is TreeWhere.LAUNCHED

    def mode(self) -> Ahead:
        """How much of the next round this round queues ahead: the plan's, cut to what can run now."""
        if self.plan.ahead is Ahead.NONE or (self.plan.untimed_only and self.timing.on):
            return Ahead.NONE
        if self.plan.ahead >= Ahead.DRAFT_EARLY and not self._drafts_from_walk():
            return Ahead.DRAFT
        return self.plan.ahead

    def _drafts_from_walk(self) -> bool:
        """A draft can be queued from the walk on the device: the engine queues its walk, and the proposer drafts
        from tensors on the target's device (a static drafter, made by a first draft)."""
        return self.engine.capabilities.queued_walk and self.proposer.queue_device == self.target_device

    @property
    def queues_draft(self) -> bool:
        """This round queues the next round's draft (its mode, the timing included)."""
        return self.mode() >= Ahead.DRAFT

    @property
    def draft_ahead(self) -> bool:
        """A round that queues the next draft queues it before the walk is read: the plan's and what can run now,
        whatever the timing (a CPU's timed rounds queue nothing, its untimed ones do)."""
        return self.plan.ahead >= Ahead.DRAFT_EARLY and self._drafts_from_walk()

    @property
    def verify_ahead(self) -> bool:
        """And the next tree and verify behind it."""
        return self.plan.ahead is Ahead.VERIFY and self._drafts_from_walk()

    def draft(self, root: int, committed_len: int, features, block_size: int) -> tuple[torch.Tensor, PhaseClock | None]:
        """This round's log-probs, and the clock that timed them where the last round queued them; else drafted
        now (and pending until the commit: drafting moves the proposer's context on, so a round that fails
        before its commit leaves the draft for the next try, which could not draft the same context again)."""
        if self.pending is None:
            logprobs = self.proposer.propose(root, committed_len, features, block_size)
            self.pending = Drafted((root, committed_len), logprobs, None)
        if self.pending.key != (root, committed_len):
            raise RuntimeError(f"a queued draft for {self.pending.key} out of step with root {root} at {committed_len}")
        return self.pending.logprobs, self.pending.clock

    def verify(self, root: int, logprobs: torch.Tensor, lap, at: Shaping) -> Built:
        """The round's tree and the engine's pass over it: queued by the last round (spent here: a retry after a
        failure rebuilds both), or built where the plan says and verified. A launch ahead is made once the top-k's
        copies are queued (their pinned buffers taken) and before the host waits for them; between the launch and
        the forward the host only waits on the main stream and allocates nothing on the device or in pinned
        memory (either may wait on the whole device, which waits on the launch); whatever the tree's making
        raises, the launch is let go."""
        pending = self.pending
        if pending is not None and pending.verified is not None:
            self.pending = dataclasses.replace(pending, verified=None)
            self.verified_ahead += 1
            v = pending.verified
            return Built(v.tree, None, v.tree_pass, ahead=True, read=v.read)
        if self.plan.tree is TreeWhere.DEVICE:
            tree = self.tree_builder(root, logprobs)
            read = self.tree_builder.queue_host(tree)  # read after the walk's own wait
            lap("tree")
            return Built(tree, None, self.engine.forward_tensors(tree), read=read)
        launch = (lambda: self.engine.launch_ahead(self.tree_size)) if self.plan.tree is TreeWhere.LAUNCHED else None
        try:
            tree, scores = self.shape.build(root, logprobs, at, launch)
        except BaseException:
            if launch is not None:
                self.engine.release_ahead()  # a no-op where the launch was not made
            raise
        lap("tree")
        return Built(tree, scores, self.engine.forward(tree))

    def walk(self, tree_pass: TreePass, chosen: torch.Tensor, lap, reads, turn: Turn) -> Walk:
        """The walk along the target's choices and the commit, then the record's reads (`reads(depth, bonus)`:
        queued after the commit, so on a GPU the copies run after it). Where the mode drafts early, the next
        round's draft (and tree and verify) go in before the host reads the walk (_walk_ahead)."""
        mode = self.mode()
        if mode >= Ahead.DRAFT_EARLY:
            return self._walk_ahead(mode, tree_pass, chosen, lap, reads, turn)
        accepted, bonus, features = self.engine.accept(tree_pass, chosen)
        self.pending = None  # this round's draft is spent
        lap("commit")
        return Walk(accepted, bonus, features, reads(len(accepted), bonus), mode)

    def _walk_ahead(self, mode: Ahead, tree_pass: TreePass, chosen, lap, reads, turn: Turn) -> Walk:
        """The walk and the commit queued on the device (the engine's accept_queued), then, before the host reads
        the walk, the record's reads of it and the next round's draft from what the device holds (its root the
        bonus token, its context the committed length and the path's features: proposer.propose_queued), and in
        VERIFY mode its tree and verify; then the read, after which the drafter's context is settled."""
        walk = self.engine.accept_queued(tree_pass, chosen)
        self.pending = None  # this round's draft is spent
        lap("commit")
        copies = reads(walk.length, walk.bonus)
        clock = self.timing.queued_clock()
        try:
            drafted = self.proposer.propose_queued(walk, turn.block_size)
        except Exception as exc:  # noqa: BLE001 - the round stands; the next step drafts again, raises what persists
            drafted, self.queue_error = None, f"{type(exc).__name__}: {exc}"
        if drafted is not None and clock is not None:
            clock.lap("draft")
        verified = self._queue_verify(walk, drafted, clock, turn) if drafted is not None and mode is Ahead.VERIFY else None
        accepted, bonus, features = walk.result()  # the wait: for the walk's copy alone
        if drafted is not None:
            committed = turn.committed_len + len(accepted)
            self.proposer.settle(committed)
            self.pending = Drafted((bonus, committed), drafted, clock, verified)
        return Walk(accepted, bonus, features, copies, mode)

    def _queue_verify(self, walk, logprobs: torch.Tensor, clock: PhaseClock | None, turn: Turn) -> Verified | None:
        """The next round's tree and verify queued behind its draft, unless this round can end the output by its
        length (a round past the end costs the device a verify no one reads): the tree from the draft's log-probs
        with the walk's bonus token as its root, on the device, its copy to the host queued, and the engine's pass
        over it (its inputs' positions the device's committed length; its key bucket with room for the walk's
        path). None where it was not queued (one that fails: why in queue_error; the next step makes both)."""
        if turn.generated + turn.block_size >= turn.max_new_tokens:
            return None
        try:
            tree = self.tree_builder(walk.bonus, logprobs)
            read = self.tree_builder.queue_host(tree)
            if clock is not None:
                clock.lap("tree")
            tree_pass = self.engine.forward_tensors(tree, ahead=True)
        except Exception as exc:  # noqa: BLE001 - the round stands; the next step builds and verifies its tree
            self.queue_error = f"{type(exc).__name__}: {exc}"
            return None
        if clock is not None:
            clock.lap("verify")
        return Verified(tree, read, tree_pass)

    def after_read(self, walk: Walk, root: int, committed_len: int, features, block_size: int) -> None:
        """In DRAFT mode, once the walk is read and the output extended (and not done): the next round's draft,
        queued now (its root the last output token, its context this round's accepted features) and timed where
        the rounds may be; the next step takes it. A draft that fails here is not queued: this round's record and
        state are kept whole, and the next step drafts as a round does without a queue."""
        if walk.mode is not Ahead.DRAFT:
            return
        clock = self.timing.queued_clock()
        try:
            logprobs = self.proposer.propose(root, committed_len, features, block_size)
        except Exception as exc:  # noqa: BLE001 - the round stands; the next step drafts again, raises what persists
            self.queue_error = f"{type(exc).__name__}: {exc}"
            return
        if clock is not None:
            clock.lap("draft")
        self.pending = Drafted((root, committed_len), logprobs, clock)
