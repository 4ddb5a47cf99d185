"""What the 4-bit formats share: the layout every one of them is read as, loaded and kept in.

That layout is compressed-tensors' "pack-quantized" one (compressed_tensors.py reads its config): each quantized
Linear stores, in place of `weight`:

    weight_packed      int32 [out, ceil(in / 8)]: eight 4-bit fields a word, column 8w + i in bits 4i .. 4i+3, each
                       the signed value q in [-8, 7] stored as q + 8
    weight_scale       float [out, ceil(in / group)] (the model's dtype): one scale per row and group of columns
    weight_zero_point  int32 [ceil(out / 8), ceil(in / group)] (asymmetric only): the zero points z, packed as q is
                       but along the rows
    weight_g_idx       int [in] (activation order only): the group of each column, in place of column // group
    weight_shape       int [2]: (out, in)

and the real weight is (q - z) x scale (z = 0 when symmetric). Every other tensor (embeddings, lm_head, norms, the
ignored modules) is stored as is. GPTQ's, AWQ's and AutoRound's tensors are translated into these parts as they are
read (`translate`, each format's `convert`), so every 4-bit format loads through `dequantize_state`: the weights
dequantized once at load, the product computed in float32 (exact: a 4-bit integer times a bf16 scale) and only then
cast to the dtype asked for; both engines then meet plain Linear weights. Each weight is read under its own spec
(`Int4Spec.at`: GPTQ's `dynamic`, AutoRound's `extra_config`, as per-layer rules of one shape, `rules`).

Kept as stored (`keep`, what a target or drafter on one CUDA GPU gets, as FP8's): each quantized Linear becomes an
`Int4Linear` holding the checkpoint's parts (about half a byte a parameter: a 27B target in 17.7 GB with its bf16
embeddings and lm_head), whose forward computes the same function as the dequantized model: on CUDA the 4-bit GEMM
of engine/kernels/int4_gemm/ (the words, scales and zero points read as stored, unpacked in registers, each weight
rounded once to the activations' dtype); elsewhere the weight dequantized for the call and F.linear (on a CPU bit
for bit the model dequantized at load). The static runner fuses them as it fuses plain and FP8 Linears (LAYOUT:
FusedInt4Linear, engine/fused.py).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import sys
from dataclasses import dataclass
from typing import Callable, ClassVar, Container, Iterable, Mapping

import torch
from torch import nn

from ...errors import ModelLoadError
from ...words import plural
from ..kernels.int4_gemm.dispatch import gemm_module as _gemm_module, linear  # noqa: F401 (this kind's)
from ..kernels.int4_gemm.naive import BITS, OFFSET, PER_WORD, dequantize_words, unpack  # noqa: F401 (the words')
from .base import replace_linears, stand_in, whole_number
from .plain import FusedLinear

PARTS = ("weight_packed", "weight_scale", "weight_zero_point", "weight_g_idx", "weight_shape")
SYMMETRIC_ZERO = 8  # the unsigned zero point of a symmetric 4-bit weight (GPTQ v2's, AWQ's; stored as 7 in GPTQ v1)


@dataclass(frozen=True)
class Int4Spec:
    """What a 4-bit checkpoint's quantization_config promises: the group each scale covers (0: a whole row, strategy
    "channel"), whether zero points are stored, how its words are laid out, and the layers it sets apart (`at`)."""

    group: int
    symmetric: bool
    ignore: tuple[str, ...] = ()  # as given (informational: the tensors decide)
    layout: str = "pack-quantized"  # as stored: "pack-quantized", "gptq", "gptq_v2", "awq" or AutoRound's packing
    # per-layer rules (AutoRound's extra_config, GPTQ's dynamic): (how, pattern, group, symmetric); how: "name" (the
    # pattern is the layer's name), "search" (a regex found in it: AutoRound's) or "match" (a regex matching it from
    # its start: GPTQ's); group None: the layer is left unquantized
    overrides: tuple[tuple[str, str, int | None, bool], ...] = ()
    format: str = "compressed-tensors"  # the registry's name of its reader (gptq, awq, autoround: theirs)

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
        stored += f" ({plural(rules, 'layer rule')})" if rules else ""
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


def dequantize(parts: Mapping[str, torch.Tensor], spec: Int4Spec) -> torch.Tensor:
    """(q - z) x scale in float32 (exact), [out, in], from one weight's checked parts (kernels/int4_gemm/naive.py's
    dequantize_words)."""
    out, inn = (int(d) for d in parts["weight_shape"].tolist())
    zero = None if spec.symmetric else parts["weight_zero_point"]
    return dequantize_words(parts["weight_packed"], parts["weight_scale"], zero, parts.get("weight_g_idx"), spec.group,
                            (out, inn))


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
             # (on the host for a weight on the meta device, the memory plan's: a shape is read back at once)
             "weight_shape": torch.tensor([out, inn], dtype=torch.int64,
                                          device="cpu" if weight.is_meta else weight.device)}
    if not spec.symmetric:
        parts["weight_zero_point"] = pack(zero, 0)
    return parts


def check(prefix: str, parts: Mapping[str, torch.Tensor], spec: Int4Spec, what: str) -> None:
    """One quantized weight's parts against the layout (their scales' values apart: each format checks those as it
    reads them, by their stored names); the message names the tensor."""
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


def dequantize_state(names: Iterable[str], get: Callable[[str], torch.Tensor], spec: Int4Spec, dtype: torch.dtype,
                     what: str, keep: dict | None = None, checked: Callable = check) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors as a plain state dict in `dtype`: each packed weight's parts as its `weight`
    ((q - z) x scale in float32, then cast), every other tensor cast as is. Refused, naming the tensor: a part
    missing, of the wrong shape or dtype, or without its packed weight, a scale holding NaN or inf. Each weight is read under its own spec
    (`spec.at`: AutoRound's extra_config, GPTQ's dynamic; refused where they leave it unquantized). With `keep` (a dict), each
    packed weight goes in as its base.stand_in (load.keep_linears replaces it) and keep[name] = (the stand-in, a
    function (device, bias) -> the Int4Linear of its parts). `checked(prefix, parts, spec, what)`: each weight's
    parts checked (`check`, and a format's own checks)."""
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
                checked(prefix, parts, mine, what)
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

    def stored_bytes(self) -> tuple[int, int]:
        """(the weight's bytes: its words and zero points, its scales' bytes) as kept: what a step reads of it."""
        size = {name: t.numel() * t.element_size() for name, t in self.parts().items()}
        return size["weight_packed"] + size.get("weight_zero_point", 0), size["weight_scale"]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = linear(x, self.weight_packed, self.weight_scale, self.weight_zero_point, self.weight_g_idx, self.group)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.spec.scheme}"


@dataclass(frozen=True)
class FusedInt4Linear:
    """plain.FusedLinear's 4-bit kind: several Int4Linears of one input (one group size and zero-point scheme, no
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

    def ride(self, x: torch.Tensor, plain: FusedLinear) -> None:
        """No plain run rides a 4-bit launch."""
        return None


def _maker(parts: Mapping[str, torch.Tensor], spec: Int4Spec) -> Callable[[torch.device, torch.Tensor | None],
                                                                          Int4Linear]:
    """What load.keep_linears calls for a kept weight: its Int4Linear on `device`, with `bias`."""
    return lambda device, bias: Int4Linear({k: v.to(device) for k, v in parts.items()}, spec, bias)


@torch.no_grad()
def quantize_linears(model: nn.Module, spec: Int4Spec, skip: Iterable[str] = ()) -> int:
    """Every Linear of `model` whose name has none of `skip` in it replaced by an Int4Linear of its weight quantized
    (`quantize`, on the weight's device), one at a time. The bench's and the GPU tests' 4-bit models. Returns how
    many."""
    return replace_linears(model, skip, lambda weight, bias: Int4Linear(quantize(weight, spec), spec, bias))


class Int4Layout:
    """Int4Linear as the runner runs it: parts of one group size, zero-point scheme and scale dtype without
    activation order (each column's group its own) stack their words, scales and zero points (FusedInt4Linear), a
    run going on past a part with zero points only where it is a multiple of 8 rows (they are packed 8 rows a word)."""

    module = Int4Linear
    fused = FusedInt4Linear
    quantized = True

    def key(self, m: Int4Linear) -> tuple | None:
        if m.weight_g_idx is not None:
            return None
        return ("int4", m.group, m.weight_zero_point is None, m.weight_scale.dtype)

    def whole(self, m: Int4Linear) -> bool:
        return m.weight_zero_point is None or m.out_features % PER_WORD == 0

    def fuse(self, mods: list[Int4Linear], stacked: Mapping[str, torch.Tensor | None], sizes: tuple[int, ...]
             ) -> FusedInt4Linear:
        return FusedInt4Linear(stacked["packed"], stacked["scale"], stacked["zero"], mods[0].group, sizes)


LAYOUT = Int4Layout()  # every 4-bit format's fast layout


# ------------------------------------------------------------------------------------------------------------
# What GPTQ's, AWQ's and AutoRound's configs and tensors share: group sizes, per-layer rules, qweight words
# ------------------------------------------------------------------------------------------------------------


def group_size(qc: Mapping, where: str) -> int:
    """A GPTQ / AWQ / AutoRound config's group_size as Int4Spec's group (0: one group a row, their -1)."""
    group = qc.get("group_size", 128)
    if not (whole_number(group) and (group >= 1 or group == -1)):
        raise ModelLoadError(f"{where}: group_size must be a whole number >= 1 or -1, not {group!r}")
    return max(group, 0)


def rules(table, name: str, where: str, rule: Callable[[str, Mapping, str], tuple]) -> tuple[tuple, ...]:
    """A config's per-layer table (AutoRound's extra_config, GPTQ's dynamic: {key: {bits, group_size, sym, ...}})
    as Int4Spec.overrides, in order, each entry made by rule(key, entry, where it is for messages)."""
    table = {} if table is None else table
    if not isinstance(table, Mapping):
        raise ModelLoadError(f"{where}: {name} must be a JSON object, not {table!r}")
    out = []
    for key, entry in table.items():
        if not isinstance(entry, Mapping):
            raise ModelLoadError(f"{where} {name} {key!r} must be a JSON object, not {entry!r}")
        out.append(rule(str(key), entry, f"{where} {name} {key!r}"))
    return tuple(out)


def qweight_parameters(name: str, shape: list[int], names: Container[str], parts: tuple[str, ...]) -> int | None:
    """The parameters a GPTQ- or AWQ-packed tensor holds (`parts`: the format's, qweight first): its qweight's words
    eight each, its other parts (scales, zero points, groups) none where their weight's qweight is stored; None for
    any other tensor."""
    part = name.rpartition(".")[2]
    prefix = name.removesuffix(part)
    if part in parts[1:] and prefix.endswith(".") and prefix + parts[0] in names:
        return 0
    return math.prod(shape) * PER_WORD if part == parts[0] else None


def plain_groups(g_idx: torch.Tensor, group: int) -> bool:
    """Whether a g_idx is the plain column // group (no activation order)."""
    g_idx = g_idx.long()
    return torch.equal(g_idx, torch.arange(g_idx.numel(), device=g_idx.device) // (group or max(1, g_idx.numel())))


def _part_of(name: str, parts: tuple[str, ...]) -> str | None:
    return next((p for p in parts if name == p or name.endswith("." + p)), None)


def translate(names: Iterable[str], get: Callable[[str], torch.Tensor], spec: Int4Spec, what: str,
              parts_of: tuple[str, ...], convert: Callable) -> tuple[list[str], Callable[[str], torch.Tensor]]:
    """A checkpoint's tensor names and reader in another 4-bit layout (`parts_of`: its parts' names, the packed
    words first; GPTQ's, AWQ's) as this layout's (dequantize_state's `names` and `get`): each weight's parts
    translated by convert(prefix, its parts by name, its spec, what) under its own spec (`spec.at`) when its first
    part is read (one weight held at a time), every other tensor as it is. Refused, naming the tensor: a part without
    its packed words, a packed weight the config's per-layer rules leave unquantized."""
    words = parts_of[0]
    names = list(names)
    present = set(names)
    packed = {n.removesuffix(words) for n in names if _part_of(n, parts_of) == words}
    specs = {prefix: spec.at(prefix) for prefix in packed}  # each weight's own (AutoRound's extra_config)
    out: list[str] = []
    for name in names:
        part = _part_of(name, parts_of)
        prefix = name.removesuffix(part) if part else ""
        if part is None:
            out.append(name)
        elif prefix not in packed:
            raise ModelLoadError(f"{what} tensor {name} has no packed weight {prefix}{words}")
        elif specs[prefix] is None:
            raise ModelLoadError(f"{what} weight {prefix}{words} is packed but the config's per-layer rules "
                                 f"(extra_config, dynamic) leave {prefix.removesuffix('.')} unquantized")
        elif part == words:
            mine = specs[prefix]
            plain = ("g_idx" not in parts_of or prefix + "g_idx" not in present
                     or plain_groups(get(prefix + "g_idx"), mine.group))
            out += [prefix + p for p in ("weight_packed", "weight_scale", "weight_shape")
                    + (() if mine.symmetric else ("weight_zero_point",)) + (() if plain else ("weight_g_idx",))]
    done: dict[str, dict[str, torch.Tensor]] = {}

    def read(name: str) -> torch.Tensor:
        part = next((p for p in PARTS if name.endswith(p) and name.removesuffix(p) in packed), None)
        if part is None:
            return get(name)
        prefix = name.removesuffix(part)
        if prefix not in done:
            done.clear()  # one weight's translation held at a time
            done[prefix] = convert(prefix, {p: get(prefix + p) for p in parts_of if prefix + p in present},
                                   specs[prefix], what)
        return done[prefix][part]

    return out, read
