"""Record-level analysis: what a round (or a session of rounds) says beyond its own acceptance. Pure functions of
StepRecords (trace.py): no torch, no gradio, no model; the session, the CLI, the page and the renderers all call
these, so each figure is computed one way.

- `budget_curve(step)`: the tokens the same round would have gained under every smaller budget (exact, below).
- `session_budget_curve(steps)`: those curves summed over a session.
- `acceptance_histogram(steps)`: rounds by tokens kept (accepted drafts + the bonus, a cut walk at what it kept).
- `per_depth_counts(steps)` / `per_depth_acceptance(steps)`: P(accepted drafts >= d | accepted drafts >= d-1,
  tree depth >= d), d = 1..block-1.
- `stop_info(step)`: at the depth where the walk stopped, the drafter's top candidate, the target's token and how
  the drafter ranked it (or 'not drafted').
- `node_info(step, node)`: one tree node as the node inspector shows it.

**Why the budget curve is exact.** DDTree's best-first tree numbers its nodes in pop order (parents first), and
the first b pops do not depend on the budget: the tree under budget b is nodes 0..b of the tree under any larger
budget (the candidate lists per depth are the drafter's top-min(b, vocab), and a node of rank r at a depth can
only be popped after its r elder siblings, so ranks >= b are never reached in b pops). The target's choice at a
node depends only on the node's path (its argmax of the logits after the path, exact mode: invariant 2 of
docs/ARCHITECTURE.md) and, when sampling, on the node's position (the noise is keyed by seed and position:
docs/SAMPLING.md), never on the rest of the tree. So the walk under budget b follows the same choices, restricted
to nodes <= b: it takes the accepted path's nodes up to the first one numbered above b, and the target's choice
there becomes the bonus. Tokens gained under budget b = the accepted path's nodes (root included) numbered <= b.
For the DFlash chain the "budget" is the chain's length, and the same holds (node d is depth d).

The caveat: this is the counterfactual for that one round from that one state; a session run at the smaller
budget would have started its later rounds elsewhere. In naive verify mode the target's logits at a node depend
on the whole flattened tree (the hybrid-cache bug), so the curve is what the same choices would give, not what a
naive round at that budget would have produced (`curve_is_exact`). In bf16 on a GPU a smaller tree pass can round
a near-tie differently.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np

from . import treeops
from .options import CHAINS, DFLASH, MARGINAL
from .trace import StepRecord
from .words import plural

NOT_DRAFTED = "not drafted"

# stop_info's reasons, in the order the checks run
STOP_BLOCK_END = "block end"  # the walk accepted every drafted depth: nothing was drafted deeper
STOP_TREE_ENDED = "tree ended"  # the last accepted node is a leaf: the budget ran out on this path
STOP_NOT_TAKEN = "drafted, not taken"  # the drafter proposed the token at this depth, the tree did not take it here
STOP_NOT_DRAFTED = NOT_DRAFTED  # not among the drafter's recorded candidates at this depth


# ----------------------------------------------------------------------------------------------------------
# The budget that would have done
# ----------------------------------------------------------------------------------------------------------


def tree_size(step: StepRecord) -> int:
    """Tree positions verified in the round (root included); known even when nodes were not recorded."""
    return len(step.target_argmax) or len(step.nodes)


def budget_curve(step: StepRecord, budget: int | None = None) -> dict[int, int]:
    """{b: tokens the round would have gained under budget b} for b = 1..budget (default: the round's tree size
    minus the root, i.e. its own budget unless the candidates ran out first; past the tree's size the curve is
    flat). Tokens gained = accepted drafts + the bonus, as `StepRecord.acceptance`; the value at the round's own
    budget is its acceptance. For the DFlash chain b is the chain's length. See the module docstring for why it
    is exact."""
    return budget_curve_of(step.accepted, tree_size(step) - 1 if budget is None else budget)


def budget_curve_of(accepted: Sequence[int], budget: int) -> dict[int, int]:
    """budget_curve from the accepted path's tree positions (root first) and the largest budget wanted."""
    top = int(budget)
    accepted = sorted(accepted)  # positions increase along a path (parents first)
    curve, count, i = {}, 0, 0
    for b in range(1, top + 1):
        while i < len(accepted) and accepted[i] <= b:
            count, i = count + 1, i + 1
        curve[b] = count
    return curve


_MEMO: dict[tuple[str, int], tuple[weakref.ref, Any]] = {}


def _per_round(kind: str, step: StepRecord, compute: Callable[[StepRecord], Any]) -> Any:
    """compute(step), once per round record: records are immutable and a page draws its session-wide views
    (statistics, the budget curve, acceptance by depth) from every round at every Step, so a 60-round session
    redid each round's figures several times a Step. Keyed by the record's identity through a weak reference: an
    entry goes with its record (a closed tab's rounds are not kept alive by this)."""
    key = (kind, id(step))
    hit = _MEMO.get(key)
    if hit is not None and hit[0]() is step:
        return hit[1]
    value = compute(step)
    _MEMO[key] = (weakref.ref(step, lambda _, key=key: _MEMO.pop(key, None)), value)
    return value


def recorded_curve(step: StepRecord) -> Mapping[int, int]:
    """The round's budget curve with int keys (read-only: shared between callers): the recorded `budget_curve`
    (JSON keys are strings) or, for traces written before it existed, computed from the accepted path."""
    return _per_round("curve", step, _recorded_curve)


def _recorded_curve(step: StepRecord) -> Mapping[int, int]:
    if step.budget_curve:
        return MappingProxyType({int(b): int(v) for b, v in step.budget_curve.items()})
    return MappingProxyType(budget_curve(step))


def curve_is_exact(step: StepRecord) -> bool:
    """Exact verify mode: the curve is what a round at each budget would have gained (module docstring)."""
    return step.verify == "exact"


def session_budget_curve(steps: Sequence[StepRecord], budget: int | None = None) -> dict[int, int]:
    """{b: tokens all the rounds would have gained under budget b}, summed round by round (each round from the
    state it actually started in: later rounds would have started elsewhere). A round's curve is flat past its
    own end. `budget` defaults to the largest round's. A round the session stopped inside (max new tokens, end of
    text) counts at most what it kept (StepRecord.kept) at any budget: the rest was never output. The rounds'
    curves are summed as arrays, those of one length at once (a page redraws this from every round at every Step:
    a Python loop over rounds and budgets was ~1 ms a Step at 130 rounds)."""
    rows = [_per_round("row", s, _curve_row) for s in steps]
    top = max((len(values) for values, _ in rows), default=0) if budget is None else int(budget)
    total = np.zeros(top + 1, dtype=np.int64)  # index b; 0 unused
    by_end: dict[int, list] = {}
    for row in rows:
        by_end.setdefault(len(row[0]), []).append(row)
    for end, group in by_end.items():
        n = min(end, top)
        if n:
            total[1:n + 1] += np.stack([values[:n] for values, _ in group]).sum(0)
        if end < top:  # flat from its end on: what it holds there
            total[end + 1:] += sum(tail for _, tail in group)
    return {b: int(total[b]) for b in range(1, top + 1)}


def _curve_row(step: StepRecord) -> tuple[np.ndarray, int]:
    """A round's capped curve as an array (values at b = 1..end, read-only) and what it holds past its end (the
    curve's last value; an empty curve, what the round kept)."""
    c = _capped(recorded_curve(step), step)
    end = max(c) if c else 0
    values = np.fromiter((c[b] for b in range(1, end + 1)), dtype=np.int64, count=end)
    values.flags.writeable = False
    return values, (c[end] if c else step.kept)


def _capped(curve: Mapping[int, int], step: StepRecord) -> Mapping[int, int]:
    """A round's curve capped at what it kept (unchanged for a round that kept its whole walk)."""
    return {b: min(v, step.kept) for b, v in curve.items()} if step.cut else curve


def curve_caveat(method: str = "ddtree") -> str:
    unit = "chain length" if method in CHAINS else "budget"
    return (f"Exact for each round from the state it started in (the smaller {unit}'s tree is a prefix of this one "
            f"and the target's choice at a node depends only on its path); a whole session at that {unit} would "
            "have started its later rounds elsewhere.")


def chain_gain(step: StepRecord, final: bool = False) -> tuple[int, bool] | None:
    """Tokens the DFlash chain of the same drafter pass (its top-1 token at every drafted depth) would have gained
    in this DDTree round, and whether that count is exact (False: at least that many). None where the round cannot
    say: not an exact DDTree round over the drafter's marginals (a chain, naive verify, a DFlash2 selector tree), or
    its drafter's grid or nodes not recorded.

    The target's tokens along the accepted path and the bonus, t_1..t_{a+1}, are its choices after the root (its
    argmax, or its position-keyed sample: docs/SAMPLING.md), which depend on the path alone; the chain accepts
    depth d while its top-1 there equals t_d. A first mismatch at d (d <= a + 1) gains d
    tokens (d - 1 drafts and t_d as the bonus), exact; every drafted depth matched gains the block (exact). When
    t_1..t_{a+1} all match and the block goes deeper, the target's token after t_{a+1} was never verified: at
    least a + 2. A round the session stopped inside (or its `final` round) counts at most what it kept: the chain
    would have stopped there too. Exact top-1 ties aside (the chain takes the max, the grid its top-k's first). The
    same caveat as the budget curve: a chain session would have started its later rounds elsewhere."""
    if (step.method != "ddtree" or not curve_is_exact(step) or step.selector_pair or not step.draft_top_ids
            or not step.nodes):
        return None
    targets = [step.nodes[p].token_id for p in step.accepted[1:]] + [step.bonus_token_id]
    drafted = len(step.draft_top_ids)
    gain, exact = None, True
    for d, token in enumerate(targets[:drafted], start=1):
        if not step.draft_top_ids[d - 1] or step.draft_top_ids[d - 1][0] != token:
            gain = d
            break
    if gain is None:
        gain, exact = (drafted + 1, True) if len(targets) > drafted else (len(targets) + 1, False)
    if step.cut or final:
        return min(gain, step.kept), exact or gain >= step.kept
    return gain, exact


# ----------------------------------------------------------------------------------------------------------
# Acceptance over a session
# ----------------------------------------------------------------------------------------------------------


def accepted_drafts(step: StepRecord) -> int:
    return len(step.accepted) - 1


def tree_depth(step: StepRecord) -> int | None:
    """The deepest node of the round's tree; None when nodes were not recorded."""
    return _per_round("depth", step, lambda s: max(n.depth for n in s.nodes) if s.nodes else None)


def _block_depths(steps: Sequence[StepRecord], block_size: int | None) -> int:
    """Drafted depths: block_size - 1, or (unknown) the deepest tree / accepted path seen."""
    if block_size is not None:
        return int(block_size) - 1
    deepest = [tree_depth(s) if tree_depth(s) is not None else accepted_drafts(s) for s in steps]
    return max(deepest, default=0)


def acceptance_histogram(steps: Sequence[StepRecord], block_size: int | None = None) -> list[int]:
    """Item n = rounds that kept n + 1 tokens (n accepted drafts and the bonus), n = 0..block_size-1 (default: up
    to the deepest tree seen). A round cut by max new tokens or the end of text counts what it kept, as every
    acceptance figure does, so the histogram's mean is the headline's tokens per round (issue #64: it counted the
    uncut walk, 3.37 where the headline said 3.06)."""
    n = max(_block_depths(steps, block_size), max((accepted_drafts(s) for s in steps), default=0))
    hist = [0] * (n + 1)
    for s in steps:
        hist[s.kept - 1] += 1
    return hist


def per_depth_counts(steps: Sequence[StepRecord], block_size: int | None = None) -> list[tuple[int, int]]:
    """Item d-1 = (rounds with accepted drafts >= d, rounds with accepted drafts >= d-1 and a tree at least d
    deep), d = 1..block_size-1. A round whose nodes were not recorded (tree depth unknown) counts as deep
    enough. Each round's depth is found once (not once per d)."""
    rounds = [(accepted_drafts(s), tree_depth(s)) for s in steps]
    out = []
    for d in range(1, _block_depths(steps, block_size) + 1):
        passed = reached = 0
        for drafts, depth in rounds:
            if drafts >= d - 1 and (depth is None or depth >= d):
                reached += 1
                passed += drafts >= d
        out.append((passed, reached))
    return out


def per_depth_acceptance(steps: Sequence[StepRecord], block_size: int | None = None) -> list[float | None]:
    """Item d-1 = P(accepted drafts >= d | accepted drafts >= d-1, tree depth >= d) over the rounds, d =
    1..block_size-1; None where no round reached depth d."""
    return [p / r if r else None for p, r in per_depth_counts(steps, block_size)]


def session_analysis(steps: Sequence[StepRecord], block_size: int | None = None,
                     budget: int | None = None) -> dict[str, Any]:
    """The session's figures as plain data (JSON-ready: string keys): acceptance_histogram, per_depth_acceptance
    (with per_depth_counts), budget_curve (summed) and its caveat, and whether every round verified exactly."""
    return {
        "acceptance_histogram": acceptance_histogram(steps, block_size),
        "per_depth_acceptance": per_depth_acceptance(steps, block_size),
        "per_depth_counts": [list(c) for c in per_depth_counts(steps, block_size)],
        "budget_curve": {str(b): v for b, v in session_budget_curve(steps, budget).items()},
        "budget_curve_exact": all(curve_is_exact(s) for s in steps),
        "budget_curve_caveat": curve_caveat(steps[0].method if steps else "ddtree"),
    }


# ----------------------------------------------------------------------------------------------------------
# Why did this round stop there?
# ----------------------------------------------------------------------------------------------------------


def draft_row(step: StepRecord, depth: int) -> list[tuple[int, float]]:
    """The drafter's recorded candidates at `depth` (1-based) as (token id, log-prob), best first; [] when the
    grid was not recorded or the depth is past the drafted block."""
    if 1 <= depth <= len(step.draft_top_ids):
        return list(zip(step.draft_top_ids[depth - 1], step.draft_top_logprobs[depth - 1]))
    return []


def draft_rank(step: StepRecord, depth: int, token_id: int) -> int | None:
    """The token's rank among the drafter's candidates at `depth` (1-based): in the recorded grid, else among the
    tree's nodes at that depth (ranks are per depth); None when it is not among them."""
    for rank, (tid, _) in enumerate(draft_row(step, depth)):
        if tid == token_id:
            return rank
    if not step.draft_top_ids:
        for n in step.nodes:
            if n.depth == depth and n.token_id == token_id:
                return n.rank
    return None


def target_top(step: StepRecord, position: int) -> list[tuple[int, float]]:
    """The target's recorded top-k at a tree position as (token id, probability), best first ([] if absent).
    Probabilities are under softmax(logits) when greedy, under the filtered tempered distribution when sampling."""
    if 0 <= position < len(step.target_top_ids):
        return list(zip(step.target_top_ids[position], step.target_top_probs[position]))
    return []


def children(step: StepRecord, position: int) -> list[int]:
    """Tree positions whose parent is `position`, by drafter rank."""
    kids = [n for n in step.nodes if n.parent == position]
    return [n.id for n in sorted(kids, key=lambda n: (n.rank, n.id))]


def stop_info(step: StepRecord, block_size: int | None = None) -> dict[str, Any]:
    """Where the walk stopped and why, at depth = len(accepted) (the depth of the bonus token).

    depth; last_accepted (tree position); target_token_id (the target's choice there: the bonus); target_prob
    (its probability in the target's recorded top-k at the last accepted node, else the sampled probability,
    else None); drafter_top_id / drafter_top_logprob (the drafter's rank-0 candidate at that depth; None past the
    block or when unknown); target_draft_rank: the target's token among the drafter's candidates at that depth
    (the recorded grid, else the tree's nodes there), 'not drafted' when not among them, None past the block;
    target_draft_logprob (from the grid, else `bonus_draft_logprob`); target_vocab_rank (`bonus_draft_rank`: its
    rank in the drafter's whole distribution there, when recorded); siblings (the children of the last accepted
    node, by rank: what the tree did try there) and sibling_rank (the target's token among them: None for an
    exact walk, which would have gone on); elsewhere (a position at that depth holding the target's token under
    another parent, or None); reason: 'block end' (every drafted depth accepted), 'tree ended' (the last accepted
    node is a leaf), 'drafted, not taken' (a candidate at this depth the tree did not take here) or 'not
    drafted'. `block_size` tells 'block end' apart when the grid was not recorded."""
    depth = len(step.accepted)
    last = step.accepted[-1]
    target = step.bonus_token_id
    row = draft_row(step, depth)
    kids = children(step, last)
    sib_tokens = [step.nodes[k].token_id for k in kids]
    elsewhere = next((n.id for n in step.nodes if n.depth == depth and n.token_id == target and n.parent != last),
                     None)
    drafted = len(step.draft_top_ids) if step.draft_top_ids else (None if block_size is None else block_size - 1)
    past_block = drafted is not None and depth > drafted
    if row:
        top_id, top_lp = row[0]
    else:
        tops = [n for n in step.nodes if n.depth == depth and n.rank == 0]
        top_id, top_lp = (tops[0].token_id, tops[0].logprob) if tops else (None, None)
    rank = None if past_block else draft_rank(step, depth, target)
    logprob = dict(row).get(target)
    if logprob is None and not past_block:
        logprob = step.bonus_draft_logprob
    prob = dict(target_top(step, last)).get(target)
    if prob is None and len(step.target_prob) == tree_size(step):
        prob = step.target_prob[last]
    if past_block:
        reason = STOP_BLOCK_END
    elif not kids:
        reason = STOP_TREE_ENDED
    elif rank is None:
        reason = STOP_NOT_DRAFTED
    else:
        reason = STOP_NOT_TAKEN
    return {
        "depth": depth, "last_accepted": last, "target_token_id": target, "target_prob": prob,
        "drafter_top_id": top_id, "drafter_top_logprob": top_lp,
        "target_draft_rank": None if past_block else (NOT_DRAFTED if rank is None else rank),
        "target_draft_logprob": logprob, "target_vocab_rank": None if past_block else step.bonus_draft_rank,
        "siblings": kids, "sibling_rank": sib_tokens.index(target) if target in sib_tokens else None,
        "elsewhere": elsewhere, "reason": reason,
    }


class RoundIndex:
    """A round's tree indexed once: parents, children by drafter rank (and where each token first appears among
    them), and where each token first appears at each depth. node_info over every node of a round (the JSON
    export) uses one, so it stays linear in the tree instead of scanning it once per node."""

    def __init__(self, step: StepRecord):
        self.parents = [n.parent for n in step.nodes]
        kids: dict[int, list] = {}
        for n in step.nodes:
            kids.setdefault(n.parent, []).append(n)
        self.children = {p: [n.id for n in sorted(ns, key=lambda n: (n.rank, n.id))] for p, ns in kids.items()}
        self.child_rank: dict[int, dict[int, int]] = {}  # parent -> token -> its first index among the children
        for p, ids in self.children.items():
            ranks = self.child_rank[p] = {}
            for i, c in enumerate(ids):
                ranks.setdefault(step.nodes[c].token_id, i)
        self.draft_ranks: dict[int, dict[int, int]] = {}  # depth -> token -> draft_rank
        if step.draft_top_ids:
            for d, row in enumerate(step.draft_top_ids, start=1):
                ranks = self.draft_ranks[d] = {}
                for r, tid in enumerate(row):
                    ranks.setdefault(tid, r)
        else:
            for n in step.nodes:
                self.draft_ranks.setdefault(n.depth, {}).setdefault(n.token_id, n.rank)


def node_info(step: StepRecord, position: int, index: RoundIndex | None = None) -> dict[str, Any]:
    """One tree node as the inspector shows it.

    id, depth, token_id, path (tree positions root..node) and path_token_ids; accepted (on the accepted path);
    draft_rank / draft_logprob (this node at its depth); draft_top: the drafter's candidates at its depth
    [(id, log-prob)]; target_top: the target's top-k at the parent [(id, prob)] (what the target wanted after
    the node's path minus itself; [] for the root); target_prob_of_node: this token's probability there (None if
    outside the recorded top-k); target_choice_at_parent: the target's choice after the parent (the token the
    walk wanted here); node_is_choice; choice_sibling_rank: the rank (by drafter) of the target's choice among
    this node's siblings and itself, or None when the tree holds no sibling with it ('not drafted' under this
    parent); choice_draft_rank (its rank among the drafter's candidates at this depth, or 'not drafted');
    target_margin_at_parent (the target's top-1 minus top-2 logit there, when recorded); target_top_here /
    target_choice_here / target_margin_here: the same at the node itself (what the target wants next). `index`: the
    round's RoundIndex, when asking for many nodes of one round."""
    n = tree_size(step)
    if not 0 <= position < len(step.nodes):
        raise ValueError(f"node {position} is not in this round's tree (0..{len(step.nodes) - 1})")
    index = index or RoundIndex(step)
    node = step.nodes[position]
    choices = step.choices
    path = treeops.path_to(index.parents, position)
    info: dict[str, Any] = {
        "id": position, "depth": node.depth, "token_id": node.token_id, "token": node.token,
        "path": path, "path_token_ids": [step.nodes[p].token_id for p in path],
        "accepted": position in step.accepted, "draft_rank": node.rank, "draft_logprob": node.logprob,
        "draft_top": draft_row(step, node.depth) if node.depth else [],
        "target_top_here": target_top(step, position),
        "target_choice_here": choices[position] if position < n else None,
        "target_margin_here": _margin(step, position),
        "target_top": [], "target_prob_of_node": None, "target_choice_at_parent": None, "node_is_choice": None,
        "choice_sibling_rank": None, "choice_draft_rank": None, "target_margin_at_parent": None, "selector_siblings": [],
        # a selector round (DFlash2): the node's unary score and its pair score after its parent's token
        "selector_unary": step.selector_unary[position] if len(step.selector_unary) == len(step.nodes) else None,
        "selector_pair": step.selector_pair[position] if len(step.selector_pair) == len(step.nodes) else None,
    }
    if node.parent < 0:
        return info
    parent = node.parent
    want = choices[parent]
    top = target_top(step, parent)
    rank = index.draft_ranks.get(node.depth, {}).get(want)
    info.update(
        target_top=top, target_prob_of_node=dict(top).get(node.token_id), target_choice_at_parent=want,
        node_is_choice=want == node.token_id,
        choice_sibling_rank=index.child_rank.get(parent, {}).get(want),
        choice_draft_rank=NOT_DRAFTED if rank is None else rank, target_margin_at_parent=_margin(step, parent),
        selector_siblings=_selector_siblings(step, index, parent),
    )
    return info


def _selector_siblings(step: StepRecord, index: RoundIndex, parent: int) -> list[tuple[int, float]]:
    """A selector round: the pair scores from the parent, [(token id, S_t(parent's token, b))] for its children in
    the tree (the node and its siblings), best first; [] in other rounds."""
    if len(step.selector_pair) != len(step.nodes):
        return []
    kids = index.children.get(parent, [])
    return sorted(((step.nodes[c].token_id, step.selector_pair[c]) for c in kids), key=lambda t: -t[1])


def _margin(step: StepRecord, position: int) -> float | None:
    return step.target_margin[position] if len(step.target_margin) == tree_size(step) else None


# ----------------------------------------------------------------------------------------------------------
# Two configurations side by side
# ----------------------------------------------------------------------------------------------------------


def first_divergence(output: Sequence[int], reference: Sequence[int]) -> int | None:
    """Index of the first token where two outputs differ (or where the shorter one ends), None when identical."""
    for i, (a, b) in enumerate(zip(output, reference)):
        if a != b:
            return i
    return None if len(output) == len(reference) else min(len(output), len(reference))


COMPARED_SETTINGS = ("budget", "block_size", "method", "verify", "engine", "dtype", "device", "max_new_tokens",
                     "temperature", "top_k", "top_p", "seed", "tree_scoring", "drafter_family")


def compare_outputs(a, b) -> dict[str, Any]:
    """Two traces (trace.Trace) of the same prompt side by side: part_at (first output token both have and differ
    at, None when they agree so far: a live session may be ahead of the other, and both stop at the same max new
    tokens), a_token_id / b_token_id there; agree_upto (tokens compared); per side its verdict against its
    own reference (identical: True / False / None when not recorded; first_divergence), rounds, mean acceptance
    and tokens generated; settings_diff {name: [a, b]} over the settings that differ."""
    common = min(len(a.output_ids), len(b.output_ids))
    part = first_divergence(a.output_ids[:common], b.output_ids[:common])

    def at(ids, i):
        return ids[i] if i is not None and i < len(ids) else None

    def side(t) -> dict[str, Any]:
        acc = [s.kept for s in t.steps]
        return {"identical": t.identical, "invalid": t.invalid,
                "first_divergence": t.first_divergence, "rounds": len(t.steps), "tokens": len(t.output_ids),
                "mean_acceptance": sum(acc) / len(acc) if acc else None,
                "pending": bool(getattr(t, "reference_pending", False)),  # the reference is still decoding
                "checked": len(t.greedy_ids) if t.greedy_ids is not None else 0}

    diff = {k: [a.settings.get(k), b.settings.get(k)] for k in COMPARED_SETTINGS
            if a.settings.get(k) != b.settings.get(k)}
    return {"part_at": part, "a_token_id": at(a.output_ids, part), "b_token_id": at(b.output_ids, part),
            "agree_upto": common if part is None else part, "same_prompt": a.prompt_ids == b.prompt_ids, "a": side(a), "b": side(b), "settings_diff": diff}


def config_label(settings: Mapping[str, Any]) -> str:
    """A configuration in a few words: 'DDTree budget 32, block 16, exact' / 'DFlash chain, block 16, naive' /
    'DDTree budget 32 (selector scoring), block 8, exact, dflash2 drafter'."""
    method = settings.get("method", "ddtree")
    head = {DFLASH: "DFlash chain", "dflash2": "DFlash2 chain"}.get(method, f"DDTree budget {settings.get('budget', '?')}")
    scoring = settings.get("tree_scoring", MARGINAL)
    if method not in CHAINS and scoring != MARGINAL:
        head += f" ({scoring} scoring)"
    parts = [head, f"block {settings.get('block_size', '?')}", str(settings.get("verify", "exact"))]
    if settings.get("drafter_family", DFLASH) != DFLASH and method != "dflash2":  # (that chain's head names it)
        parts.append(f"{settings['drafter_family']} drafter")
    if settings.get("engine") not in (None, "transformers"):
        parts.append(f"{settings['engine']} engine")
    if settings.get("dtype") not in (None, "float32"):
        parts.append(str(settings["dtype"]))
    return ", ".join(parts)


# ----------------------------------------------------------------------------------------------------------
# Two precisions of the same pair (analyze --target-b / --draft-b / --dtype-b)
# ----------------------------------------------------------------------------------------------------------

# Mean acceptance (tokens kept per round, bonus included) at or below this: the drafter proposes (almost) nothing
# the target accepts, every round gains only the target's own token: the silent failure of a quantized drafter.
NO_ACCEPTANCE = 1.05


def acceptance_warning(mean_acceptance: float | None, rounds: int = 0, who: str = "") -> str | None:
    """The loud warning for a mean acceptance of about 1.0 (None when there is none to give)."""
    if mean_acceptance is None or rounds < 1 or mean_acceptance > NO_ACCEPTANCE:
        return None
    return (f"{who + ': ' if who else ''}mean acceptance {mean_acceptance:.2f} tokens per round over "
            f"{plural(rounds, 'round')}: "
            "the drafter proposes almost nothing the target accepts, so speculative decoding gains nothing (a drafter "
            "trained for another target or precision, or one whose weights did not load as meant)")


def output_margin(trace, k: int) -> float | None:
    """The target's top-1 minus top-2 logit where it chose output token k (a round's verify pass; None for the first
    token, which the prefill chose, and past where the output left the target's greedy)."""
    if trace.first_divergence is not None and k >= trace.first_divergence:
        return trace.divergence_margin if k == trace.first_divergence else None
    start = len(trace.prompt_ids)
    for step in trace.steps:
        j = k - 1 - (step.committed_len - start)  # the accepted path's j-th node chose output token k
        if 0 <= j < len(step.accepted):
            return _margin(step, step.accepted[j])
    return None


def greedy_part(a, b) -> dict[str, Any]:
    """Where two targets' greedy decodings of the same prompt part (traces a and b, their greedy references, else
    their outputs): the output index (None when they agree over the tokens both have), each side's token there and
    its target's margin there (a small margin: a near-tie the precision tipped)."""
    ids_a, ids_b = a.greedy_ids or a.output_ids, b.greedy_ids or b.output_ids
    common = min(len(ids_a), len(ids_b))
    part = first_divergence(ids_a[:common], ids_b[:common])
    return {"part_at": part, "compared": common if part is None else part,
            "a_token_id": None if part is None else ids_a[part], "b_token_id": None if part is None else ids_b[part],
            "a_margin": None if part is None else output_margin(a, part),
            "b_margin": None if part is None else output_margin(b, part)}


def decode_tok_s(traces) -> float | None:
    """Tokens per second of the decodes: generated tokens over the engine's time (prefill and rounds; the greedy
    reference's time left out), summed over the traces."""
    tokens = sum(len(t.output_ids) for t in traces)
    ms = sum(t.prefill_ms + sum(sum(s.timings_ms.values()) for s in t.steps) for t in traces)
    return tokens / ms * 1e3 if ms > 0 else None
