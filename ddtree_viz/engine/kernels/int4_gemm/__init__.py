"""y = x W^T with W kept as packed 4-bit words, scales and zero points (engine/weights/int4_common.py's layout).

    naive.py        unpack, dequantize_words ((q - z) x scale in float32) and int4_linear_reference (rounded to
                    x's dtype, then F.linear): the reference, and the form a CPU runs
    triton_gemm.py  Triton: the word form on the tensor cores (`choose`'s rules), the one-row form on the CUDA cores
                    (a decode step's, where the measured table picks it), the tile form (every layout the loader
                    accepts)
    table.py        the launches gpu_bench --int4-tune measured per GEMM shape and band of rows (tuned.json),
                    which choose reads first
    dispatch.py     linear: the Triton GEMM on a CUDA input where it runs, else the reference

Modules are imported by name (nothing is re-exported here), so the CPU path never imports Triton.
"""
