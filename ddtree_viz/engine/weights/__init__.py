"""Checkpoint weight formats, one module each behind one protocol, chosen by name in one registry.

    base.py                the protocol (WeightFormat, FastLayout, Spec) and what no format owns (stand-ins,
                           refuse_nonfinite, the tests' conversions)
    registry.py            FORMATS by name, one line a format; spec_of (a config's format, by quant_method),
                           format_of (a spec's), layout_of (a kept Linear's), KEPT, stored_parameters
    load.py                a quantized checkpoint's files, tensors and model (read_checkpoint, load_causal_lm,
                           keep_linears), whatever its format
    plain.py               no quantization_config (FusedLinear: the runner's plain fused kind)
    fp8.py                 the official FP8 layout (Fp8Linear, FusedFp8Linear)
    int4_common.py         the 4-bit layout every 4-bit format is read as (Int4Spec, Int4Linear, FusedInt4Linear,
                           translate, per-layer rules)
    compressed_tensors.py  4-bit pack-quantized (llm-compressor)
    gptq.py, awq.py        4-bit GPTQModel / AutoGPTQ, AutoAWQ
    autoround.py           4-bit AutoRound (GPTQ's or AWQ's words)

docs/ARCHITECTURE.md "Add a weight format" says how a format joins.
"""
