"""The commit in torch, every GDN layer at once and in place: the form a CPU runs (through torch.compile on CUDA where
the one launch of triton_commit.py is not taken). The recurrent states in their closed form (one batched matmul,
then decay and add in one pass; naive.py is the step-by-step reference) and the conv windows at the path's last
node. Shapes: docs/ARCHITECTURE.md's letters.
"""

from __future__ import annotations

import torch


def commit_recurrent(rec_all, k, g, delta, path, steps, length) -> None:
    """The static runner's GDN commit of the recurrent states for every layer at once, in place: each advanced along
    the accepted path (closed form of gdn_tree/parallel.py's state_after: one batched matmul, then decay and add in
    one pass; triton_commit.py does it in one launch). rec_all [Lg, H, K, V] fp32; k [Lg, T, H, K]; g [Lg, T, H];
    delta [Lg, T, H, V]; path [P] (padded); steps [P] (0 .. P-1); length [] (the path's valid steps)."""
    valid = (steps < length).to(torch.float32)[None, :, None]  # the path's steps, padding after
    G = torch.cumsum(g.index_select(1, path) * valid, dim=1)  # [Lg, P, H] path sums (padding adds 0)
    end = G[:, -1]
    w = (end[:, None] - G).exp() * valid
    kp = k.index_select(1, path)
    if kp.shape[2] != w.shape[2]:  # keys stashed with their Hk key heads (the Triton kernel's): each serves H / Hk
        kp = kp.repeat_interleave(w.shape[2] // kp.shape[2], dim=2)
    kp = kp * w[..., None]  # [Lg, P, H, K]
    # sum_j k_j delta_j^T: a batched matmul (a reduction over P fused into one kernel reads its operands P times)
    grown = torch.einsum("lphk,lphv->lhkv", kp, delta.index_select(1, path))  # [Lg, H, K, V]
    rec_all.copy_(end.exp()[..., None, None] * rec_all + grown)  # one pass over the states, in place


def commit_conv(conv_all, u, gather, last) -> None:
    """The commit's conv windows for every GDN layer at once, in place: each taken at the path's last node. conv_all
    [Lg, C, kernel]; u [Lg, T, C]; gather [T, kernel]; last [1]."""
    ext = torch.cat([conv_all, u.to(conv_all.dtype).transpose(1, 2)], dim=2)  # [Lg, C, kernel + T]
    conv_all.copy_(ext.index_select(2, gather.index_select(0, last)[0]))


def commit_state(rec_all, conv_all, u, k, g, delta, path, steps, length, gather, last) -> None:
    """The static runner's GDN commit for every layer at once, in place (one piece): commit_recurrent, then
    commit_conv. Shapes as theirs."""
    commit_recurrent(rec_all, k, g, delta, path, steps, length)
    commit_conv(conv_all, u, gather, last)
