"""A GDN layer's one-node pass (a greedy step) between its projections and out_proj in one launch; and a tree's part
before the delta rule (conv, l2 norms, gates), which shares its conv and gates, in one launch.

    naive.py        the torch pieces (tree_conv, l2norm, gdn_prep, delta_rule_step, gated_norm) and the one-node core
                    they make (gdn_step_reference): the reference, and the form a CPU runs
    triton_step.py  Triton: gdn_step_triton (the one-node core), gdn_prep_triton (a tree's prep)
    dispatch.py     choose_step / choose_prep (RunnerForms.gdn_step, gdn_prep): each launch held to its reference
                    on the layer's own weights before it is used

Modules are imported by name (nothing is re-exported here), so the CPU path never imports Triton.
"""
