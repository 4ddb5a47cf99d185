"""A layer's residual add and the RMSNorm after it.

    naive.py        torch: rms_norm, add_rms_norm (the reference, and the form a CPU runs)
    triton_norm.py  Triton: the add and the norm in one launch, a program a row (rows up to WIDEST columns)
    dispatch.py     choose_norm (RunnerForms.norm): the launch where it takes the model's rows and matches the piece

Modules are imported by name (nothing is re-exported here), so the CPU path never imports Triton.
"""
