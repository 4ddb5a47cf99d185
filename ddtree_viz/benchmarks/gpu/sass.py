"""`gpu_bench --int4-sass`, no GPU needed: the 4-bit GEMM's forms (engine/kernels/int4_gemm/triton_gemm.py) compiled
for an H100 (sm_90a: Triton's compiler, then the ptxas and nvdisasm Triton ships) and the machine instructions each
thread issues in the k loop, per weight it reads, by opcode. A proxy, not a timing: where a form is bound by issuing
instructions rather than by reading memory (the 4-bit GEMM at one row was: docs/lab/NOTEBOOK.md section 47), fewer
instructions a weight is what makes it faster; a GPU's sweep (`--int4-tune`) decides. bfloat16 activations and
scales, symmetric groups of 128 (the bench's 4-bit target)."""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

# (form, rows a program, rows of the weight, a step's columns, warps, half): a decode step's launches, a DFlash
# block's, a verify's
LAUNCHES = (("gemv", 1, 32, 256, 4, False), ("gemv", 1, 64, 128, 4, False), ("words", 16, 64, 256, 4, False),
            ("words", 16, 64, 256, 4, True), ("words", 128, 64, 128, 8, False), ("words", 128, 64, 128, 8, True),
            ("words", 128, 64, 64, 8, False))
ARGUMENTS = {"x_ptr": "*bf16", "w_ptr": "*i32", "s_ptr": "*bf16", "z_ptr": "*i32", "p_ptr": "*fp32",
             **dict.fromkeys(("M", "N", "K", "WORDS", "GROUPS", "stride_xm", "SLICE"), "i32")}  # the rest constexpr


def loop_body(sass: str) -> list[str]:
    """The instructions of the longest loop in nvdisasm's listing (a label and the branch back to it)."""
    labels, instrs = {}, []
    for line in sass.splitlines():
        label = re.match(r"^\s*(\.L_x_\d+):", line)
        if label:
            labels[label.group(1)] = len(instrs)
            continue
        ins = re.match(r"^\s*/\*[0-9a-f]+\*/\s+(.*?)\s*;", line)
        if ins:
            instrs.append(ins.group(1))
    best: list[str] = []
    for i, ins in enumerate(instrs):
        back = re.search(r"BRA\s+(?:`\()?(\.L_x_\d+)", ins)
        if back and labels.get(back.group(1), i + 1) <= i and i + 1 - labels[back.group(1)] > len(best):
            best = instrs[labels[back.group(1)]:i + 1]
    return best


def opcode(ins: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", ins).split()[0].split(".")[0]


def count(form: str, rows: int, block_n: int, block_k: int, warps: int, half: bool) -> dict:
    """One launch compiled for sm_90a: instructions a thread issues per k step, per weight (a thread's share of
    the step's block_n x block_k weights), and the most common opcodes."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from ...engine.kernels.int4_gemm import triton_gemm as kernel

    fn = kernel._int4_gemv if form == "gemv" else kernel._int4_words
    consts = dict(GROUP=128, ASYM=False, BLOCK_N=block_n, BLOCK_K=block_k)
    if form == "words":
        consts.update(HALF=int(half), PRECISION="tf32", UPCAST=False, BLOCK_M=rows)
    signature = {a: ARGUMENTS.get(a, "constexpr") for a in fn.arg_names}
    compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=consts),
                              target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=3))
    nvdisasm = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        sass = subprocess.run([str(nvdisasm), "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
    body = loop_body(sass)
    ops = Counter(opcode(ins) for ins in body)
    per_weight = len(body) * 32 * warps / (block_n * block_k)
    return {"form": form, "rows": rows, "block_n": block_n, "block_k": block_k, "warps": warps, "half": half,
            "loop_instructions": len(body), "per_weight": round(per_weight, 2),
            "opcodes": dict(ops.most_common(10))}


def int4_sass() -> dict:
    """Each of LAUNCHES counted, or why it could not be (no Triton, no ptxas)."""
    try:
        return {"target": "sm_90a", "launches": [count(*launch) for launch in LAUNCHES]}
    except (ImportError, OSError, subprocess.CalledProcessError) as exc:
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
