"""DDTree's best-first tree, the reference: the heap loop on the host (engine/tree.py's build_tree wraps it into a
DraftTree; the form every records-on round uses). Popping a node adds it and pushes its next-rank sibling and its
rank-0 child, so the first `budget` pops are the `budget` highest-scoring prefixes (a node's score: the sum of the
log-probs along its path; ties broken by the rank path, as in the reference code). beam.py and triton_best_first.py
build the same nodes where the log-probs are, node for node, ties included (tests/test_tree.py,
tests/test_best_first_kernel.py).
"""

from __future__ import annotations

import heapq

import numpy as np


def best_first_nodes(top_logprobs: np.ndarray, budget: int) -> tuple[list[int], list[int], list[int], list[float]]:
    """The tree's nodes over per-depth candidates, root first: (parents, depths, ranks, log-probs), the root's entry
    (-1, 0, -1, 0.0). top_logprobs [depth_limit, k], each row sorted by descending log-prob (row d holds the
    drafter's candidates for depth d+1)."""
    depth_limit, k = top_logprobs.shape
    parents, depths, ranks, logprobs = [-1], [0], [-1], [0.0]
    if budget <= 0 or depth_limit == 0 or k == 0:
        return parents, depths, ranks, logprobs
    # Python floats (an exact conversion): the loop below runs once per node on the host every round, and numpy
    # scalars cost several times a float's indexing and arithmetic
    lp = np.asarray(top_logprobs, dtype=np.float64).tolist()
    push, pop = heapq.heappush, heapq.heappop
    # entries: (-score, rank path, parent position, depth, rank, parent's score); ties on the score go to the smaller
    # rank path. A node's score is its parent's plus its own log-prob, summed from the root down (what beam.py
    # computes too, bit for bit). The rank path (r1, .., rd) is held as one integer that orders as the tuples do, a
    # prefix before its extensions: the sum of (r_i + 1) * unit[i] with unit[i] = (k + 1) ** (depth_limit - i), so a
    # sibling adds unit[d] and a first child unit[d + 1] (no tuples made per node)
    unit = [(k + 1) ** (depth_limit - i) for i in range(depth_limit + 1)]
    heap = [(-lp[0][0], unit[1], 0, 1, 0, 0.0)]
    while heap and len(parents) <= budget:
        neg, rank_path, parent, depth, rank, above = pop(heap)
        row = lp[depth - 1]
        pos = len(parents)
        parents.append(parent)
        depths.append(depth)
        ranks.append(rank)
        logprobs.append(row[rank])
        if rank + 1 < k:
            push(heap, (-(above + row[rank + 1]), rank_path + unit[depth], parent, depth, rank + 1, above))
        if depth < depth_limit:
            push(heap, (neg - lp[depth][0], rank_path + unit[depth + 1], pos, depth + 1, 0, -neg))
    return parents, depths, ranks, logprobs
