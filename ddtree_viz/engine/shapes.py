"""What a round verifies, built from one proposal: one named shape per method and tree scoring (transformers'
CandidateGenerator habit), picked in one place (`shape_for`), so the round calls `build` and never branches on a
method's name.

    BestFirst      DDTree's best-first tree over the drafter's per-depth log-probs (marginal scoring): tree.build_tree,
                   or the same tree where the log-probs are (the scheduler's device tree)
    SelectorTree   DDTree's best-first tree over a candidate selector's pair scores (selector scoring, DFlash2)
    Chain          DFlash's chain: the drafter's top-1 at every depth
    SelectorChain  DFlash2's chain: the candidate selector's greedy walk, or at T > 0 its sample coupled to the
                   target's position-keyed noise

`build(root, logprobs, at, before_wait)` -> (DraftTree, the selector's scores where the tree came from them, else
None); `size(budget, block)` the most positions a round verifies; `own(nodes, budget)` the round's own budget (the
budget curve's last key); `draft_top_k(budget, cap)` how many of the drafter's candidates a record keeps per depth.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import InputError
from ..options import DFLASH, DFLASH2, MARGINAL
from .dflash2 import SelectorScores
from .proposers import Proposer
from .sampling import Sampler, gumbel_noise_at
from .tree import DraftTree, build_selector_tree, selector_chain


@dataclass(frozen=True)
class Shaping:
    """What a shape reads besides the proposal: the budget, where the round's root sits, the sampler (DFlash2's
    chain at T > 0) and the proposer (a candidate selector's scores)."""

    budget: int
    committed_len: int
    sampler: Sampler
    proposer: Proposer


class Shape:
    """A tree shape: DDTree's tree by default (`budget` + 1 positions, the budget its own); a chain overrides."""

    marginal = False  # DDTree's marginal tree: the one a device builds (DeviceTreeBuilder) and a verify launches ahead of
    selector = False  # built from the proposer's candidate selector (a DFlash2 drafter)
    refusal = ""  # why a proposer without a selector cannot build it

    def size(self, budget: int, block_size: int) -> int:
        return budget + 1

    def own(self, nodes: int, budget: int) -> int:
        return budget

    def draft_top_k(self, budget: int, cap: int) -> int:
        return min(budget, cap)

    def build(self, root: int, logprobs: torch.Tensor, at: Shaping,
              before_wait=None) -> tuple[DraftTree, SelectorScores | None]:
        raise NotImplementedError


class BestFirst(Shape):
    marginal = True

    def build(self, root, logprobs, at, before_wait=None):
        """`before_wait`: called between queueing the top-k's copies to the host and waiting for them (the
        scheduler's verify launched ahead)."""
        return DraftTree.from_logprobs(root, logprobs, at.budget, before_wait=before_wait), None


def _selector(at):
    """The proposer's selector over its last proposal and its conditional scores (root, pair) as numpy arrays."""
    scores = at.proposer.selector_scores()
    cond_root, cond_pair = (t.numpy() for t in scores.conditional())
    return scores, cond_root, cond_pair


class SelectorTree(Shape):
    selector = True
    refusal = ("tree scoring selector needs a DFlash2 drafter (its candidate selector's pair scores); this drafter is "
               "{family} and has none: use tree scoring marginal, or load a DFlash2 drafter")

    def build(self, root, logprobs, at, before_wait=None):
        scores, cond_root, cond_pair = _selector(at)
        return build_selector_tree(root, cond_root, cond_pair, scores.ids.numpy(), at.budget), scores


class Chain(Shape):
    """A chain of block_size - 1 drafts: its length is its budget, the drafter's grid the record's cap."""

    def size(self, budget: int, block_size: int) -> int:
        return block_size

    def own(self, nodes: int, budget: int) -> int:
        return nodes - 1

    def draft_top_k(self, budget: int, cap: int) -> int:
        return cap

    def build(self, root, logprobs, at, before_wait=None):
        return DraftTree.chain_from_logprobs(root, logprobs), None


class SelectorChain(Chain):
    selector = True
    refusal = ("method dflash2 (the candidate selector's chain) needs a DFlash2 drafter; this drafter is {family} and "
               "has no candidate selector: pick method ddtree or dflash, or load a DFlash2 drafter")

    def build(self, root, logprobs, at, before_wait=None):
        """Greedy; at T > 0 the token at depth d (position committed_len + d) sampled with the target's noise."""
        scores, cond_root, cond_pair = _selector(at)
        noise = None
        if not at.sampler.greedy:
            positions = torch.arange(1, scores.ids.shape[0] + 1) + at.committed_len
            noise = gumbel_noise_at(at.sampler.seed, positions, scores.ids).numpy()
        return selector_chain(root, cond_root, cond_pair, scores.ids.numpy(), noise,
                              at.sampler.temperature or 1.0), scores


def shape_for(method: str, tree_scoring: str = MARGINAL) -> Shape:
    """THE choice of a round's shape: a chain by its method (a chain's scoring is its own), DDTree's tree by its
    scoring. A new shape each call (a session's own: a test may patch its build)."""
    if method == DFLASH:
        return Chain()
    if method == DFLASH2:
        return SelectorChain()
    return BestFirst() if tree_scoring == MARGINAL else SelectorTree()


def check_shape(shape: Shape, proposer: Proposer) -> None:
    """A shape built from a candidate selector needs a proposer with one (a DFlash2 drafter): an InputError
    saying so otherwise."""
    if shape.selector and not proposer.selector:
        raise InputError(shape.refusal.format(family=proposer.family or "dflash"))
