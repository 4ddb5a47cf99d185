"""The kernels: one folder per operation, flash-linear-attention's `fla/ops` habit (docs/ARCHITECTURE.md, "The
kernels"). Each folder holds its obviously-correct reference (`naive.py`), the fast form or forms beside it, and
`dispatch.py`, which picks a form by device and shape and holds a fast form to its reference before it is used:

    gdn_tree/      the tree delta rule: every node of a tree sees its own root-to-node path (a verify's GDN core)
    gdn_step/      a GDN layer's one-node pass between its projections and out_proj in one launch (a greedy step),
                   and a tree's conv, l2 norms and gates before the rule (they share the conv and the gates)
    state_commit/  the commit: every GDN layer's recurrent state advanced along the accepted path
    add_norm/      a layer's residual add and the RMSNorm after it
    fp8_gemm/      y = x W^T with W kept as FP8 bytes and block scales
    int4_gemm/     y = x W^T with W kept as packed 4-bit words, scales and zero points
    best_first/    DDTree's best-first tree from the drafter's top log-probs, where they are

and, shared by them: device.py (whether Triton runs here, the one-launch options' meaning on a device) and pdl.py
(programmatic dependent launch). A kernel knows nothing of models, layers, weights formats or the runner: a module
here imports only torch, triton, numpy, the standard library, ddtree_viz.treeops (parent-list operations) and other
modules of this folder (tests/test_structure.py checks). Modules are imported by name (nothing is re-exported), so
the CPU path never imports Triton: a Triton module is imported only where its form is chosen.
"""
