"""The tree delta rule's reference: the gated delta rule run along each node's own root-to-node path.

Per value head, with the committed state S_c (K x V, fp32) and per-token q, k (L2-normalised, q scaled by
K^-1/2), v, g (log decay, <= 0) and beta, a chain runs

    S_t = exp(g_t) S_{t-1};  delta_t = beta_t (v_t - S_t^T k_t);  S_t += k_t delta_t^T;  o_t = S_t^T q_t.

On a tree the previous state is the *parent's*: S_n = step(S_p(n)), S_p(root) = S_c. Slow and obviously correct:
every other form (gdn_step/naive.py's step, parallel.py, the Triton kernels) is tested against it
(tests/test_gdn_tree.py, tests/test_tree_kernel.py). Shapes: docs/ARCHITECTURE.md's letters (engine/gdn_tree.py's
legend).
"""

from __future__ import annotations

import torch


def tree_delta_rule_reference(q, k, v, g, beta, state, parents):
    """Per node: run the gated delta rule along its own root-to-node path. q, k: [T, H, K]; v: [T, H, V]; g, beta:
    [T, H]; state: [H, K, V]; parents: T parent positions (root -1). Returns o [T, H, V]."""
    outs = []
    for pos in range(q.shape[0]):
        path, node = [], pos
        while node >= 0:
            path.append(node)
            node = parents[node]
        s = state.clone()
        for t in reversed(path):
            s = s * g[t].exp()[:, None, None]
            delta = beta[t][:, None] * (v[t] - torch.einsum("hkv,hk->hv", s, k[t]))
            s = s + k[t][:, :, None] * delta[:, None, :]
        outs.append(torch.einsum("hkv,hk->hv", s, q[pos]))
    return torch.stack(outs)


def replay_state(path: list[int], k, v, g, beta, state) -> torch.Tensor:
    """The recurrence itself along `path` (root first): the obviously-correct twin of parallel.state_after. Shapes
    as tree_delta_rule_reference -> [H, K, V]."""
    s = state.clone()
    for t in path:
        s = s * g[t].exp()[:, None, None]
        delta = beta[t][:, None] * (v[t] - torch.einsum("hkv,hk->hv", s, k[t]))
        s = s + k[t][:, :, None] * delta[:, None, :]
    return s
