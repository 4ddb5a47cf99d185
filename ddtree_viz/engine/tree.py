"""The draft tree: best-first construction under a node budget, the verify mask, the acceptance walk.

Positions are numbered in the order nodes join the tree, root first, so every parent precedes its
children (the tree-exact Gated DeltaNet relies on that: its ancestor matrix is lower triangular).
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, replace

import numpy as np
import torch

from .. import treeops
from .kernels.best_first.beam import tree_on_device  # noqa: F401 (the tree's nodes by tensor ops)
from .kernels.best_first.dispatch import device_tree_nodes
from .kernels.best_first.naive import best_first_nodes
from .kernels.device import device_error


@dataclass(frozen=True)
class DraftTree:
    """Tree positions 0..T-1; position 0 is the root (the last committed, not yet cached, token)."""

    token_ids: tuple[int, ...]
    parents: tuple[int, ...]  # -1 for the root
    depths: tuple[int, ...]
    ranks: tuple[int, ...]  # candidate rank at its depth; -1 for the root
    logprobs: tuple[float, ...]  # drafter log-prob of the token at its depth; 0.0 for the root

    def __len__(self) -> int:
        return len(self.token_ids)

    def path_to(self, pos: int) -> list[int]:
        """Positions from the root to `pos`, both included."""
        return treeops.path_to(self.parents, pos)

    def ancestors(self) -> np.ndarray:
        """[T, T] bool ancestor-or-self matrix (the tree part of the verify mask)."""
        return treeops.ancestor_matrix(self.parents)

    @classmethod
    def from_logprobs(cls, root_token_id: int, logprobs: torch.Tensor, budget: int,
                      on_device: bool = False, before_wait=None) -> "DraftTree":
        """DDTree's best-first tree from the drafter's per-depth log-probs [depths, vocab] (any device): built on the
        host (build_tree), or with on_device where the log-probs are (tree_on_device; the same tree) and copied once.
        `before_wait` (host build): called once the top-k's copies to the host are queued, before the wait (to_host)."""
        if on_device:
            return DeviceTree.from_logprobs(root_token_id, logprobs, budget).to_host()
        values, ids = to_host(*torch.topk(logprobs, min(budget, logprobs.shape[-1]), dim=-1), before_wait=before_wait)
        return build_tree(root_token_id, values.numpy(), ids.numpy(), budget)

    @classmethod
    def chain_from_logprobs(cls, root_token_id: int, logprobs: torch.Tensor) -> "DraftTree":
        """DFlash's chain: the drafter's top-1 token at every depth."""
        top = logprobs.max(dim=-1)
        indices, values = to_host(top.indices, top.values)
        return build_chain(root_token_id, indices.tolist(), values.tolist())


@dataclass(frozen=True)
class DeviceTree:
    """A DraftTree's fields as tensors [n] where the drafter's log-probs are (tree_on_device's nodes, root first):
    what the runner's forward_tensors reads; nothing comes back to the host until `to_host`."""

    token_ids: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    ranks: torch.Tensor
    logprobs: torch.Tensor  # float64
    static: bool = False  # a graph's outputs (DeviceTreeBuilder's), rewritten in place by every build

    def __len__(self) -> int:
        return self.token_ids.shape[0]

    @classmethod
    def from_logprobs(cls, root_token_id: int | torch.Tensor, logprobs: torch.Tensor, budget: int,
                      kernel: bool | None = None) -> "DeviceTree":
        """DDTree's best-first tree (build_tree's, node for node) from the drafter's per-depth log-probs where they
        are: top-k per depth, the nodes (device_tree_nodes; `kernel` chooses how), each node's token gathered from
        the top-k. The root's token: an int, or a [1] tensor beside the log-probs (a graph's input)."""
        values, ids = torch.topk(logprobs, min(budget, logprobs.shape[-1]), dim=-1)
        parents, depths, ranks, lps = device_tree_nodes(values, budget, kernel)
        root = (root_token_id if isinstance(root_token_id, torch.Tensor)
                else torch.full((1,), int(root_token_id), dtype=torch.long, device=logprobs.device))
        return cls(torch.cat([root, ids[depths[1:] - 1, ranks[1:]]]), parents, depths, ranks, lps)

    def to_host(self) -> DraftTree:
        """The DraftTree, its fields copied to the host and waited for once."""
        fields = to_host(self.token_ids, self.parents, self.depths, self.ranks, self.logprobs)
        return DraftTree(*(tuple(t.tolist()) for t in fields))


class DeviceTreeBuilder:
    """DeviceTree.from_logprobs at one budget, captured as a CUDA graph per log-prob shape on a GPU: eagerly the
    build is hundreds of small kernels (docs/lab/NOTEBOOK.md section 14: 12 ms at budget 64 on an H200, 1.8 ms in the
    graph with the copy back), in a graph one launch. The log-probs and the root's token are copied into the
    graph's inputs; the tree's tensors are its outputs, valid until the next call. Off CUDA, or where the capture
    failed (`error` says why), it builds eagerly. tests/test_tree.py holds the graph's trees to build_tree's."""

    def __init__(self, budget: int, kernel: bool | None = None):
        self.budget, self.kernel = budget, kernel  # kernel: device_tree_nodes' choice
        self.key, self.graph, self.error = None, None, None
        # queue_host's two sets of pinned buffers and events (CUDA), taken in turn: a tree queued before the last
        # one is read (a session's verify ahead) copies into the set that one does not hold
        self._copies: list[tuple[list[torch.Tensor], torch.cuda.Event]] = []
        self.host_ms = 0.0  # the host's time in the last call (on CUDA its inputs' copies and the graph's launch)

    def __call__(self, root_token_id: int | torch.Tensor, logprobs: torch.Tensor) -> DeviceTree:
        """The tree from the log-probs [depths, vocab]; the root's token an int, or a one-element integer tensor
        where the log-probs are (a walk's bonus token not read yet: copied on the device)."""
        start = time.perf_counter()
        key = (tuple(logprobs.shape), logprobs.dtype, logprobs.device)
        if key != self.key and logprobs.device.type == "cuda" and self.error is None:
            self._capture(logprobs, key)
        root = root_token_id.reshape(1).long() if isinstance(root_token_id, torch.Tensor) else root_token_id
        if key != self.key:  # off CUDA, or the capture failed
            tree = DeviceTree.from_logprobs(root, logprobs, self.budget, self.kernel)
        else:
            self._logprobs.copy_(logprobs)
            if isinstance(root, torch.Tensor):
                self._root.copy_(root)
            else:
                self._root.fill_(int(root))
            self.graph.replay()
            tree = self.out
        self.host_ms = (time.perf_counter() - start) * 1e3
        return tree

    def queue_host(self, tree: DeviceTree):
        """The tree's copy to the host queued now (into pinned buffers of the builder's own on CUDA, an event after
        them): returns a function that waits for that event alone and gives the DraftTree. Queued before the
        verify, the copy is there when the walk's result is, so the host reads it without waiting for the commit
        queued behind it (DeviceTree.to_host waits for the whole stream). Two trees may be queued before the first
        is read (two sets of buffers, in turn); a third call reuses the first's."""
        fields = (tree.token_ids, tree.parents, tree.depths, tree.ranks, tree.logprobs)
        if not tree.token_ids.is_cuda:
            return tree.to_host
        if len(self._copies) < 2 or [p.shape for p in self._copies[0][0]] != [f.shape for f in fields]:
            self._copies = [([torch.empty(f.shape, dtype=f.dtype, pin_memory=True) for f in fields],
                             torch.cuda.Event()) for _ in range(2)]
        self._copies.reverse()  # the set the last call did not take
        pinned, event = self._copies[0]
        for buffer, field in zip(pinned, fields):
            buffer.copy_(field, non_blocking=True)
        event.record(torch.cuda.current_stream(tree.token_ids.device))  # the copies' stream

        def wait() -> DraftTree:
            event.synchronize()
            return DraftTree(*(tuple(p.tolist()) for p in pinned))

        return wait

    def _capture(self, logprobs: torch.Tensor, key) -> None:
        """The graph for this shape of log-probs, its warm-up and capture on this call's log-probs (a warm-up on
        uninitialised memory builds a tree from whatever bytes the allocator hands back: NaN scores). Where the
        capture cannot be made the builder builds eagerly (`error` says why); a device error is raised as it is."""
        self._logprobs = logprobs.clone()
        self._root = torch.zeros(1, dtype=torch.long, device=logprobs.device)
        try:
            stream = torch.cuda.Stream(logprobs.device)
            stream.wait_stream(torch.cuda.current_stream(logprobs.device))
            with torch.cuda.stream(stream):  # a warm-up run outside the capture
                DeviceTree.from_logprobs(self._root, self._logprobs, self.budget, self.kernel)
            torch.cuda.current_stream(logprobs.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = DeviceTree.from_logprobs(self._root, self._logprobs, self.budget, self.kernel)
            self.out = replace(out, static=True)
            self.key, self.graph = key, graph
        except Exception as exc:  # the eager build from here on (the reason kept), unless the device failed
            if device_error(exc):
                raise
            self.error = f"{type(exc).__name__}: {exc}"


def to_host(*tensors: torch.Tensor, before_wait=None) -> tuple[torch.Tensor, ...]:
    """CPU copies of tensors on one device, waited for once: on CUDA the copies are queued into pinned memory and
    the stream synchronised once (a .cpu() per tensor waits once each); elsewhere the tensors as they are.
    `before_wait()`, if given, runs between the copies' queueing (their pinned buffers taken) and the wait."""
    cuda = bool(tensors) and tensors[0].device.type == "cuda"
    out = tuple(t.to("cpu", non_blocking=True) if cuda else t.cpu() for t in tensors)
    if before_wait is not None:
        before_wait()
    if cuda:
        torch.cuda.current_stream(tensors[0].device).synchronize()
    return out


def build_tree(root_token_id: int, top_logprobs: np.ndarray, top_token_ids: np.ndarray, budget: int) -> DraftTree:
    """DDTree's best-first tree over per-depth candidates (kernels/best_first/naive.py's heap loop on the host).

    top_logprobs / top_token_ids: [depth_limit, k], each row sorted by descending log-prob (row d holds the
    drafter's candidates for depth d+1). A node's score is the sum of the log-probs along its path. Popping a
    node adds it and pushes its next-rank sibling and its rank-0 child, so the first `budget` pops are the
    `budget` highest-scoring prefixes (ties broken by the rank tuple, as in the reference code).
    """
    parents, depths, ranks, logprobs = best_first_nodes(top_logprobs, budget)
    token_ids = [root_token_id]
    if len(parents) > 1:  # token ids gathered once, at the end
        token_ids += np.asarray(top_token_ids)[np.asarray(depths[1:]) - 1, np.asarray(ranks[1:])].tolist()
    return DraftTree(tuple(token_ids), tuple(parents), tuple(depths), tuple(ranks), tuple(logprobs))


def tree_inputs_on_device(parents: torch.Tensor, depths: torch.Tensor, kernel: int,
                          max_depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """treeops.ancestor_matrix and treeops.conv_gather computed by tensor ops where the tree is (the runner's static
    inputs written by the device): (ancestor mask [T, T] bool, conv windows [T, kernel] int64). parents, depths [T]
    as the forward sees the tree (padding: children of the root); max_depth: a bound on its depth (the runner's
    max_path - 1). The mask is the closure of "itself or its parent" by squaring (after s squarings a node reaches
    its ancestors up to 2^s steps away: ceil(log2(max_depth)) matrix products of 0 / 1 entries, exact in float32);
    the windows walk every node's ancestors one step at a time, kernel - 1 steps. A few dozen small ops, where a
    step at a time for the mask too took ~130 (a host launching each of them: docs/lab/NOTEBOOK.md section 19)."""
    T = parents.shape[0]
    index = torch.arange(T, device=parents.device)
    reach = torch.eye(T, dtype=torch.float32, device=parents.device)  # itself, then its parent (the root has none)
    reach.index_put_((index, parents.clamp(min=0)), (parents >= 0).float(), accumulate=True)
    for _ in range(max(0, max_depth - 1).bit_length()):  # 2^s >= max_depth
        reach = ((reach @ reach) > 0).float()
    gather = torch.empty(T, kernel, dtype=torch.long, device=parents.device)
    gather[:, kernel - 1] = kernel + index  # each node last in its own window
    up = index  # each node's m-th ancestor (-1 past the root)
    for m in range(1, kernel):  # past the root the window continues into the committed inputs, newest last
        up = torch.where(up >= 0, parents[up.clamp(min=0)], -1)
        gather[:, kernel - 1 - m] = torch.where(up >= 0, kernel + up, kernel - (m - depths))
    return reach > 0, gather


def build_selector_tree(root_token_id: int, cond_root: np.ndarray, cond_pair: np.ndarray, cand_ids: np.ndarray,
                        budget: int) -> DraftTree:
    """DDTree's best-first tree over the candidate selector's pair scores (tree scoring `selector`).

    cand_ids [D, K]: the candidates of depths 1..D; cond_root [K]: log_softmax_b S_1(root, b); cond_pair [D-1, K, K]:
    cond_pair[d-2, i, j] = log_softmax_j S_d(cand_ids[d-2, i], cand_ids[d-1, j]). A node's score is the sum of these
    along its path: each term is <= 0, so a child never outscores its parent and the first `budget` pops are the
    `budget` best prefixes, as with per-depth marginals (build_tree); a budget's tree is a prefix of a larger
    budget's (the exact budget counterfactual holds). A popped node pushes its next sibling (the next best successor
    of the same parent) and its best child. A node's rank is its candidate's index at its depth (best unary first:
    the grid's column), its log-prob its selector log-prob given its parent's token.
    """
    depth_limit, k = np.asarray(cand_ids).shape
    token_ids, parents, depths, ranks, logprobs = [root_token_id], [-1], [0], [-1], [0.0]
    if budget <= 0 or depth_limit == 0 or k == 0:
        return DraftTree(tuple(token_ids), tuple(parents), tuple(depths), tuple(ranks), tuple(logprobs))
    row_of, best = _successor_rows(cond_root, cond_pair)  # row r: its successors best first, their log-probs
    # row of (depth, parent's candidate): 0 for depth 1 (the root's successors), 1 + (depth - 2) * k + candidate
    push, pop = heapq.heappush, heapq.heappop
    # entries: (-score, sibling-rank path, parent position, depth, sibling rank, row of the parent's successors)
    heap = [(-best[0], (0,), 0, 1, 0, 0)]
    while heap and len(parents) <= budget:
        neg, path, parent, depth, sib, row = pop(heap)
        order, values = row_of(row)
        cand, value, pos = order[sib], values[sib], len(parents)
        parents.append(parent)
        depths.append(depth)
        ranks.append(cand)
        logprobs.append(value)
        if sib + 1 < k:
            push(heap, (neg + value - values[sib + 1], path[:-1] + (sib + 1,), parent, depth, sib + 1, row))
        if depth < depth_limit:
            child_row = 1 + (depth - 1) * k + cand
            push(heap, (neg - best[child_row], path + (0,), pos, depth + 1, 0, child_row))
    token_ids += np.asarray(cand_ids)[np.asarray(depths[1:]) - 1, np.asarray(ranks[1:])].tolist()
    return DraftTree(tuple(token_ids), tuple(parents), tuple(depths), tuple(ranks), tuple(logprobs))


def _successor_rows(cond_root: np.ndarray, cond_pair: np.ndarray) -> tuple:
    """Every row of successors sorted in one call: row 0 the root's (depth 1), row 1 + (d - 2) * K + i those of
    candidate i at depth d - 1 (depth d's). Returns row_of(r) -> (successor indices best first, their log-probs) as
    Python lists, made on a row's first use (a budget-64 tree reads a few dozen of DFlash2's 1 + 7 x 16 rows at
    block 8 and top-K 16), and every row's best log-prob (a list)."""
    k = np.asarray(cond_root).shape[-1]
    rows = np.concatenate([np.asarray(cond_root, dtype=np.float64)[None],
                           np.asarray(cond_pair, dtype=np.float64).reshape(-1, k)])
    order = np.argsort(-rows, axis=-1, kind="stable")
    values = np.take_along_axis(rows, order, -1)
    made: dict[int, tuple[list, list]] = {}

    def row_of(r: int) -> tuple[list, list]:
        got = made.get(r)
        if got is None:
            got = made[r] = (order[r].tolist(), values[r].tolist())
        return got

    return row_of, values[:, 0].tolist()


def selector_chain(root_token_id: int, cond_root: np.ndarray, cond_pair: np.ndarray, cand_ids: np.ndarray,
                   noise: np.ndarray | None = None, temperature: float = 1.0) -> DraftTree:
    """DFlash2's chain: from the root, the best successor at every depth under the selector (greedy), or at
    temperature T > 0 the argmax of cond / T + noise (noise [D, K]: Gumbel noise of each candidate's token at its
    position, the project's position-keyed noise: a sample from softmax(S / T) over the K candidates)."""
    depth_limit = np.asarray(cand_ids).shape[0]
    picks, values, prev = [], [], None
    for d in range(depth_limit):
        row = np.asarray(cond_root if d == 0 else cond_pair[d - 1][prev], dtype=np.float64)
        score = row if noise is None else row / temperature + np.asarray(noise[d], dtype=np.float64)
        prev = int(np.argmax(score))
        picks.append(prev)
        values.append(float(row[prev]))
    chain = build_chain(root_token_id, [int(cand_ids[d][j]) for d, j in enumerate(picks)], values)
    return DraftTree(chain.token_ids, chain.parents, chain.depths, (-1, *picks), chain.logprobs)


def build_chain(root_token_id: int, token_ids: list[int], logprobs: list[float]) -> DraftTree:
    """DFlash's chain: the drafter's top-1 token at every depth, one after the other."""
    n = len(token_ids)
    return DraftTree(
        token_ids=(root_token_id, *map(int, token_ids)),
        parents=tuple(range(-1, n)),
        depths=tuple(range(n + 1)),
        ranks=(-1,) + (0,) * n,
        logprobs=(0.0, *map(float, logprobs)),
    )


def one_node(token_id: int) -> DraftTree:
    """A tree of the root alone: one greedy step through the tree code."""
    return DraftTree((int(token_id),), (-1,), (0,), (-1,), (0.0,))


def verify_inputs(
    tree: DraftTree, committed_len: int, dtype: torch.dtype, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """input_ids [1, T], position_ids [1, T] (committed_len + depth) and the additive 4-D mask
    [1, 1, T, committed_len + T]: each position sees the whole committed prefix, its ancestors and itself."""
    n = len(tree)
    input_ids = torch.tensor([tree.token_ids], dtype=torch.long, device=device)
    position_ids = torch.tensor([tree.depths], dtype=torch.long, device=device) + committed_len
    visible = torch.from_numpy(tree.ancestors()).to(device)
    mask = torch.zeros((1, 1, n, committed_len + n), dtype=dtype, device=device)
    mask[0, 0, :, committed_len:].masked_fill_(~visible, torch.finfo(dtype).min)
    return input_ids, position_ids, mask


def follow_on_device(parents: torch.Tensor, depths: torch.Tensor, token_ids: torch.Tensor, choice: torch.Tensor,
                     max_path: int) -> tuple[torch.Tensor, torch.Tensor]:
    """treeops.follow computed by tensor ops where the verify's logits are (no value read back to the host, so a
    CUDA graph can hold it): (walk [max_path + 2], bonus []) int64, walk in the runner's commit layout: the accepted
    positions root first, padded with the last of them, then the last one and the path's length; the bonus is the
    target's choice at the last one.

    parents, depths, token_ids, choice [T]: the tree's (parent -1 for the root, and for a padding node that is no
    one's child); choice[i] is the target's token after position i. Node i is taken when its token is choice[its
    parent] and no later sibling's is (treeops.children_by_token keeps the last); accepted are the root and the
    nodes whose ancestors are all taken, a chain, found by pointer doubling in ceil(log2 T) steps whatever the depth.
    The tree must be shallower than max_path (the runner checks the host's tree)."""
    T = parents.shape[0]
    index = torch.arange(T, device=parents.device)
    has_parent = parents >= 0
    parent = parents.clamp(min=0)
    matched = has_parent & (token_ids == choice[parent])
    winner = torch.full_like(parents, -1).scatter_reduce(0, parent, torch.where(matched, index, -1), "amax")
    ok = (matched & (winner[parent] == index)) | (index == 0)
    up = torch.where(has_parent, parents, index)  # the root and padding point at themselves
    for _ in range(max(1, (T - 1).bit_length())):  # ok: every ancestor within 2^j steps taken too
        ok, up = ok & ok[up], up[up]
    depth = torch.where(ok, depths, -1)
    deepest, last = depth.max(0)  # 0-d tensors: indexing by one reads it back to the host (no graph can hold that)
    length = deepest + 1
    at_depth = torch.zeros(max_path + 1, dtype=torch.long, device=parents.device)  # the node at each depth (+ a bin)
    at_depth.scatter_(0, torch.where(ok, depths, max_path).clamp(max=max_path), index)
    steps = torch.arange(max_path, device=parents.device)
    path = torch.where(steps < length, at_depth[:max_path], last)
    return torch.cat([path, last[None], length[None]]), choice.index_select(0, last[None])[0]


def follow_tree(tree: DraftTree, target_argmax: list[int]) -> tuple[list[int], int]:
    """Greedy acceptance walk: from the root, step to the child holding the target's argmax while one exists.

    Returns the accepted positions (root first) and the bonus token: the target's argmax at the last one."""
    return treeops.follow(tree.parents, tree.token_ids, target_argmax)
