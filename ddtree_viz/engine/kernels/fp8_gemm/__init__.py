"""y = x W^T with W kept as FP8 (e4m3) bytes and float32 block scales (the official FP8 layout, engine/weights/fp8.py).

    naive.py        dequantize (the block product in float32) and fp8_linear_reference (rounded to x's dtype, then
                    F.linear): the reference, and the form a CPU runs
    triton_gemm.py  Triton: the GEMM reading the bytes and scales as stored (tiles chosen by shape: `choose`; one row
                    on the CUDA cores; split-K; bulk tensor copies on Hopper)
    dispatch.py     linear / riding_linear: the Triton GEMM on a CUDA input where it runs, else the reference

Modules are imported by name (nothing is re-exported here), so the CPU path never imports Triton.
"""
