"""The tree delta rule: the gated delta rule over a tree, every node seeing exactly its own root-to-node path.

One folder per op (flash-linear-attention's habit): the reference beside every fast form, one module each.

    naive.py           the per-path recurrence (tree_delta_rule_reference, replay_state): slow, obviously correct
    parallel.py        every node at once in torch: tree_delta_rule (= tree_delta_rule_parts, then tree_solve),
                       TreeMasks, solve_steps, state_after (the state after a path, for the commit); a CPU's form
    triton_solve.py    Triton: the whole rule in two launches (tree_rule_triton, the winner) or the solve alone
                       (tree_solve_triton); imported only where it runs
    dispatch.py        THE choice of a form by device and tree size (RunnerForms.gdn_kernel), and its check

The one-node form (a greedy step) is gdn_step/'s. Modules are imported by name (nothing is re-exported here), so the
CPU path never imports Triton.
"""
