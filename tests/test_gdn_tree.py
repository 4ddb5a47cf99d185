"""Invariant 2: per node, tree GDN == transformers' own GDN layer run over that node's root-to-node path.

Checked for outputs, conv windows (the committed conv state after the path) and recurrent states, on random
trees of depth 1..8 (paths shorter and longer than the conv kernel), for the fast parallel form and for the
slow per-path reference, against transformers' chunked prefill form and its one-token decode form."""

import copy
import random

import pytest
import torch
from transformers import DynamicCache

from ddtree_viz.engine.kernels.gdn_tree.naive import replay_state, tree_delta_rule_reference
from ddtree_viz.engine.kernels.gdn_tree.parallel import (
    solve_steps, state_after, tree_delta_rule, tree_delta_rule_parts, tree_solve,
)
from ddtree_viz.engine.gdn_tree import (
    TreeIndex, commit_gdn_state, tree_conv, tree_conv_reference, tree_gdn_forward, tree_gdn_forward_reference,
)
from tests.tiny import target_model


def random_tree(n: int, max_depth: int, rng: random.Random) -> list[int]:
    """Parents (parents precede children) of a random tree of n positions whose depth is exactly max_depth."""
    parents, depth = [-1], [0]
    for d in range(1, max_depth + 1):  # a spine, so the depth is reached
        parents.append(len(parents) - 1)
        depth.append(d)
    while len(parents) < n:
        p = rng.choice([i for i in range(len(parents)) if depth[i] < max_depth])
        parents.append(p)
        depth.append(depth[p] + 1)
    order = sorted(range(len(parents)), key=lambda i: (depth[i], rng.random()))  # shuffle, parents first
    new = {old: new for new, old in enumerate(order)}
    return [-1 if parents[old] < 0 else new[parents[old]] for old in order]


def path(parents, pos):
    out = []
    while pos >= 0:
        out.append(pos)
        pos = parents[pos]
    return out[::-1]


@pytest.fixture(scope="module")
def model():
    return target_model("hybrid", seed=3)


def committed_cache(model, layer, prefix_len, seed):
    torch.manual_seed(seed)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        layer(torch.randn(1, prefix_len, model.config.hidden_size), cache=cache)
    return cache


@pytest.mark.parametrize("depth", range(1, 9))
@pytest.mark.parametrize("prefix_len", [2, 9])  # 2 < kernel: the committed conv state is zero-padded
def test_tree_gdn_matches_transformers_per_path(model, depth, prefix_len):
    layer = model.model.layers[0].linear_attn
    idx = layer.layer_idx
    rng = random.Random(depth * 31 + prefix_len)
    parents = random_tree(n=depth + 1 + rng.randint(0, 12), max_depth=depth, rng=rng)
    cache = committed_cache(model, layer, prefix_len, seed=depth)
    conv, rec = cache.layers[idx].conv_states[0].clone(), cache.layers[idx].recurrent_states[0].clone()
    hidden = torch.randn(1, len(parents), model.config.hidden_size)
    index = TreeIndex.build(parents, layer.conv_kernel_size, "cpu")
    with torch.no_grad():
        fast, fast_stash = tree_gdn_forward(layer, hidden, conv, rec, index)
        slow, slow_stash = tree_gdn_forward_reference(layer, hidden, conv, rec, parents)
        torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)
        for pos in range(len(parents)):
            p = path(parents, pos)
            chunked = copy.deepcopy(cache)  # transformers' multi-token (chunked) form over the path
            ref = layer(hidden[:, p], cache=chunked)
            torch.testing.assert_close(fast[0, pos], ref[0, -1], atol=1e-5, rtol=1e-5)
            stepwise = copy.deepcopy(cache)  # transformers' one-token decode form, token by token
            for t in p:
                ref1 = layer(hidden[:, [t]], cache=stepwise)
            torch.testing.assert_close(fast[0, pos], ref1[0, -1], atol=1e-5, rtol=1e-5)
            for stash in (fast_stash, slow_stash):
                new_conv, new_rec = commit_gdn_state(stash, p, conv, rec, index)
                torch.testing.assert_close(new_conv, stepwise.layers[idx].conv_states[0], atol=1e-6, rtol=1e-5)
                torch.testing.assert_close(new_rec, stepwise.layers[idx].recurrent_states[0], atol=1e-5, rtol=1e-5)
                torch.testing.assert_close(new_rec, chunked.layers[idx].recurrent_states[0], atol=1e-5, rtol=1e-5)


def test_conv_fast_equals_reference_and_cache_columns():
    torch.manual_seed(0)
    parents = [-1, 0, 0, 1, 3, 4, 2]
    conv_state, weight = torch.randn(5, 4), torch.randn(5, 4)
    u = torch.randn(len(parents), 5)
    index = TreeIndex.build(parents, 4, "cpu")
    torch.testing.assert_close(tree_conv(u, conv_state, weight, index.conv_gather), tree_conv_reference(u, conv_state, weight, parents))
    # node 2 (depth 1, parent root): window = 2 committed columns, root, itself
    assert index.conv_gather[2].tolist() == [2, 3, 4 + 0, 4 + 2]
    # node 5 (depth 4): its window lies entirely in the tree
    assert index.conv_gather[5].tolist() == [4 + 1, 4 + 3, 4 + 4, 4 + 5]


def test_delta_rule_forms_agree_and_state_after_matches_replay():
    torch.manual_seed(1)
    parents = random_tree(20, 6, random.Random(5))
    n, h, dk, dv = len(parents), 3, 4, 5
    q = torch.nn.functional.normalize(torch.randn(n, h, dk), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(n, h, dk), dim=-1)
    v, g, beta, s0 = torch.randn(n, h, dv), -torch.rand(n, h) * 2, torch.rand(n, h), torch.randn(h, dk, dv)
    index = TreeIndex.build(parents, 4, "cpu")
    out, delta = tree_delta_rule(q, k, v, g, beta, s0, index.ancestors)
    torch.testing.assert_close(out, tree_delta_rule_reference(q, k, v, g, beta, s0, parents), atol=1e-5, rtol=1e-5)
    for pos in range(n):
        p = path(parents, pos)
        torch.testing.assert_close(state_after(p, k, g, delta, s0), replay_state(p, k, v, g, beta, s0), atol=1e-5, rtol=1e-5)


def test_grouped_heads_give_the_parts_of_repeated_heads_and_steps_count_the_depth():
    """tree_delta_rule_parts on q, k with their key heads (each serving `rep` value heads) == on q, k repeated to the
    value heads; solved, == the per-path recurrence. solve_steps is the tree's depth - 1 (at least 0)."""
    gen = torch.Generator().manual_seed(4)
    parents = random_tree(21, 7, random.Random(2))
    n, hk, rep, dk, dv = len(parents), 2, 3, 8, 6
    q = torch.nn.functional.normalize(torch.randn(n, hk, dk, generator=gen), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(n, hk, dk, generator=gen), dim=-1)
    v, s0 = torch.randn(n, hk * rep, dv, generator=gen), torch.randn(hk * rep, dk, dv, generator=gen)
    g, beta = -torch.rand(n, hk * rep, generator=gen) * 2, torch.rand(n, hk * rep, generator=gen)
    masks = TreeIndex.build(parents, 4, "cpu").masks
    qr, kr = q.repeat_interleave(rep, 1), k.repeat_interleave(rep, 1)
    grouped = tree_delta_rule_parts(q, k, v, g, beta, s0, masks.anc_float, masks.off_path)
    repeated = tree_delta_rule_parts(qr, kr, v, g, beta, s0, masks.anc_float, masks.off_path)
    for a, b in zip(grouped, repeated):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    out, _ = tree_solve(*grouped)
    torch.testing.assert_close(out, tree_delta_rule_reference(qr, kr, v, g, beta, s0, parents), atol=1e-5, rtol=1e-5)
    assert int(solve_steps(masks.anc_float)) == 6
    assert int(solve_steps(TreeIndex.build([-1], 4, "cpu").masks.anc_float)) == 0


def test_tree_index_rejects_children_before_parents():
    with pytest.raises(ValueError):
        TreeIndex.build([-1, 2, 0], 4, "cpu")
