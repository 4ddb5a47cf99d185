"""DDTree's best-first tree from the drafter's per-depth top log-probs: the `budget` highest-scoring prefixes.

    naive.py              the heap loop on the host (best_first_nodes; engine/tree.py's build_tree): the reference,
                          and the form a records-on round runs
    beam.py               torch: one stable sort by score a depth where the log-probs are (tree_on_device)
    triton_best_first.py  Triton: the heap loop in one program where the log-probs are (budgets up to MAX_BUDGET)
    dispatch.py           device_tree_nodes: the kernel on CUDA where it runs and takes the budget, else beam.py

Modules are imported by name (nothing is re-exported here), so the CPU path never imports Triton.
"""
