"""The commit's reference: every GDN layer's recurrent state advanced along the accepted path one step at a time,

    S <- e^{g_t} S + k_t delta_t^T        for t = path[0], path[1], ..., path[length - 1],

with delta from the verify pass (the tree rule's: the state's update at each node, given its parent's state). Slow
and obviously correct: closed_form.commit_recurrent (the torch form) and triton_commit.py are held to it
(tests/test_step_kernel.py). Shapes: docs/ARCHITECTURE.md's letters.
"""

from __future__ import annotations


def commit_recurrent_reference(rec_all, k, g, delta, path, steps, length) -> None:
    """closed_form.commit_recurrent's arguments and effect, in place, step by step: rec_all [Lg, H, K, V] fp32; k [Lg,
    T, H or Hk, K]; g [Lg, T, H]; delta [Lg, T, H, V]; path [P] (padded); steps [P] (unused); length [] (the path's
    valid steps, read on the host)."""
    H = rec_all.shape[1]
    for layer in range(rec_all.shape[0]):
        state = rec_all[layer].clone()
        for t in path[: int(length)].tolist():
            key = k[layer, t].repeat_interleave(H // k.shape[2], dim=0)  # [H, K]: each key head serves H / Hk
            state = g[layer, t].exp()[:, None, None] * state + key[:, :, None] * delta[layer, t][:, None, :]
        rec_all[layer].copy_(state)
