"""`gpu_bench --int4-sass` and `--fp8-sass`, no GPU needed: the 4-bit GEMM's forms (engine/kernels/int4_gemm/
triton_gemm.py) or the FP8 GEMM's tree-verify tiles (engine/kernels/fp8_gemm/triton_gemm.py) compiled for an H100
(sm_90a: Triton's compiler, then the ptxas and nvdisasm Triton ships) and the machine instructions each thread
issues in the k loop, per weight it reads, by opcode. A proxy, not a timing: where a form is bound by issuing
instructions rather than by reading memory (the 4-bit GEMM at one row was, docs/lab/NOTEBOOK.md section 47; the
FP8 verify with x's tiles loaded by address was, section 49), fewer instructions a weight is what makes it faster; a
GPU's timing decides. bfloat16 activations; 4-bit: bf16 scales, symmetric groups of 128 (the bench's 4-bit target);
FP8: float32 scales in 128 x 128 blocks (the official layout), whole tiles."""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

# 4-bit (form, rows a program, rows of the weight, a step's columns, warps, half): a decode step's launches, a
# DFlash block's, a verify's
LAUNCHES = (("gemv", 1, 32, 256, 4, False), ("gemv", 1, 64, 128, 4, False), ("words", 16, 64, 256, 4, False),
            ("words", 16, 64, 256, 4, True), ("words", 128, 64, 128, 8, False), ("words", 128, 64, 128, 8, True),
            ("words", 128, 64, 64, 8, False), ("swap", 65, 64, 128, 4, False), ("swap", 65, 128, 128, 4, False),
            ("swap", 129, 64, 128, 4, False), ("swap", 129, 128, 128, 8, False), ("swap", 65, 64, 128, 4, True),
            ("swap", 65, 128, 128, 4, True), ("swap", 129, 128, 128, 8, True))
ARGUMENTS = {"x_ptr": "*bf16", "w_ptr": "*i32", "s_ptr": "*bf16", "z_ptr": "*i32", "p_ptr": "*fp32", "y_ptr": "*bf16",
             **dict.fromkeys(("M", "N", "K", "WORDS", "GROUPS", "stride_xm", "stride_ym", "SLICE"), "i32")}  # the
# rest constexpr; the swapped form's x and words as tensor descriptors (what an H100 runs)
# FP8 (rows a program + tail, rows of the weight, warps, split, bulk copies): a verify at budget 64 (65 rows) and
# 128 (129) as fp8_gemm.choose makes them on an H100, and the 256-row tile gpu_bench --fp8 times beside them; each
# with its tiles by bulk copies (what an H100 runs) and by address
FP8_LAUNCHES = tuple((m, tail, n, warps, split, tma) for (m, tail, n, warps, split) in
                     ((64, 16, 128, 4, 2), (128, 16, 128, 8, 1), (64, 16, 256, 8, 2)) for tma in (True, False))
FP8_ARGUMENTS = {"x_ptr": "*bf16", "xt_ptr": "*bf16", "w_ptr": "*fp8e4nv", "s_ptr": "*fp32", "y_ptr": "*bf16",
                 "p_ptr": "*fp32", "c_ptr": "*i32",
                 **dict.fromkeys(("M", "N", "K", "s_xm", "s_wn", "s_sn", "s_ym", "K_SPLIT"), "i32")}


def instructions(sass: str) -> tuple[list[str], dict[str, int]]:
    """nvdisasm's listing as (its instructions in order, each label's index among them)."""
    labels, instrs = {}, []
    for line in sass.splitlines():
        label = re.match(r"^\s*(\.L_x_\d+):", line)
        if label:
            labels[label.group(1)] = len(instrs)
            continue
        ins = re.match(r"^\s*/\*[0-9a-f]+\*/\s+(.*?)\s*;", line)
        if ins:
            instrs.append(ins.group(1))
    return instrs, labels


def loop_body(sass: str, holding: str | None = None) -> list[str]:
    """The instructions of the longest loop in nvdisasm's listing (a label and a branch back to it, with no EXIT
    between: an out-of-line wait placed after the kernel's end branches back into the loop, and that span is not a
    loop); with `holding` (a regex), the longest that holds an instruction it matches."""
    instrs, labels = instructions(sass)
    best: list[str] = []
    for i, ins in enumerate(instrs):
        back = re.search(r"BRA\s+(?:`\()?(\.L_x_\d+)", ins)
        start = labels.get(back.group(1), i + 1) if back else i + 1
        body = instrs[start:i + 1]
        if (start <= i and len(body) > len(best) and not any(opcode(x) == "EXIT" for x in body)
                and (holding is None or any(re.search(holding, x) for x in body))):
            best = body
    return best


def opcode(ins: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", ins).split()[0].split(".")[0]


def disassemble(fn, signature: dict, constexprs: dict, warps: int) -> str:
    """`fn` compiled for sm_90a (3 pipeline stages) and its cubin disassembled by the nvdisasm Triton ships."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs),
                              target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=3))
    nvdisasm = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        return subprocess.run([str(nvdisasm), "-c", str(cubin)], capture_output=True, text=True, check=True).stdout


def counted(sass: str, weights: int, warps: int, holding: str | None = None) -> dict:
    """The k loop's instructions (one warp's), a thread's per weight of the loop's step (`weights` of them a
    program), the register spills in the whole kernel (local memory's loads and stores), the loop's tensor-core
    instructions and its top opcodes."""
    body = loop_body(sass, holding)
    spills = sum(1 for ins in instructions(sass)[0] if opcode(ins) in ("LDL", "STL"))
    return {"loop_instructions": len(body), "per_weight": round(len(body) * 32 * warps / weights, 2),
            "spills": spills, "tensor_core": sum(1 for ins in body if opcode(ins) in ("HGMMA", "HMMA")),
            "opcodes": dict(Counter(opcode(ins) for ins in body).most_common(10))}


def count(form: str, rows: int, block_n: int, block_k: int, warps: int, half: bool) -> dict:
    """One 4-bit launch compiled for sm_90a and counted (`counted`; the swapped form in its tensor-core loop, `rows`
    a verify's, as tiles.row_blocks splits them)."""
    from ...engine.kernels.int4_gemm import triton_gemm as kernel
    from ...engine.kernels.tiles import row_blocks

    fn = {"gemv": kernel._int4_gemv, "words": kernel._int4_words, "swap": kernel._int4_swap}[form]
    consts = dict(GROUP=128, ASYM=False, BLOCK_N=block_n, BLOCK_K=block_k)
    signature = {a: ARGUMENTS.get(a, "constexpr") for a in fn.arg_names}
    if form == "words":  # the products a field at a time (Config.fields), the form sections 47-49 counted
        consts.update(HALF=int(half), PRECISION="tf32", UPCAST=False, FIELDS=True, BLOCK_M=rows)
    if form == "swap":
        main, tail = row_blocks(rows)
        consts.update(HALF=int(half), PRECISION="tf32", UPCAST=False, TMA=True, BLOCK_M=main, TAIL=tail)
        signature.update(x_ptr=f"tensordesc<bf16[{main}, {block_k}]>", xt_ptr=f"tensordesc<bf16[{tail}, {block_k}]>",
                         w_ptr=f"tensordesc<i32[{block_n}, {block_k // 8}]>")
    sass = disassemble(fn, signature, consts, warps)
    return {"form": form, "rows": rows, "block_n": block_n, "block_k": block_k, "warps": warps, "half": half,
            **counted(sass, block_n * block_k, warps, holding=r"GMMA|HMMA" if form == "swap" else None)}


def fp8_count(block_m: int, tail: int, block_n: int, warps: int, split: int, tma: bool) -> dict:
    """One FP8 verify tile (swapped, as choose makes them) compiled for sm_90a and counted in its tensor-core loop:
    with `tma`, x's and the weight's tiles as tensor descriptors."""
    from ...engine.kernels.fp8_gemm import triton_gemm as kernel

    fn = kernel._fp8_gemm
    consts = dict(SB_N=128, SB_K=128, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=kernel.BLOCK_K, PRECISION="tf32",
                  UPCAST=False, SPLIT=split, SUM_IN_LAUNCH=False, SWAP=True, TAIL=tail, TMA=tma, EVEN=not tma)
    signature = {a: FP8_ARGUMENTS.get(a, "constexpr") for a in fn.arg_names}
    if tma:
        signature.update(w_ptr=f"tensordesc<fp8e4nv[{block_n}, {kernel.BLOCK_K}]>",
                         x_ptr=f"tensordesc<bf16[{block_m}, {kernel.BLOCK_K}]>",
                         xt_ptr=f"tensordesc<bf16[{tail}, {kernel.BLOCK_K}]>")
    sass = disassemble(fn, signature, consts, warps)
    return {"rows": block_m + tail, "block_m": block_m, "tail": tail, "block_n": block_n, "block_k": kernel.BLOCK_K,
            "warps": warps, "split": split, "tma": tma,
            **counted(sass, block_n * kernel.BLOCK_K, warps, holding=r"GMMA|HMMA")}


def int4_sass() -> dict:
    """Each of LAUNCHES counted, or why it could not be (no Triton, no ptxas)."""
    return _each(count, LAUNCHES)


def fp8_sass() -> dict:
    """Each of FP8_LAUNCHES counted, or why it could not be."""
    return _each(fp8_count, FP8_LAUNCHES)


def _each(count_one, launches) -> dict:
    try:
        return {"target": "sm_90a", "launches": [count_one(*launch) for launch in launches]}
    except (ImportError, OSError, subprocess.CalledProcessError) as exc:
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
