"""DFlash2 drafters (z-lab / inco.ai, August 2026; ../shared/REFERENCE.md "DFlash2 drafters"), written here.

The DFlash backbone (drafter.py) plus two modules that `dflash_config` switches on:

- a grouped dynamic causal convolution around each sublayer (`attention_conv`, `mlp_conv`): kernel size k, group
  size g; `kernel_projection(x)` gives per position dynamic taps for the H/g channel groups, twice (s = 0: before
  the sublayer, s = 1: after). At block position t, channel c:
      out[t, c] = sum_{o < k} (base_kernel[s, o, c] + dyn[t, s, o, c // g]) * x[t - o, c]
  with x[t - o] = 0 before the block's start (the context never enters the convolution). `prepare` runs on the
  sublayer's normed input and returns the "after" taps (made from that same input), which `finish` applies to the
  sublayer's output. kernel_projection's rows are read as [2, k, H/g] (s, then o, then the group).
- a candidate selector: the drafter's logits (`compute_logits`) give top-K candidates per block position with unary
  scores U; the pair score of candidate b after token a at block position t is
      S_t(a, b) = U_t(b) + < predecessor_codebook[a] * hidden_projection(h_t), successor_codebook[b] >
  (rank R). The predecessor of depth 1 is the root; of depth d > 1, one of depth d - 1's candidates.

DFlash2's own chain walks from the root taking the best successor (engine/tree.py: selector_chain), and DDTree can
grow its tree over log_softmax_b S_t(a, b) (tree scoring `selector`): a first-order Markov model over the top-K whose
scores only fall along a path, so best-first search still yields the budget's best prefixes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ddtree_viz.errors import ModelLoadError

from .drafter import DFlashConfig, DFlashDecoderLayer, DFlashDrafter
from .weights.base import refuse_nonfinite

ARCHITECTURE = "DFlash2DraftModel"
DFLASH2_FIELDS = ("conv_group_size", "conv_kernel_size", "selector_rank", "selector_top_k")
CODEBOOKS = ("candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook")


@dataclass(frozen=True)
class DFlash2Config(DFlashConfig):
    conv_group_size: int = 16
    conv_kernel_size: int = 2
    selector_rank: int = 256
    selector_top_k: int = 16

    @classmethod
    def from_dict(cls, d: dict) -> "DFlash2Config":
        """The backbone as DFlash's config reads it, then dflash_config's four DFlash2 fields, each required, whole
        and in range (the group size must divide the hidden size; top-K at most the vocabulary)."""
        base = DFlashConfig.from_dict(d)
        dflash = d.get("dflash_config") if isinstance(d.get("dflash_config"), dict) else {}
        extra = {}
        for name in DFLASH2_FIELDS:
            value = dflash.get(name, d.get(name))
            if value is None:
                raise ModelLoadError(f"DFlash2 drafter config is missing dflash_config.{name}.")
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ModelLoadError(f"DFlash2 drafter config: dflash_config.{name} must be a whole number >= 1, "
                                     f"got {value!r}.")
            extra[name] = value
        if base.hidden_size % extra["conv_group_size"]:
            raise ModelLoadError(f"DFlash2 drafter config: dflash_config.conv_group_size {extra['conv_group_size']} "
                                 f"does not divide hidden_size {base.hidden_size}.")
        if extra["selector_top_k"] > base.vocab_size:
            raise ModelLoadError(f"DFlash2 drafter config: dflash_config.selector_top_k {extra['selector_top_k']} "
                                 f"is larger than vocab_size {base.vocab_size}.")
        return cls(**{f.name: getattr(base, f.name) for f in dataclasses.fields(DFlashConfig)}, **extra)

    def to_dict(self) -> dict:
        d = super().to_dict()
        for name in DFLASH2_FIELDS:
            d["dflash_config"][name] = d.pop(name)
        d["architectures"] = [ARCHITECTURE]
        return d


class GroupedDynamicCausalConv(nn.Module):
    """The convolution around one sublayer (the module docstring has the formula)."""

    def __init__(self, hidden: int, kernel: int, group: int):
        super().__init__()
        self.kernel, self.group = kernel, group
        # training packs several blocks of `segment` positions in one row (train/distill.py): each convolves alone
        self.segment: int | None = None
        self.base_kernel = nn.Parameter(torch.zeros(2, kernel, hidden))
        self.kernel_projection = nn.Linear(hidden, 2 * kernel * (hidden // group), bias=False)

    def taps(self, x: Tensor) -> Tensor:
        """[B, L, 2, k, H]: every channel's taps at every block position (base + its group's dynamic tap)."""
        B, L, H = x.shape
        dyn = self.kernel_projection(x).view(B, L, 2, self.kernel, H // self.group)
        return self.base_kernel + dyn.repeat_interleave(self.group, dim=-1)

    @staticmethod
    def convolve(taps: Tensor, x: Tensor) -> Tensor:
        """sum_o taps[:, t, o] * x[:, t - o] over the block (zero before its start); taps [B, L, k, H], x [B, L, H]."""
        L = x.shape[1]
        out = taps[:, :, 0] * x
        for o in range(1, taps.shape[2]):
            out = out + taps[:, :, o] * F.pad(x, (0, 0, o, 0))[:, :L]
        return out

    def prepare(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The normed input convolved with the "before" taps, and the "after" taps for `finish`."""
        taps = self.taps(x)
        return self._blocks(taps[:, :, 0], x), taps[:, :, 1]

    def finish(self, y: Tensor, after: Tensor) -> Tensor:
        return self._blocks(after, y)

    def _blocks(self, taps: Tensor, x: Tensor) -> Tensor:
        """convolve, each packed block of `segment` positions on its own (a row of L = n * segment positions)."""
        B, L, H = x.shape
        s = self.segment
        if s is None or L <= s or L % s:
            return self.convolve(taps, x)
        out = self.convolve(taps.reshape(B * L // s, s, *taps.shape[2:]), x.reshape(B * L // s, s, H))
        return out.reshape(B, L, H)


class DFlash2DecoderLayer(DFlashDecoderLayer):
    def __init__(self, c: DFlash2Config, layer_idx: int):
        super().__init__(c, layer_idx)
        self.attention_conv = GroupedDynamicCausalConv(c.hidden_size, c.conv_kernel_size, c.conv_group_size)
        self.mlp_conv = GroupedDynamicCausalConv(c.hidden_size, c.conv_kernel_size, c.conv_group_size)

    def attention_input(self, x):
        return self.attention_conv.prepare(self.input_layernorm(x))

    def attention_output(self, y, after):
        return self.attention_conv.finish(y, after)

    def mlp_block(self, x):
        h, after = self.mlp_conv.prepare(self.post_attention_layernorm(x))
        return self.mlp_conv.finish(self.mlp(h), after)


@dataclass(frozen=True)
class SelectorScores:
    """One proposal's selector output (float32, on the host). D = drafted depths, K = candidates per depth.

    ids [D, K]: the top-K candidates per depth, best unary first; unary [D, K]: their scores U; root [K]: S_1(root, b);
    pair [D-1, K, K]: pair[d-2, i, j] = S_d(ids[d-2, i], ids[d-1, j]) for depths d >= 2; cond_root, cond_pair: their
    log_softmax over the K successors (conditional_of), computed where the scores are (on CUDA inside the static
    drafter's graph: two small kernels there, where on the host they cost a round ~0.15 ms on the H200's CPU)."""

    ids: Tensor
    unary: Tensor
    root: Tensor
    pair: Tensor
    cond_root: Tensor
    cond_pair: Tensor

    @classmethod
    def of(cls, ids: Tensor, unary: Tensor, root: Tensor, pair: Tensor) -> "SelectorScores":
        return cls(ids, unary, root, pair, *conditional_of(root, pair))

    def conditional(self) -> tuple[Tensor, Tensor]:
        """The selector's log-prob of b after a: (cond_root [K], cond_pair [D-1, K, K])."""
        return self.cond_root, self.cond_pair


def conditional_of(root: Tensor, pair: Tensor) -> tuple[Tensor, Tensor]:
    """log_softmax over the K successors of the root's scores [K] and the pair scores [D-1, K, K]."""
    return torch.log_softmax(root, -1), torch.log_softmax(pair, -1)


class CandidateSelector(nn.Module):
    def __init__(self, hidden: int, vocab: int, rank: int):
        super().__init__()
        self.hidden_projection = nn.Linear(hidden, rank, bias=False)
        self.predecessor_codebook = nn.Parameter(torch.zeros(vocab, rank))
        self.successor_codebook = nn.Parameter(torch.zeros(vocab, rank))

    def forward(self, hidden: Tensor, logits: Tensor, root_token_id: int, top_k: int) -> SelectorScores:
        """hidden [D, H]: the drafter's normed output at depths 1..D; logits [D, vocab]: its compute_logits."""
        return SelectorScores(*(t.cpu() for t in self.scores(hidden, logits, root_token_id, top_k)))

    def scores(self, hidden: Tensor, logits: Tensor, root: Tensor | int, top_k: int) -> tuple[Tensor, ...]:
        """SelectorScores' fields (ids, unary, root, pair and the conditionals) on the selector's device, shapes fixed
        by D and top_k (the static drafter captures this in its graph); `root`: the root's token id, an int or a 0-d
        tensor."""
        device = self.hidden_projection.weight.device
        unary, ids = torch.topk(logits.to(device).float(), top_k, dim=-1)  # [D, K]
        proj = self.hidden_projection(hidden.to(device)).float()  # [D, R]
        succ = self.successor_codebook[ids].float()  # [D, K, R]
        # the root's row by index_select: indexing with a 0-d tensor would read it on the host (a sync, which a
        # CUDA graph's capture refuses)
        root = torch.as_tensor(root, device=device).reshape(1)
        pred_root = self.predecessor_codebook.index_select(0, root)[0].float()  # [R]
        root_scores = unary[0] + succ[0] @ (pred_root * proj[0])
        pred = self.predecessor_codebook[ids[:-1]].float() * proj[1:, None, :]  # [D-1, K, R]
        pair = unary[1:, None, :] + torch.einsum("dir,djr->dij", pred, succ[1:])
        return ids, unary, root_scores, pair, *conditional_of(root_scores, pair)


class DFlash2Drafter(DFlashDrafter):
    """DFlash's drafter with the convolutions in every layer and the candidate selector after the norm."""

    family = "dflash2"
    config_class = DFlash2Config
    layer_class = DFlash2DecoderLayer

    def __init__(self, config: DFlash2Config):
        super().__init__(config)
        self.top_k = config.selector_top_k
        self.candidate_selector = CandidateSelector(config.hidden_size, config.vocab_size, config.selector_rank)

    def extra_outputs(self, hidden, logits, root):
        """The candidate selector's scores over this pass (SelectorScores' fields, on the device)."""
        return self.candidate_selector.scores(hidden, logits, root, min(self.top_k, logits.shape[-1]))

    @classmethod
    def check_fields(cls, config: DFlash2Config, state: dict[str, Tensor]) -> None:
        """The DFlash2 fields against the weights' shapes: the selector's rank, the kernel size and the group size,
        each refused naming the field and the weight that disagrees; and the selector's two codebooks refused where
        they hold NaN or inf (weights.base.refuse_nonfinite: every pair score would be NaN)."""
        for name in CODEBOOKS:
            if name in state:
                refuse_nonfinite(state[name], name, "drafter")
        H = config.hidden_size
        checks = [("selector_rank", "candidate_selector.hidden_projection.weight", 0, config.selector_rank)]
        for i in range(config.num_hidden_layers):
            for conv in ("attention_conv", "mlp_conv"):
                checks.append(("conv_kernel_size", f"layers.{i}.{conv}.base_kernel", 1, config.conv_kernel_size))
                checks.append(("conv_group_size", f"layers.{i}.{conv}.kernel_projection.weight", 0,
                               2 * config.conv_kernel_size * (H // config.conv_group_size)))
        for field, name, dim, want in checks:
            weight = state.get(name)
            if weight is not None and weight.dim() > dim and weight.shape[dim] != want:
                raise ModelLoadError(f"DFlash2 drafter config: dflash_config.{field} = {getattr(config, field)} "
                                     f"disagrees with the weights: {name} has shape {tuple(weight.shape)}.")


def is_dflash2(config: dict) -> bool:
    """Whether a drafter's config.json names the DFlash2 architecture."""
    archs = config.get("architectures") if isinstance(config, dict) else None
    return isinstance(archs, list) and ARCHITECTURE in archs


__all__ = ["ARCHITECTURE", "DFlash2Config", "DFlash2Drafter", "GroupedDynamicCausalConv", "CandidateSelector",
           "SelectorScores", "is_dflash2"]
