"""DDTree's best-first tree in one Triton program (issue #31 item 1): naive.py's heap loop, run where the drafter's
log-probs are, node for node its nodes (ties included).

beam.tree_on_device builds the same tree by tensor ops, a stable sort a depth: in a CUDA graph about 350 small
kernels, 1.8 ms at budget 64 on an H200 (docs/lab/NOTEBOOK.md section 14), where the host's heap takes ~0.1 ms. Here
one program runs the heap's loop itself: the frontier (the heap's entries) sits in registers, F slots of score,
parent's score, parent, depth, rank and rank path; each of the n - 1 pops takes the best entry (score descending,
then the rank path ascending, a prefix before its extensions: naive.py's order), writes its node, puts its next
sibling in its slot and its first child in a free one. A rank path is held as DP digits (rank + 1 a depth, 0 past
its end), so comparing two digit rows in order is comparing naive.py's integers; the digits are looked at only
when the best score is tied. Scores are float64 sums from the root down, as naive.py's (a child's is its parent's
plus its own log-prob, a sibling's its parent's plus the sibling's).

n = 1 + min(budget, number of rank paths) follows from the sizes alone, so one launch serves every tree of a shape
and a CUDA graph replays it. Budgets up to MAX_BUDGET (the frontier's registers); larger ones take tree_on_device.
Shapes: top_logprobs [depth_limit, k] (each row sorted descending); returns parents, depths, ranks [n] int64 and
log-probs [n] float64, root first (parent -1, depth 0, rank -1, log-prob 0), as tree_on_device.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_BUDGET = 256  # the frontier's slots (the next power of two above the node count) held in one program's registers


@triton.jit
def _best_first_kernel(lp_ptr, parents_ptr, depths_ptr, ranks_ptr, lps_ptr, n, D, W, s_lp,
                       F: tl.constexpr, DP: tl.constexpr):
    slot = tl.arange(0, F)
    digit = tl.arange(0, DP)
    valid = slot == 0  # the heap's first entry: depth 1, rank 0
    score = tl.where(valid, tl.load(lp_ptr).to(tl.float64), 0.0)
    above = tl.zeros([F], dtype=tl.float64)  # the parent's score
    parent = tl.zeros([F], dtype=tl.int32)
    depth = tl.where(valid, 1, 0)
    rank = tl.zeros([F], dtype=tl.int32)
    path = tl.where(valid[:, None] & (digit[None, :] == 0), 1, 0)  # rank + 1 a depth, 0 past the path's end
    tl.store(parents_ptr, -1)
    tl.store(depths_ptr, 0)
    tl.store(ranks_ptr, -1)
    tl.store(lps_ptr, tl.zeros([], dtype=tl.float64))
    for i in range(1, n):
        best = tl.max(tl.where(valid, score, float("-inf")), 0)
        cand = valid & (score == best)
        # none equal to the best: NaN scores (a drafter's NaN log-probs, or NaN sums), which no comparison picks.
        # Then every entry is a candidate and the rank path decides, so the popped entry is a real one (never the
        # depth 0 of no entry, whose log-prob would be read a row before the tensor)
        cand = tl.where(tl.sum(cand.to(tl.int32), 0) == 0, valid, cand)
        if tl.sum(cand.to(tl.int32), 0) > 1:  # a tie: the smaller rank path, digit by digit
            for d in tl.static_range(DP):
                col = tl.sum(tl.where(digit[None, :] == d, path, 0), 1)
                cand = cand & (col == tl.min(tl.where(cand, col, 1 << 30), 0))
        sel = slot == tl.max(tl.where(cand, slot, -1), 0)
        s = tl.sum(tl.where(sel, score, 0.0), 0)
        a = tl.sum(tl.where(sel, above, 0.0), 0)
        dep = tl.sum(tl.where(sel, depth, 0), 0)
        r = tl.sum(tl.where(sel, rank, 0), 0)
        row = tl.sum(tl.where(sel[:, None], path, 0), 0)  # [DP]
        tl.store(parents_ptr + i, tl.sum(tl.where(sel, parent, 0), 0).to(tl.int64))
        tl.store(depths_ptr + i, dep.to(tl.int64))
        tl.store(ranks_ptr + i, r.to(tl.int64))
        tl.store(lps_ptr + i, tl.load(lp_ptr + (dep - 1) * s_lp + r).to(tl.float64))
        # the next sibling takes the popped entry's slot (same parent, parent's score and depth)
        sibling = r + 1 < W
        nxt = tl.load(lp_ptr + (dep - 1) * s_lp + r + 1, mask=sibling, other=0.0).to(tl.float64)
        valid = tl.where(sel, sibling, valid)
        score = tl.where(sel, a + nxt, score)
        rank = tl.where(sel, r + 1, rank)
        path = tl.where(sel[:, None], (row + (digit == dep - 1).to(tl.int32))[None, :], path)
        # the first child, in the first free slot
        free = slot == tl.min(tl.where(valid, F, slot), 0)
        child = free & (dep < D)
        first = tl.load(lp_ptr + dep * s_lp, mask=dep < D, other=0.0).to(tl.float64)
        valid = valid | child
        score = tl.where(child, s + first, score)
        above = tl.where(child, s, above)
        parent = tl.where(child, i, parent)
        depth = tl.where(child, dep + 1, depth)
        rank = tl.where(child, 0, rank)
        path = tl.where(child[:, None], (row + (digit == dep).to(tl.int32))[None, :], path)


def node_count(depth_limit: int, k: int, budget: int) -> int:
    """1 + min(budget, the rank paths of up to depth_limit ranks among min(k, budget)): the tree's size."""
    width, paths, level = min(k, budget), 0, 1
    for _ in range(depth_limit):
        level *= width
        paths += level
        if paths >= budget:
            break
    return 1 + min(budget, paths)


def best_first_triton(top_logprobs: torch.Tensor, budget: int, warps: int | None = None) -> tuple[torch.Tensor, ...]:
    """tree_on_device's nodes (parents, depths, ranks, log-probs; root first) by the heap's loop in one program.
    top_logprobs [depth_limit, k] on a device Triton runs on (or CPU tensors in its interpreter), each row sorted
    descending; 1 <= budget <= MAX_BUDGET and both sizes at least 1. `warps`: the program's (default 1 up to 128
    frontier slots, else 4: each pop's reductions cross the warps; gpu_bench's best_first_warps on an H200, µs a call
    at 1 / 2 / 4 / 8 warps: budget 64 82 / 99 / 97 / 105, budget 128 396 / 265 / 216 / 242)."""
    depth_limit, k = top_logprobs.shape
    if not (1 <= budget <= MAX_BUDGET and depth_limit >= 1 and k >= 1):
        raise ValueError(f"best_first_triton: budget {budget} (1 to {MAX_BUDGET}), log-probs {tuple(top_logprobs.shape)}")
    lp = top_logprobs if top_logprobs.stride(-1) == 1 else top_logprobs.contiguous()
    n = node_count(depth_limit, k, budget)
    dev = lp.device
    parents, depths, ranks = (torch.empty(n, dtype=torch.long, device=dev) for _ in range(3))
    lps = torch.empty(n, dtype=torch.float64, device=dev)
    F = triton.next_power_of_2(n)
    _best_first_kernel[(1,)](lp, parents, depths, ranks, lps, n, depth_limit, min(k, budget), lp.stride(0),
                             F=F, DP=triton.next_power_of_2(depth_limit),
                             num_warps=warps or (1 if F <= 128 else 4))
    return parents, depths, ranks, lps
