"""Plain weights (float32, bfloat16, float16: a checkpoint with no quantization_config).

transformers loads a plain target as it is (engine/models.py: load_target) and the drafter's loader reads its
tensors as they are (its load_state_dict casts them), so this format converts nothing: `state` hands the tensors
over, `dequantize` is the identity. Its fast layout is `nn.Linear` itself, fused by the runner into one
`FusedLinear` per group of projections of one input and dtype (engine/fused.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar, Container, Iterable, Mapping

import torch
from torch import nn


@dataclass(frozen=True)
class FusedLinear:
    """One GEMM for several bias-free Linears of the same input: y = x W^T, split into their outputs."""

    weight: torch.Tensor  # [sum of out_features, in_features]
    sizes: tuple[int, ...]
    STACKS: ClassVar[dict[str, str]] = {"weight": "weight"}  # each stacked field: the parts' attribute it views

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.nn.functional.linear(x, self.weight).split(self.sizes, dim=-1)

    def ride(self, x: torch.Tensor, plain: FusedLinear) -> None:
        """A plain run never carries another in its launch."""
        return None


class PlainLayout:
    """nn.Linear as the runner runs it: parts of one dtype stack into a FusedLinear, any number of rows each."""

    module = nn.Linear
    fused = FusedLinear
    quantized = False

    def key(self, m: nn.Linear) -> tuple:
        return ("plain", m.weight.dtype)

    def whole(self, m: nn.Linear) -> bool:
        return True

    def fuse(self, mods: list[nn.Linear], stacked: Mapping[str, torch.Tensor], sizes: tuple[int, ...]) -> FusedLinear:
        return FusedLinear(stacked["weight"], sizes)


class PlainFormat:
    """Weights as stored: no quantization_config, nothing to check or convert."""

    name = "plain"
    methods: tuple[str, ...] = ()
    described = ""
    layout = PlainLayout()

    def spec(self, qc: Mapping, where: str) -> None:
        return None

    def check(self, name: str, parts: Mapping[str, torch.Tensor], spec, what: str) -> None:
        return None

    def state(self, names: Iterable[str], get: Callable[[str], torch.Tensor], spec, dtype: torch.dtype, what: str,
              keep: dict | None = None) -> dict[str, torch.Tensor]:
        """The tensors as they are (the model's loader casts them to its dtype)."""
        return {name: get(name) for name in names}

    def dequantize(self, parts: Mapping[str, torch.Tensor], spec) -> torch.Tensor:
        return parts[""].float()

    def parameters(self, name: str, shape: list[int], names: Container[str]) -> None:
        return None  # every plain tensor holds its size (the registry's default)

    def example(self) -> dict:
        return {}


FORMAT = PlainFormat()
