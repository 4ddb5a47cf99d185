"""The overlap scheduler's plan and state machine (engine/scheduler.py), with no model: a fake engine and proposer
that declare what they can do, the real tree shapes. Each mode's transitions of the pending work (IDLE, DRAFTED,
VERIFIED), what a failure leaves, and the refusal of an engine or proposer that declares nothing."""

from __future__ import annotations

import pytest
import torch

from ddtree_viz.engine.engines import (EngineCapabilities, QueuedWalk, RunnerEngine, TransformersEngine, TreePass,
                                       capabilities_of)
from ddtree_viz.engine.proposers import Proposer
from ddtree_viz.engine.sampling import GREEDY
from ddtree_viz.engine.scheduler import Ahead, Facts, Overlap, Plan, Scheduler, Stage, TreeWhere, Turn, plan
from ddtree_viz.engine.shapes import BestFirst, Chain, Shaping
from ddtree_viz.engine.timing import Timing
from ddtree_viz.engine.tree import DeviceTree
from ddtree_viz.errors import InputError
from ddtree_viz.options import DecodeSettings

VOCAB, BLOCK, DEVICE = 11, 4, torch.device("cpu")
ALL = EngineCapabilities(tree_tensors=True, launch_ahead=True, queued_walk=True)


class FakeProposer(Proposer):
    """Log-probs by (root, committed length); drafts from a walk once `queue_device` is set, as a static drafter does
    after its first draft."""

    block_size = BLOCK

    def __init__(self, queue_device=None, fail_queued: bool = False):
        self._device, self.fail_queued, self.calls, self.settled = queue_device, fail_queued, [], []

    def propose(self, root, committed_len, new_features, block_size):
        self.calls.append(("propose", root, committed_len))
        gen = torch.Generator().manual_seed(root * 1000 + committed_len)
        return torch.log_softmax(torch.randn(block_size - 1, VOCAB, generator=gen), dim=-1)

    @property
    def queue_device(self):
        return self._device

    def propose_queued(self, walk, block_size):
        if self.fail_queued:
            raise RuntimeError("no memory for the queued draft")
        self.calls.append(("queued", int(walk.bonus), int(walk.committed)))
        return self.propose(int(walk.bonus), int(walk.committed), None, block_size)

    def settle(self, committed_len):
        self.settled.append(committed_len)


class FakeEngine:
    """Walks one drafted node and takes the bonus 7 every round; a tree as tensors is a DeviceTree on the CPU."""

    name = "fake"

    def __init__(self, capabilities=ALL, committed=10, refuse_ahead=False):
        self.capabilities, self.committed, self.refuse_ahead = capabilities, committed, refuse_ahead
        self.launched = self.released = 0

    def forward(self, tree):
        return TreePass(tree, torch.zeros(len(tree), VOCAB), None)

    def forward_tensors(self, tree, ahead=False):
        if ahead and self.refuse_ahead:
            raise RuntimeError("no room ahead")
        return TreePass(tree, torch.zeros(len(tree), VOCAB), None)

    def accept(self, tree_pass, chosen):
        self.committed += 2
        return [0, 1], 7, None

    def accept_queued(self, tree_pass, chosen):
        self.committed += 2
        return QueuedWalk(torch.tensor(2), torch.tensor(7), torch.tensor(self.committed), None, lambda: ([0, 1], 7))

    def launch_ahead(self, n):
        self.launched += 1
        return True

    def release_ahead(self):
        self.released += 1


class FakeBuilder:
    """tree.DeviceTreeBuilder's interface over a host tree (a CPU has no graph to capture)."""

    def __call__(self, root, logprobs):  # (a walk's bonus: a [] tensor on the device)
        return DeviceTree.from_logprobs(root.view(1) if isinstance(root, torch.Tensor) else root, logprobs, 3)

    def queue_host(self, tree):
        return tree.to_host


def scheduler(ahead: Ahead, tree=TreeWhere.HOST, *, engine=None, proposer=None, untimed_only=False, timed=False):
    s = Scheduler(engine or FakeEngine(), proposer or FakeProposer(DEVICE), BestFirst(), Plan(tree, ahead, untimed_only),
                  Timing(timed, lambda: None, None), tree_size=4, budget=3, target_device=DEVICE)
    if tree is TreeWhere.DEVICE:
        s.tree_builder = FakeBuilder()
    return s


def one_round(s: Scheduler, root: int, committed: int, generated: int = 1, max_new: int = 64):
    """A round as round.play_round drives the scheduler: draft, tree and verify, walk, then after the read."""
    laps = []
    logprobs, clock = s.draft(root, committed, None, BLOCK)
    built = s.verify(root, logprobs, laps.append, Shaping(3, committed, GREEDY, s.proposer))
    walk = s.walk(built.tree_pass, built.tree_pass.logits.argmax(-1), laps.append,
                  lambda depth, bonus: ("reads", depth), Turn(committed, BLOCK, generated, max_new))
    s.after_read(walk, walk.bonus, committed + len(walk.accepted), walk.features, BLOCK)
    return built, walk, laps


def facts(shape=None, caps=ALL, gpu=True, record=False):
    return Facts(shape or BestFirst(), caps, drafter_on_gpu=gpu, one_gpu=gpu, record=record, refusal="no tree here")


# ---------------------------------------------------------------------------------------------------------
# The plan: one typed resolution of the caller's asks
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ask, fact, expected", [
    (Overlap(), facts(gpu=False, record=True), Plan(TreeWhere.HOST, Ahead.DRAFT_EARLY, untimed_only=True)),
    (Overlap(queue_draft=False), facts(gpu=False), Plan(TreeWhere.HOST, Ahead.NONE)),
    (Overlap(queue_draft=True), facts(gpu=False), Plan(TreeWhere.HOST, Ahead.DRAFT_EARLY)),
    (Overlap(draft_ahead=False), facts(gpu=False), Plan(TreeWhere.HOST, Ahead.DRAFT, untimed_only=True)),
    (Overlap(tree_on_device=True), facts(gpu=False), Plan(TreeWhere.DEVICE, Ahead.VERIFY, untimed_only=True)),
    (Overlap(tree_on_device=True, verify_ahead=False), facts(), Plan(TreeWhere.DEVICE, Ahead.DRAFT_EARLY)),
    (Overlap(tree_on_device=False), facts(), Plan(TreeWhere.LAUNCHED, Ahead.DRAFT_EARLY)),  # records off: launched
    (Overlap(tree_on_device=False), facts(record=True), Plan(TreeWhere.HOST, Ahead.DRAFT_EARLY)),
    (Overlap(launch_ahead=True), facts(record=True), Plan(TreeWhere.LAUNCHED, Ahead.DRAFT_EARLY)),
    (Overlap(launch_ahead=True), facts(gpu=False), Plan(TreeWhere.HOST, Ahead.DRAFT_EARLY, untimed_only=True)),
    (Overlap(launch_ahead=True), facts(shape=Chain()), Plan(TreeWhere.HOST, Ahead.DRAFT_EARLY)),
    (Overlap(launch_ahead=True), facts(caps=EngineCapabilities()), Plan(TreeWhere.HOST, Ahead.DRAFT_EARLY)),
])
def test_the_plan_resolves_the_asks_once(ask, fact, expected):
    assert plan(ask, fact) == expected


def test_a_tree_on_the_device_is_refused_where_it_cannot_be_built():
    for fact in (facts(shape=Chain()), facts(caps=EngineCapabilities(launch_ahead=True, queued_walk=True))):
        with pytest.raises(InputError, match="no tree here"):
            plan(Overlap(tree_on_device=True), fact)
    assert plan(Overlap(tree_on_device=None), facts(caps=EngineCapabilities())).tree is TreeWhere.HOST


def test_the_mode_is_the_plans_cut_to_what_can_run_now():
    assert scheduler(Ahead.NONE).mode() is Ahead.NONE
    assert scheduler(Ahead.VERIFY, TreeWhere.DEVICE).mode() is Ahead.VERIFY
    # a CPU's timed rounds queue nothing unless asked (untimed_only); untimed, they do
    assert scheduler(Ahead.DRAFT, untimed_only=True, timed=True).mode() is Ahead.NONE
    assert scheduler(Ahead.DRAFT, untimed_only=True, timed=False).mode() is Ahead.DRAFT
    timed = scheduler(Ahead.VERIFY, TreeWhere.DEVICE, untimed_only=True, timed=True)
    assert not timed.queues_draft and timed.draft_ahead and timed.verify_ahead  # what its untimed rounds would do
    # drafting from the device's walk needs the engine's queued walk and a drafter on the target's device
    no_walk = FakeEngine(EngineCapabilities(tree_tensors=True))
    assert scheduler(Ahead.VERIFY, TreeWhere.DEVICE, engine=no_walk).mode() is Ahead.DRAFT
    assert scheduler(Ahead.DRAFT_EARLY, proposer=FakeProposer(queue_device=None)).mode() is Ahead.DRAFT
    s = scheduler(Ahead.DRAFT_EARLY, proposer=FakeProposer(queue_device=None))
    s.proposer._device = DEVICE  # a static drafter made by the first draft
    assert s.mode() is Ahead.DRAFT_EARLY and s.draft_ahead and not s.verify_ahead and s.queues_draft


# ---------------------------------------------------------------------------------------------------------
# The pending work, mode by mode
# ---------------------------------------------------------------------------------------------------------


def test_none_drafts_at_each_rounds_start_and_spends_it_at_the_commit():
    s = scheduler(Ahead.NONE)
    assert s.stage is Stage.IDLE
    logprobs, clock = s.draft(5, 10, None, BLOCK)
    assert s.stage is Stage.DRAFTED and clock is None and s.pending.key == (5, 10)
    assert s.draft(5, 10, None, BLOCK)[0] is logprobs  # a retry of the round takes the same draft
    built, walk, laps = one_round(s, 5, 10)
    assert walk.mode is Ahead.NONE and laps == ["tree", "commit"] and not built.ahead
    assert s.stage is Stage.IDLE and s.proposer.calls == [("propose", 5, 10)]


def test_draft_queues_the_next_draft_after_the_read():
    s = scheduler(Ahead.DRAFT)
    _, walk, _ = one_round(s, 5, 10)
    assert walk.mode is Ahead.DRAFT and walk.reads == ("reads", 2)  # the walk read first
    assert s.stage is Stage.DRAFTED and s.pending.key == (7, 12)
    queued = s.pending.logprobs
    assert s.draft(7, 12, None, BLOCK)[0] is queued  # the next round takes it
    with pytest.raises(RuntimeError, match="out of step"):
        s.draft(7, 13, None, BLOCK)
    one_round(s, 7, 12)
    assert [c[:1] for c in s.proposer.calls] == [("propose",)] * 3 and s.stage is Stage.DRAFTED


def test_draft_early_queues_the_next_draft_from_the_walk_on_the_device():
    s = scheduler(Ahead.DRAFT_EARLY)
    _, walk, _ = one_round(s, 5, 10)
    assert walk.mode is Ahead.DRAFT_EARLY and isinstance(walk.reads[1], torch.Tensor)  # read on the device
    assert s.stage is Stage.DRAFTED and s.pending.key == (7, 12) and s.proposer.settled == [12]
    assert s.proposer.calls[-1] == ("propose", 7, 12) and ("queued", 7, 12) in s.proposer.calls


def test_verify_queues_the_next_tree_and_verify_and_the_next_round_takes_them():
    s = scheduler(Ahead.VERIFY, TreeWhere.DEVICE)
    built, walk, laps = one_round(s, 5, 10)
    assert laps == ["tree", "commit"] and s.stage is Stage.VERIFIED and s.verified_ahead == 0
    built, walk, laps = one_round(s, 7, 12)
    assert built.ahead and laps == ["commit"] and s.verified_ahead == 1  # no tree, no verify of its own
    assert isinstance(built.tree, DeviceTree) and built.host_tree().token_ids[0] == 7
    assert s.stage is Stage.VERIFIED
    # a round that could end the output by its length queues its draft but no verify no one would read
    one_round(s, 7, 14, generated=61, max_new=64)
    assert s.stage is Stage.DRAFTED
    s.reset()
    assert s.stage is Stage.IDLE and s.verified_ahead == 0 and s.queue_error is None


def test_a_failure_ahead_drops_the_piece_and_keeps_the_round():
    s = scheduler(Ahead.VERIFY, TreeWhere.DEVICE, engine=FakeEngine(refuse_ahead=True))
    one_round(s, 5, 10)
    assert s.stage is Stage.DRAFTED and "no room ahead" in s.queue_error  # the draft stands, the verify does not
    s = scheduler(Ahead.DRAFT_EARLY, proposer=FakeProposer(DEVICE, fail_queued=True))
    _, walk, _ = one_round(s, 5, 10)
    assert walk.accepted == [0, 1] and s.stage is Stage.IDLE and "no memory" in s.queue_error


def test_a_round_that_fails_before_its_commit_keeps_its_draft_and_lets_a_launch_go():
    s = scheduler(Ahead.NONE, TreeWhere.LAUNCHED)

    def fails(root, logprobs, at, before_wait=None):
        before_wait()
        raise RuntimeError("a tree that cannot be built")

    s.shape.build = fails
    logprobs, _ = s.draft(5, 10, None, BLOCK)
    with pytest.raises(RuntimeError, match="cannot be built"):
        s.verify(5, logprobs, lambda name: None, Shaping(3, 10, GREEDY, s.proposer))
    assert s.engine.launched == s.engine.released == 1 and s.stage is Stage.DRAFTED


# ---------------------------------------------------------------------------------------------------------
# Declared, not probed
# ---------------------------------------------------------------------------------------------------------


class NoCapabilities:
    """An engine-like object with the methods but no declaration."""

    name = "bare"

    def forward(self, tree):
        raise AssertionError("never reached")

    def forward_tensors(self, tree, ahead=False):
        raise AssertionError("never reached")


def test_an_engine_that_declares_nothing_is_refused_not_probed():
    with pytest.raises(TypeError, match="NoCapabilities is no target engine: it declares no `capabilities`"):
        capabilities_of(NoCapabilities())
    from ddtree_viz.engine.session import DecodeSession, SessionParts

    with pytest.raises(TypeError, match="declares no `capabilities`"):
        SessionParts(engine=NoCapabilities())
    with pytest.raises(TypeError, match="declares no `capabilities`"):
        DecodeSession.of(None, engine=NoCapabilities())  # refused where it enters, before anything is made
    with pytest.raises(TypeError, match="is no proposer"):
        SessionParts(proposer=object())
    assert TransformersEngine.capabilities == EngineCapabilities()


def test_the_runner_declares_its_walk_where_it_walks():
    engine = RunnerEngine.__new__(RunnerEngine)  # (no runner needed to read a declaration)
    for walk in ("host", "device"):
        engine.walk = walk
        assert engine.capabilities == EngineCapabilities(tree_tensors=True, launch_ahead=True,
                                                         queued_walk=walk == "device")


def test_settings_are_checked_once_as_they_are_made():
    """DecodeSettings checks itself when made (the CLI, the page and DecodeSession.of all make one), as ints."""
    assert DecodeSettings(budget=32.0, max_new_tokens=8.0, block_size=4.0).budget == 32
    for bad, words in ((dict(budget=0), "budget must be between 1 and 4096, not 0"),
                       (dict(max_new_tokens="ten"), "max new tokens must be a whole number"),
                       (dict(block_size=1), "block size must be at least 2"),
                       (dict(tree_scoring="joint"), "tree scoring must be one of marginal, selector")):
        with pytest.raises(InputError, match=words):
            DecodeSettings(**bad)
