"""The tree delta rule: the gated delta rule over a tree, every node seeing exactly its own root-to-node path.

One folder per op (flash-linear-attention's habit): the reference beside every fast form, one module each.

    naive.py           the per-path recurrence (tree_delta_rule_reference, replay_state): slow, obviously correct
    step.py            one token (T = 1): delta_rule_step, the greedy step
    parallel.py        every node at once in torch: tree_delta_rule (= tree_delta_rule_parts, then tree_solve),
                       TreeMasks, solve_steps, state_after (the state after a path, for the commit)
    triton_solve.py    Triton: the solve alone (tree_solve_triton) or the whole rule in two launches
                       (tree_rule_triton); imported only where it runs
    dispatch.py        THE choice of a form for the static runner (RunnerOptions.gdn_kernel), once per runner

Modules are imported by name (nothing is re-exported here), so the CPU path never imports Triton.
"""
