"""The commit: every GDN layer's recurrent state advanced along the accepted path (and its conv window moved to the
path's last node), in place.

    naive.py          the recurrence step by step (commit_recurrent_reference): slow, obviously correct
    closed_form.py    torch: commit_recurrent (one batched matmul, then decay and add), commit_conv, commit_state;
                      the form a CPU runs
    triton_commit.py  Triton: the recurrent update in one launch, every state read and written once
    dispatch.py       choose_commit (RunnerForms.commit): the launch where it runs and matches the torch form

Modules are imported by name (nothing is re-exported here), so the CPU path never imports Triton.
"""
