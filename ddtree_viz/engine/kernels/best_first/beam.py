"""DDTree's best-first tree by tensor ops where the drafter's log-probs are (no value read back to the host): one
stable sort by score a depth over beams kept in rank-path order, the kept nodes in preorder. About 350 small kernels,
1.8 ms at budget 64 in a CUDA graph on an H200 (docs/lab/NOTEBOOK.md section 14): the form a device runs where the
one-program kernel (triton_best_first.py) does not (no Triton; budgets past its MAX_BUDGET). Node for node
naive.best_first_nodes', ties included.
"""

from __future__ import annotations

import torch


def tree_on_device(top_logprobs: torch.Tensor, budget: int) -> tuple[torch.Tensor, ...]:
    """naive.best_first_nodes' nodes computed by tensor ops where the log-probs are (no value read back to the
    host): parents, depths, ranks [n] (int64) and log-probs [n] (float64), root first, node for node the heap loop's,
    ties included.

    top_logprobs [depth_limit, k], each row sorted descending. The budget's best prefixes are found depth by depth: the
    best `budget` paths of length d extend the best `budget` of length d - 1 (a path whose prefix is not among those
    is beaten by `budget` paths that each extend a better prefix by rank 0). Order everywhere: score descending, then
    the rank path ascending (a prefix before its extensions), as the heap loop pops; a score is the parent's
    plus the node's log-prob in float64, as the heap loop sums it. n = 1 + min(budget, number of paths): shapes follow
    from the sizes alone.

    Two invariants make that one stable sort by score a depth, and one at the end: a depth's beam is kept in rank-path
    order, so its extensions (beam entry, rank) are made in rank-path order too and a stable sort by score breaks
    ties the right way; and every kept node sits in one array in preorder (a prefix before its extensions, siblings
    by rank), where a new depth's nodes are inserted by arithmetic alone: the j-th new node in rank-path order, child
    of the node at p, lands at p + 1 + j, and an old node at q moves up by the new nodes whose parents precede it."""
    device = top_logprobs.device
    depth_limit, k = top_logprobs.shape
    if budget <= 0 or depth_limit == 0 or k == 0:
        nodes = torch.empty(0, dtype=torch.long, device=device)
        return _with_root(nodes, nodes, nodes, nodes.to(torch.float64))
    width = min(k, budget)  # a node of rank r follows its r better siblings: ranks >= budget never make it
    lp = top_logprobs[:, :width].to(torch.float64)
    beam_score = torch.zeros(1, dtype=torch.float64, device=device)  # the root, at position -1
    beam_at = torch.full((1,), -1, dtype=torch.long, device=device)
    score = torch.empty(0, dtype=torch.float64, device=device)  # the kept nodes in preorder: score, parent's position,
    parent, depth, rank = (torch.empty(0, dtype=torch.long, device=device) for _ in range(3))  # depth, rank
    for d in range(1, depth_limit + 1):
        extended = (beam_score[:, None] + lp[d - 1][None, :]).reshape(-1)  # (beam entry, rank): rank-path order
        keep = torch.sort(-extended, stable=True).indices[:budget]
        chosen = torch.zeros_like(extended, dtype=torch.long).index_fill_(0, keep, 1)
        kept = torch.empty_like(keep).scatter_(0, chosen.cumsum(0)[keep] - 1, keep)  # keep, in rank-path order
        above = beam_at[kept // width]  # each new node's parent's position (-1: the root)
        n, c = score.shape[0], kept.shape[0]
        moved = torch.arange(n, device=device)
        if n:  # an old node moves up by the new nodes whose parents precede it
            children = torch.zeros(n, dtype=torch.long, device=device).scatter_add_(0, above, torch.ones_like(above))
            moved = moved + children.cumsum(0) - children
        placed = above + 1 + torch.arange(c, device=device)

        def remap(at: torch.Tensor) -> torch.Tensor:  # old positions to new ones (-1, the root, stays)
            return torch.where(at >= 0, moved[at.clamp(min=0)], -1) if n else at

        score = torch.empty(n + c, dtype=torch.float64, device=device).index_copy_(0, moved, score)
        score.index_copy_(0, placed, extended[kept])
        parent = torch.empty(n + c, dtype=torch.long, device=device).index_copy_(0, moved, remap(parent))
        parent.index_copy_(0, placed, remap(above))
        depth = torch.empty_like(parent).index_copy_(0, moved, depth).index_copy_(0, placed, torch.full_like(kept, d))
        rank = torch.empty_like(parent).index_copy_(0, moved, rank).index_copy_(0, placed, kept % width)
        beam_score, beam_at = extended[kept], placed
    order = torch.sort(-score, stable=True).indices[:budget]  # preorder breaks the ties: the heap loop's pops
    position = torch.zeros(score.shape[0] + 1, dtype=torch.long, device=device)  # index -1 (the root's) -> 0
    position[order] = torch.arange(1, order.shape[0] + 1, device=device)
    return _with_root(position[parent[order]], depth[order], rank[order], lp[depth[order] - 1, rank[order]])


def _with_root(parents: torch.Tensor, depths: torch.Tensor, ranks: torch.Tensor, logprobs: torch.Tensor) -> tuple:
    """The nodes' fields with the root's entry (parent -1, depth 0, rank -1, log-prob 0) put first."""
    return tuple(torch.cat([torch.full((1,), value, dtype=t.dtype, device=t.device), t])
                 for value, t in ((-1, parents), (0, depths), (-1, ranks), (0.0, logprobs)))
