"""Parent-list operations on a draft tree: numpy only, no torch, no model (engine, runner and renderers use it).

A tree of T positions is its parent list: `parents[0] == -1` (the root) and every parent precedes its children
(`parents[i] < i`), which is the order DDTree's best-first construction adds nodes in. Everything else (depths,
paths, the ancestor mask of the verify pass, the causal-conv windows of the tree-exact Gated DeltaNet) is
derived from it here, once.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def check_parents(parents: Sequence[int]) -> tuple[int, ...]:
    """The parent list as ints, refused unless position 0 is the only root and every parent precedes its child."""
    par = tuple(int(p) for p in parents)
    if not par or par[0] != -1:
        raise ValueError("tree position 0 must be the root (parent -1)")
    for pos, parent in enumerate(par[1:], start=1):
        if not 0 <= parent < pos:
            raise ValueError(f"tree position {pos} has parent {parent}: parents must precede their children")
    return par


def depths_of(parents: Sequence[int]) -> tuple[int, ...]:
    """Depth of each position (root 0)."""
    depths: list[int] = []
    for parent in parents:
        depths.append(0 if parent < 0 else depths[parent] + 1)
    return tuple(depths)


def path_to(parents: Sequence[int], pos: int) -> list[int]:
    """Positions from the root to `pos`, both included."""
    path = []
    while pos != -1:
        path.append(pos)
        pos = parents[pos]
    return path[::-1]


def ancestor_matrix(parents: Sequence[int]) -> np.ndarray:
    """[T, T] bool: visible[i, j] is True when position j is i itself or one of its ancestors."""
    n = len(parents)
    visible = np.zeros((n, n), dtype=np.bool_)
    for pos in range(n):
        parent = parents[pos]
        if parent >= 0:
            visible[pos, :pos] = visible[parent, :pos]
        visible[pos, pos] = True
    return visible


def conv_gather(parents: Sequence[int], depths: Sequence[int], kernel: int) -> np.ndarray:
    """[T, kernel] int64: each position's causal-conv window as columns of cat(committed conv inputs, tree inputs).

    Columns 0..kernel-1 index the committed conv state (oldest first; kernel-1 is the newest committed input),
    columns kernel + p index tree position p. A window's last column is the node itself, the column before it
    its parent, and so on up the chain; past the root it continues into the committed inputs."""
    par = np.asarray(parents, dtype=np.int64)
    depth = np.asarray(depths, dtype=np.int64)
    out = np.empty((len(par), kernel), dtype=np.int64)
    cur = np.arange(len(par))
    out[:, kernel - 1] = kernel + cur
    for m in range(1, kernel):
        cur = np.where(cur >= 0, par[np.maximum(cur, 0)], -1)
        out[:, kernel - 1 - m] = np.where(cur >= 0, kernel + cur, kernel - (m - depth))
    return out


def conv_gather_reference(parents: Sequence[int], kernel: int) -> np.ndarray:
    """conv_gather by walking parent pointers one node at a time: the slow, obviously-correct twin."""
    out = np.empty((len(parents), kernel), dtype=np.int64)
    for pos in range(len(parents)):
        node, past = pos, 0
        for col in range(kernel - 1, -1, -1):
            if node >= 0:
                out[pos, col] = kernel + node
                node = parents[node]
            else:
                past += 1
                out[pos, col] = kernel - past
    return out


def children_by_token(parents: Sequence[int], token_ids: Sequence[int]) -> list[dict[int, int]]:
    """Per position: token id -> child position."""
    maps: list[dict[int, int]] = [{} for _ in parents]
    for pos in range(1, len(parents)):
        maps[parents[pos]][token_ids[pos]] = pos
    return maps


def follow(parents: Sequence[int], token_ids: Sequence[int], choice: Sequence[int]) -> tuple[list[int], int]:
    """The acceptance walk: from the root, step to the child holding the target's choice at the current node
    while one exists. `choice[i]` is the target's token after position i (its argmax, or its sample).

    Returns the accepted positions (root first) and the bonus token: the target's choice at the last one."""
    children = children_by_token(parents, token_ids)
    accepted = [0]
    token = int(choice[0])
    while token in children[accepted[-1]]:
        accepted.append(children[accepted[-1]][token])
        token = int(choice[accepted[-1]])
    return accepted, token


def is_parent_chain(parents: Sequence[int], path: Sequence[int]) -> bool:
    """True when `path` starts at the root and each position is a child of the one before it."""
    if not path or path[0] != 0:
        return False
    return all(0 <= b < len(parents) and parents[b] == a for a, b in zip(path, path[1:]))
