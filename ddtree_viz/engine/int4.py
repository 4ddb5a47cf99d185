"""4-bit weight-only checkpoints (W4A16) in compressed-tensors' pack-quantized layout, read by us.

The community 4-bit Qwen3.6-27B checkpoints (llm-compressor's AWQ / GPTQ / round-to-nearest W4A16 runs) are saved by
compressed-tensors in its "pack-quantized" format. config.json's `quantization_config` is {quant_method
"compressed-tensors", format "pack-quantized", config_groups {name: {targets, weights {num_bits 4, type "int",
symmetric, strategy "group" | "channel", group_size, actorder}, input_activations null}}, ignore [...]}; each
quantized Linear stores, in place of `weight`:

    weight_packed      int32 [out, ceil(in / 8)]: eight 4-bit fields a word, column 8w + i in bits 4i .. 4i+3, each
                       the signed value q in [-8, 7] stored as q + 8
    weight_scale       float [out, ceil(in / group)] (the model's dtype): one scale per row and group of columns
    weight_zero_point  int32 [ceil(out / 8), ceil(in / group)] (asymmetric only): the zero points z, packed as q is
                       but along the rows
    weight_g_idx       int [in] (activation order only): the group of each column, in place of column // group
    weight_shape       int [2]: (out, in)

and the real weight is (q - z) x scale (z = 0 when symmetric). Every other tensor (embeddings, lm_head, norms, the
ignored modules) is stored as is. As for the FP8 layout (engine/fp8.py, which dispatches here from `spec_of` and
`dequantize_state`), the weights are dequantized once at load, the product computed in float32 (exact: a 4-bit
integer times a bf16 scale) and only then cast to the dtype asked for; both engines then meet plain Linear weights.

Kept as stored (`keep`, what a target or drafter on one CUDA GPU gets, as FP8's): each quantized Linear becomes an
`Int4Linear` holding the checkpoint's parts (about half a byte a parameter: a 27B target in 17.7 GB with its bf16
embeddings and lm_head), whose forward computes the same function as the dequantized model: on CUDA the 4-bit GEMM
of engine/int4_gemm.py (the words, scales and zero points read as stored, unpacked in registers, each weight
rounded once to the activations' dtype); elsewhere the weight dequantized for the call and F.linear (on a CPU bit
for bit the model dequantized at load). The static runner fuses them as it fuses plain and FP8 Linears (FusedInt4Linear, engine/fused.py).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import sys
from dataclasses import dataclass
from typing import Callable, ClassVar, Iterable, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ModelLoadError

PARTS = ("weight_packed", "weight_scale", "weight_zero_point", "weight_g_idx", "weight_shape")
BITS = 4
PER_WORD = 32 // BITS
OFFSET = 1 << (BITS - 1)  # a field holds q + 8
STRATEGIES = ("group", "channel")


@dataclass(frozen=True)
class Int4Spec:
    """What a 4-bit checkpoint's quantization_config promises: the group each scale covers (0: a whole row, strategy
    "channel"), whether zero points are stored, how its words are laid out, and the layers it sets apart (`at`)."""

    group: int
    symmetric: bool
    ignore: tuple[str, ...] = ()  # as given (informational: the tensors decide)
    layout: str = "pack-quantized"  # as stored: "pack-quantized", GPTQ's, AWQ's or AutoRound's (int4_formats.py)
    # per-layer rules (AutoRound's extra_config, GPTQ's dynamic): (how, pattern, group, symmetric); how: "name" (the
    # pattern is the layer's name), "search" (a regex found in it: AutoRound's) or "match" (a regex matching it from
    # its start: GPTQ's); group None: the layer is left unquantized
    overrides: tuple[tuple[str, str, int | None, bool], ...] = ()

    def label(self, dtype: torch.dtype, kept: bool = False) -> str:
        """The precision as people read it, e.g. 'int4 w4a16 group 128 sym (dequantized to bfloat16)', or with the
        weights kept 'int4 w4a16 group 128 sym (4-bit weights, bfloat16 activations)'."""
        name = str(dtype).removeprefix("torch.")
        return f"{self.scheme} ({f'4-bit weights, {name} activations' if kept else f'dequantized to {name}'})"

    @property
    def scheme(self) -> str:
        """'int4 w4a16 group 128 sym', 'int4 w4a16 per channel asym', 'int4 w4a16 group 128 sym gptq', and where
        some layers are quantized otherwise 'int4 w4a16 group 128 sym auto_round:auto_gptq (2 layer rules)'."""
        groups = f"group {self.group}" if self.group else "per channel"
        stored = "" if self.layout == "pack-quantized" else f" {self.layout}"
        rules = sum(1 for *_, group, symmetric in self.overrides
                    if group is not None and (group, symmetric) != (self.group, self.symmetric))
        stored += f" ({rules} layer rule{'s' * (rules != 1)})" if rules else ""
        return f"int4 w4a16 {groups} {'sym' if self.symmetric else 'asym'}{stored}"

    def at(self, prefix: str) -> Int4Spec | None:
        """The spec of the weight whose tensors' names start with `prefix` ('model.layers.0.mlp.up_proj.'): the rule
        naming its layer exactly, else the first rule (in order) whose regex finds it, else this spec; None where
        that rule leaves the layer unquantized."""
        if not self.overrides:
            return self
        name = prefix.removesuffix(".")
        hit = next((o for o in self.overrides if o[0] == "name" and o[1] == name), None) or next(
            (o for o in self.overrides if o[0] != "name" and _finds(o[0], o[1], name)), None)
        if hit is None:
            return dataclasses.replace(self, overrides=())
        return None if hit[2] is None else dataclasses.replace(self, group=hit[2], symmetric=hit[3], overrides=())


@functools.lru_cache(maxsize=256)
def _regex(pattern: str) -> re.Pattern | None:
    """A rule's regex, or None where it is none (the checkpoint's tools skip those)."""
    try:
        return re.compile(pattern)
    except re.error:
        return None


def _finds(how: str, pattern: str, name: str) -> bool:
    regex = _regex(pattern)
    return regex is not None and (regex.search if how == "search" else regex.match)(name) is not None


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def spec_of(qc: Mapping, where: str) -> Int4Spec:
    """The spec of a compressed-tensors quantization_config (`where` names it in messages); a ModelLoadError for
    anything but 4-bit integer weights, group- or channel-wise, without activation quantization, packed."""
    fmt = qc.get("format")
    if qc.get("kv_cache_scheme"):
        raise ModelLoadError(f"{where}: a quantized KV cache (kv_cache_scheme) is not supported")
    sparsity = qc.get("sparsity_config")
    if isinstance(sparsity, Mapping) and sparsity.get("format", "dense") != "dense":
        raise ModelLoadError(f"{where}: sparse weights ({sparsity.get('format')!r}) are not supported")
    groups = qc.get("config_groups")
    if not isinstance(groups, Mapping) or not groups:
        raise ModelLoadError(f"{where}: config_groups must name at least one group of quantized modules")
    specs = set()
    for name, group in groups.items():
        if not isinstance(group, Mapping) or not isinstance(group.get("weights"), Mapping):
            raise ModelLoadError(f"{where}: config group {name!r} has no weights entry")
        if group.get("input_activations") or group.get("output_activations"):
            raise ModelLoadError(f"{where}: config group {name!r} quantizes activations; only weight-only "
                                 "checkpoints (W4A16) load")
        group_format = group.get("format") or fmt
        if group_format != "pack-quantized":
            raise ModelLoadError(f"{where}: format {group_format!r} is not supported (only 'pack-quantized')")
        specs.add(_weights_spec(group["weights"], f"{where} config group {name!r}"))
    if len(specs) != 1:
        raise ModelLoadError(f"{where}: config groups with different weight schemes are not supported")
    (spec,) = specs
    return Int4Spec(spec[0], spec[1], tuple(str(s) for s in qc.get("ignore") or ()))


def _weights_spec(w: Mapping, where: str) -> tuple[int, bool]:
    if w.get("num_bits") != BITS or w.get("type", "int") != "int":
        raise ModelLoadError(f"{where}: weights of {w.get('num_bits')!r} bits of type {w.get('type')!r} are not "
                             "supported (only 4-bit integers)")
    strategy = w.get("strategy")
    if strategy not in STRATEGIES:
        raise ModelLoadError(f"{where}: weight strategy {strategy!r} is not supported ({', '.join(STRATEGIES)})")
    if w.get("dynamic"):
        raise ModelLoadError(f"{where}: dynamic weight scales are not supported")
    group = w.get("group_size") if strategy == "group" else 0
    if strategy == "group" and not (_whole(group) and group >= 1):
        raise ModelLoadError(f"{where}: group_size must be a whole number >= 1, not {group!r}")
    symmetric = w.get("symmetric", True)
    if not isinstance(symmetric, bool):
        raise ModelLoadError(f"{where}: symmetric must be true or false, not {symmetric!r}")
    return group, symmetric


def stand_in(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """What a kept weight is loaded as while transformers loads the rest (dequantize_state's `keep`): zeros of its
    shape and `dtype` in one element of memory (a stride-0 view), whose storage tells fp8.keep_linears which Linear
    was loaded with it; the kept module replaces it, so a checkpoint's memory at load is its own size, not a
    dequantized model's (docs/lab/NOTEBOOK.md section 36: a 0.33B model's FP8 load +949 -> +54 MiB of host memory).
    """
    return torch.zeros(1, dtype=dtype, device=device).expand(shape)


def is_stand_in(t: torch.Tensor) -> bool:
    """A `stand_in` (or any tensor of more than one element in one element of memory)."""
    return t.dim() > 0 and t.numel() > 1 and all(stride == 0 for stride in t.stride())


def unpack(packed: torch.Tensor, count: int, dim: int) -> torch.Tensor:
    """int32 words -> their signed 4-bit values (int32), `count` of them along `dim` (1: a weight's columns, 0: its
    zero points' rows)."""
    shifts = torch.arange(PER_WORD, dtype=torch.int32, device=packed.device) * BITS
    if dim == 1:
        fields = (packed[:, :, None] >> shifts) & 0xF  # [rows, words, 8]
        return fields.reshape(packed.shape[0], -1)[:, :count] - OFFSET
    fields = (packed[:, None, :] >> shifts[None, :, None]) & 0xF  # [words, 8, cols]
    return fields.reshape(-1, packed.shape[1])[:count] - OFFSET


def pack(values: torch.Tensor, dim: int) -> torch.Tensor:
    """unpack's inverse: signed 4-bit values [rows, cols] -> int32 words along `dim` (the last word zero-padded)."""
    u = (values + OFFSET).to(torch.uint8)
    return pack_fields(u) if dim == 1 else pack_fields(u.T).T.contiguous()


def pack_fields(fields: torch.Tensor) -> torch.Tensor:
    """Unsigned 4-bit fields (uint8, 0 .. 15) [rows, cols] -> int32 words of eight along the columns, field j in
    bits 4j .. 4j+3 (the last word zero-padded): two fields a byte, four bytes a word read as one little-endian
    int32 (byte order asserted at import), in uint8 throughout (a 27B checkpoint's words are repacked at load)."""
    rows, cols = fields.shape
    u = torch.nn.functional.pad(fields, (0, -cols % PER_WORD))
    return (u[:, 0::2] | (u[:, 1::2] << BITS)).contiguous().view(-1).view(torch.int32).reshape(rows, -1)


assert sys.byteorder == "little", "pack_fields reads four bytes as one little-endian int32"


def groups_of(columns: int, spec: Int4Spec, g_idx: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    """Each column's group: the checkpoint's g_idx (activation order), else column // group (on `device`)."""
    if g_idx is not None:
        return g_idx.long().to(device)
    return torch.arange(columns, device=device) // (spec.group or columns)


def dequantize(parts: Mapping[str, torch.Tensor], spec: Int4Spec) -> torch.Tensor:
    """(q - z) x scale in float32 (exact), [out, in], from one weight's checked parts."""
    out, inn = (int(d) for d in parts["weight_shape"].tolist())
    groups = groups_of(inn, spec, parts.get("weight_g_idx"), parts["weight_packed"].device)
    q = unpack(parts["weight_packed"], inn, 1).float()
    if not spec.symmetric:
        q = q - unpack(parts["weight_zero_point"], out, 0).float()[:, groups]
    return q * parts["weight_scale"].float()[:, groups]


def quantize(weight: torch.Tensor, spec: Int4Spec,
             scale_dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """A weight [out, in] in the layout, round to nearest per group (the tests' checkpoints; llm-compressor's AWQ
    and GPTQ choose the values otherwise, the layout is the same): its parts by name."""
    out, inn = weight.shape
    group = spec.group or inn
    n = math.ceil(inn / group)
    tiles = torch.nn.functional.pad(weight.float(), (0, n * group - inn)).reshape(out, n, group)
    if spec.symmetric:
        scale = (tiles.abs().amax(-1) / 7).clamp(min=1e-8).to(scale_dtype)
        zero = torch.zeros(out, n, device=weight.device)
    else:
        lo, hi = tiles.amin(-1).clamp(max=0), tiles.amax(-1).clamp(min=0)
        scale = ((hi - lo) / 15).clamp(min=1e-8).to(scale_dtype)
        zero = (torch.round(-lo / scale.float()) - OFFSET).clamp(-OFFSET, OFFSET - 1)
    q = (torch.round(tiles / scale.float()[..., None]) + zero[..., None]).clamp(-OFFSET, OFFSET - 1)
    parts = {"weight_packed": pack(q.reshape(out, -1)[:, :inn], 1), "weight_scale": scale,
             "weight_shape": torch.tensor([out, inn], dtype=torch.int64, device=weight.device)}
    if not spec.symmetric:
        parts["weight_zero_point"] = pack(zero, 0)
    return parts


def quantize_state(state: Mapping[str, torch.Tensor], spec: Int4Spec,
                   convert: Callable[[str], bool]) -> dict[str, torch.Tensor]:
    """A plain state dict in the layout: each 2-D weight `convert(name)` picks becomes its parts."""
    return convert_weights(state, convert, lambda name, w: {name.removesuffix("weight") + part: t
                                                             for part, t in quantize(w, spec).items()})


def convert_weights(state: Mapping[str, torch.Tensor], convert: Callable[[str], bool],
                    stored: Callable[[str, torch.Tensor], dict]) -> dict[str, torch.Tensor]:
    """A plain state dict in a quantized layout (this one's, or fp8's): each 2-D weight `convert(name)` picks
    replaced by the tensors `stored(name, weight)` makes (name -> tensor), every other tensor kept (the tests' and
    benches' checkpoints)."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if name.endswith(".weight") and tensor.dim() == 2 and convert(name):
            out.update(stored(name, tensor))
        else:
            out[name] = tensor.detach().contiguous()
    return out


def config_entry(spec: Int4Spec) -> dict:
    """The quantization_config llm-compressor writes for a W4A16 run (one group over every Linear)."""
    weights = {"num_bits": BITS, "type": "int", "symmetric": spec.symmetric, "dynamic": False,
               "strategy": "group" if spec.group else "channel", "group_size": spec.group or None, "actorder": None}
    return {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None,
                                          "output_activations": None}},
            "ignore": list(spec.ignore)}


def refuse_nonfinite(tensor: torch.Tensor, name: str, what: str) -> None:
    """A loaded scale (or codebook) that holds NaN or inf refused, naming the tensor: every weight it multiplies
    would be NaN or inf, the logits NaN and the argmax token 0, an output that still matches a greedy reference made
    the same way. The quantized readers (fp8.py, this one, int4_formats.py) and DFlash2's codebooks call it once a
    tensor at load; one isfinite over the scales (about 1/128 of the weights), not over the weights."""
    finite = torch.isfinite(tensor)
    if bool(finite.all()):
        return
    bad = (~finite).nonzero()
    nan = int(torch.isnan(tensor).sum())
    kinds = " and ".join(k for k, n in (("NaN", nan), ("inf", bad.shape[0] - nan)) if n)
    raise ModelLoadError(f"{what} tensor {name} holds {bad.shape[0]} non-finite value{'s' * (bad.shape[0] != 1)} "
                         f"({kinds}; the first at {bad[0].tolist()}): the weights it scales would be NaN or inf and "
                         "every output token garbage. The checkpoint is damaged or badly exported: download it again "
                         "or quantize it again (a checkpoint whose scales are all finite loads)")


def _check(prefix: str, parts: Mapping[str, torch.Tensor], spec: Int4Spec, what: str) -> None:
    """One quantized weight's parts against the layout; the message names the tensor."""
    def fail(part: str, why: str):
        raise ModelLoadError(f"{what} tensor {prefix}{part} {why}")

    for part in ("weight_packed", "weight_scale", "weight_shape") + (() if spec.symmetric else ("weight_zero_point",)):
        if part not in parts:
            raise ModelLoadError(f"{what} weight {prefix}weight is packed but {prefix}{part} is missing")
    shape = parts["weight_shape"]
    if shape.dim() != 1 or shape.numel() != 2 or shape.is_floating_point() or min(shape.tolist()) < 1:
        fail("weight_shape", f"must hold (out, in), not {shape.tolist()}")
    out, inn = (int(d) for d in shape.tolist())
    n = math.ceil(inn / spec.group) if spec.group else 1
    want = {"weight_packed": ((out, math.ceil(inn / PER_WORD)), (torch.int32,)),
            "weight_scale": ((out, n), (torch.bfloat16, torch.float16, torch.float32)),
            "weight_zero_point": ((math.ceil(out / PER_WORD), n), (torch.int32,)),
            "weight_g_idx": ((inn,), (torch.int32, torch.int64))}
    for part, (dims, dtypes) in want.items():
        t = parts.get(part)
        if t is None or (part == "weight_zero_point" and spec.symmetric):
            continue
        if t.dtype not in dtypes:
            names = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
            fail(part, f"is {str(t.dtype).removeprefix('torch.')}, not {names}")
        if tuple(t.shape) != dims:
            fail(part, f"has shape {list(t.shape)}; weight [{out}, {inn}]"
                       f"{f' in groups of {spec.group}' if spec.group else ''} needs {list(dims)}")
    g_idx = parts.get("weight_g_idx")
    if g_idx is not None and (g_idx.min() < 0 or g_idx.max() >= n):
        fail("weight_g_idx", f"names groups outside 0 .. {n - 1}")
    if spec.layout == "pack-quantized":  # (GPTQ's, AWQ's, AutoRound's scales: checked by name as read there)
        refuse_nonfinite(parts["weight_scale"], prefix + "weight_scale", what)


def dequantize_state(names: Iterable[str], get: Callable[[str], torch.Tensor], spec: Int4Spec,
                     dtype: torch.dtype, what: str, keep: dict | None = None) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors as a plain state dict in `dtype`: each packed weight's parts as its `weight`
    ((q - z) x scale in float32, then cast), every other tensor cast as is. Refused, naming the tensor: a part
    missing, of the wrong shape or dtype, or without its packed weight, a scale holding NaN or inf. Each weight is read under its own spec
    (`spec.at`: AutoRound's extra_config, GPTQ's dynamic; refused where they leave it unquantized). With `keep` (a dict), each
    packed weight goes in as its `stand_in` (fp8.keep_linears replaces it) and keep[name] = (the stand-in, a
    function (device, bias) -> the Int4Linear of its parts)."""
    names = list(names)
    present = set(names)
    packed = {n.removesuffix("weight_packed") for n in names if n.endswith("weight_packed")}
    state: dict[str, torch.Tensor] = {}
    for name in names:
        part = next((p for p in PARTS if name.endswith(p) and name.removesuffix(p) in packed), None)
        if part is not None:
            if part == "weight_packed":
                prefix = name.removesuffix(part)
                parts = {p: get(prefix + p) for p in PARTS if prefix + p in present}
                mine = spec.at(prefix)
                if mine is None:
                    raise ModelLoadError(f"{what} weight {prefix}weight is packed but the config leaves "
                                         f"{prefix.removesuffix('.')} unquantized")
                _check(prefix, parts, mine, what)
                if keep is None:
                    state[prefix + "weight"] = dequantize(parts, mine).to(dtype)
                else:
                    shape = (int(parts["weight_shape"][0]), int(parts["weight_shape"][1]))
                    values = stand_in(shape, dtype, parts["weight_packed"].device)
                    keep[prefix + "weight"] = (values, _maker(parts, mine))
                    state[prefix + "weight"] = values
            continue
        orphan = next((p for p in PARTS if name.endswith(p)), None)
        if orphan is not None:
            raise ModelLoadError(f"{what} tensor {name} has no packed weight {name.removesuffix(orphan)}weight_packed")
        tensor = get(name)
        state[name] = tensor.to(dtype) if tensor.is_floating_point() else tensor
    return state


# ------------------------------------------------------------------------------------------------------------
# 4-bit weights kept: Int4Linear and its function
# ------------------------------------------------------------------------------------------------------------


@functools.cache
def _gemm_module():
    """engine/int4_gemm.py (Triton at its top) where Triton imports, else None."""
    try:
        from . import int4_gemm
    except ImportError:
        return None
    return int4_gemm


def linear(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None,
           g_idx: torch.Tensor | None, group: int) -> torch.Tensor:
    """y = x W^T in x's dtype, W = (q - z) x scale from the packed parts (`group`: the columns a scale covers, x's
    width for one scale a row): the dequantized model's function. On CUDA the Triton GEMM reads the parts as stored;
    elsewhere the weight is dequantized for this call (float32 product, cast once) and multiplied by F.linear (on a
    CPU bit for bit the model dequantized at load)."""
    gemm = _gemm_module() if x.is_cuda else None
    if gemm is not None:
        return gemm.int4_linear(x, packed, scale, zero, g_idx, group)
    parts = {"weight_packed": packed, "weight_scale": scale, "weight_zero_point": zero, "weight_g_idx": g_idx,
             "weight_shape": torch.tensor([packed.shape[0], x.shape[-1]])}
    weight = dequantize({k: v for k, v in parts.items() if v is not None}, Int4Spec(group, zero is None))
    return F.linear(x, weight.to(device=x.device, dtype=x.dtype))


class Int4Linear(nn.Module):
    """A Linear kept as the checkpoint stores it (its parts by their names: weight_packed, weight_scale, and where
    stored weight_zero_point and weight_g_idx; weight_shape), computing the dequantized model's function: on CUDA
    the 4-bit GEMM, elsewhere the weight dequantized for the call (float32 product, cast once) and F.linear.
    transformers' forward calls it like the Linear it replaces."""

    def __init__(self, parts: Mapping[str, torch.Tensor], spec: Int4Spec, bias: torch.Tensor | None = None):
        super().__init__()
        self.out_features, self.in_features = (int(d) for d in parts["weight_shape"].tolist())
        self.spec = spec
        self.group = spec.group or self.in_features
        for name in PARTS:
            tensor = parts.get(name) if name != "weight_zero_point" or not spec.symmetric else None
            if name in ("weight_packed", "weight_scale", "weight_zero_point"):
                self.register_parameter(name, None if tensor is None else nn.Parameter(tensor, requires_grad=False))
            else:
                self.register_buffer(name, tensor)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    def parts(self) -> dict[str, torch.Tensor]:
        return {name: t for name in PARTS if (t := getattr(self, name)) is not None}

    def dequantized(self) -> torch.Tensor:
        """The real weight, (q - z) x scale in float32."""
        return dequantize(self.parts(), self.spec)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = linear(x, self.weight_packed, self.weight_scale, self.weight_zero_point, self.weight_g_idx, self.group)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.spec.scheme}"


@dataclass(frozen=True)
class FusedInt4Linear:
    """fused.FusedLinear's 4-bit kind: several Int4Linears of one input (one group size and zero-point scheme, no
    activation order) as one packed weight (their words, scales and zero points stacked by rows; each part but the
    last a multiple of 8 rows where zero points are packed along them); y = x W^T split into their outputs."""

    packed: torch.Tensor  # [sum of out_features, ceil(in / 8)] int32
    scale: torch.Tensor  # [sum of out_features, groups]
    zero: torch.Tensor | None  # [ceil(rows / 8), groups] int32, asymmetric only
    group: int
    sizes: tuple[int, ...]
    STACKS: ClassVar[dict[str, str]] = {"packed": "weight_packed", "scale": "weight_scale", "zero": "weight_zero_point"}

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return linear(x, self.packed, self.scale, self.zero, None, self.group).split(self.sizes, dim=-1)


def _maker(parts: Mapping[str, torch.Tensor], spec: Int4Spec) -> Callable[[torch.device, torch.Tensor | None],
                                                                          Int4Linear]:
    """What fp8.keep_linears calls for a kept weight: its Int4Linear on `device`, with `bias`."""
    return lambda device, bias: Int4Linear({k: v.to(device) for k, v in parts.items()}, spec, bias)


@torch.no_grad()
def quantize_linears(model: nn.Module, spec: Int4Spec, skip: Iterable[str] = ()) -> int:
    """Every Linear of `model` whose name has none of `skip` in it replaced by an Int4Linear of its weight quantized
    (`quantize`, on the weight's device), one at a time. The bench's and the GPU tests' 4-bit models. Returns how
    many."""
    return replace_linears(model, skip, lambda weight, bias: Int4Linear(quantize(weight, spec), spec, bias))


@torch.no_grad()
def replace_linears(model: nn.Module, skip: Iterable[str], make: Callable[[torch.Tensor, torch.Tensor | None],
                                                                          nn.Module]) -> int:
    """Every plain Linear of `model` whose name has none of `skip` in it replaced by make(weight, bias) (this
    module's and fp8.py's quantize_linears), one at a time. Returns how many."""
    skip = tuple(skip)
    done = 0
    for name, module in list(model.named_modules()):
        if type(module) is nn.Linear and not any(s in name for s in skip):
            bias = None if module.bias is None else module.bias.detach()
            owner, attr = owner_of(model, name)
            setattr(owner, attr, make(module.weight.detach(), bias))
            done += 1
    return done


def owner_of(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    """The module holding submodule `name` and its attribute name there."""
    parent, _, attr = name.rpartition(".")
    return (model.get_submodule(parent) if parent else model), attr
