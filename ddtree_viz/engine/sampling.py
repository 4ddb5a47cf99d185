"""Position-keyed sampling: the target's choice of the token at absolute sequence position p.

    T = 0:  choice(p) = argmax_v logits[v]                                  (greedy: the code path as before)
    T > 0:  choice(p) = argmax_v ( filtered(logits / T)[v] + G(seed, p, v) )

G is standard Gumbel noise. By the Gumbel-max trick, argmax(z + G) over independent Gumbel(0, 1) draws is a
sample from softmax(z), so each choice is an exact sample from the (filtered) tempered distribution. G depends on
(seed, p, v) only: not on how many forwards ran, on which tree node or batch row asked, nor on the device. Plain
decoding and DDTree's tree walk therefore make the same choice wherever they see the same logits at the same
position, and a sampled DDTree run can be compared with the target's own sampled decoding token for token
(docs/SAMPLING.md gives the argument).

The noise (scheme NOISE_SCHEME): h = lowbias32(lowbias32(v) ^ row(seed, p)), with
row(seed, p) = lowbias32(lowbias32(seed ^ SEED_SALT) ^ lowbias32(p ^ POSITION_SALT)), all 32-bit, computed with
int64 torch ops that never overflow (so the integers are bit-identical on every device); u = (h + 0.5) / 2**32
in (0, 1) and G = -log(-log(u)) in float64, then float32.

Filtering, on the tempered logits z = logits / T, in this order (as in transformers' generation):
    top-k  keep the tokens whose z is at least the k-th largest z (ties with the k-th are kept); 0 = off.
    top-p  keep the smallest set of most likely tokens whose mass under softmax(z) reaches p (the most likely
           token is always kept; ties with the last kept value are kept); 1 = off.
Filtered tokens get z = -inf and can never be chosen. A tree node at depth d of a round whose root sits at
committed length c chooses the token at position c + d + 1 (nodes of one depth share a position, hence noise
is drawn per distinct position); the prefill chooses the token at position len(prompt).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..errors import InputError
from ..options import MAX_SEED

NOISE_SCHEME = "gumbel-lowbias32-v1"
MAX_TEMPERATURE = 100.0
SEED_SALT, POSITION_SALT = 0x9E3779B9, 0x85EBCA6B

_M32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for int64 0 <= x < 2**32 and a constant c < 2**32, split so no product passes 2**49."""
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & _M32


def mix32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 (C. Wellons' hash prospector): a bijection of 32-bit values with strong avalanche, on int64
    tensors holding values in [0, 2**32) (so right shifts are logical shifts)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def gumbel_noise(seed: int, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """G(seed, p, v) as float32 [len(positions), vocab], on positions' device."""
    tokens = torch.arange(vocab, dtype=torch.int64, device=positions.device)
    return gumbel_noise_at(seed, positions, tokens[None].expand(len(positions), vocab))


def gumbel_noise_at(seed: int, positions: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """G(seed, p, v) as float32 [N, k] for the tokens [N, k] at positions [N] only (a DFlash2 chain's K candidates per
    position): the same numbers as gumbel_noise's columns, without hashing the whole vocabulary."""
    device = positions.device
    seed_key = mix32(torch.tensor(seed ^ SEED_SALT, dtype=torch.int64, device=device))
    rows = mix32(seed_key ^ mix32((positions.to(torch.int64) & _M32) ^ POSITION_SALT))
    h = mix32(rows[:, None] ^ mix32(tokens.to(device, torch.int64)))
    u = (h.to(torch.float64) + 0.5) * 2.0**-32
    return (-torch.log(-torch.log(u))).to(torch.float32)


@dataclass(frozen=True)
class Sampler:
    """How the target chooses its token: greedy (temperature 0) or position-keyed sampling."""

    temperature: float = 0.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    seed: int = 0

    def __post_init__(self):
        t, k, p, s = self.temperature, self.top_k, self.top_p, self.seed
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= MAX_TEMPERATURE:
            raise InputError(f"temperature must be a number from 0 (greedy) to {MAX_TEMPERATURE:g}, not {t!r}")
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise InputError(f"top-k must be a whole number, 0 (off) or more, not {k!r}")
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1:
            raise InputError(f"top-p must be a number above 0 and at most 1 (off), not {p!r}")
        if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s <= MAX_SEED:
            raise InputError(f"seed must be a whole number from 0 to {MAX_SEED}, not {s!r}")
        object.__setattr__(self, "temperature", float(t))
        object.__setattr__(self, "top_p", float(p))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def settings(self) -> dict:
        """The trace's sampling settings (noise None when greedy: no noise is drawn)."""
        return dict(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, seed=self.seed,
                    noise=None if self.greedy else NOISE_SCHEME)

    def tempered(self, logits: torch.Tensor) -> torch.Tensor:
        """[N, vocab] float32: logits / T, top-k then top-p filtered out as -inf (T > 0 only)."""
        z = logits.float() / self.temperature
        if 0 < self.top_k < z.shape[-1]:
            kth = torch.topk(z, self.top_k, dim=-1).values[:, -1:]
            z = z.masked_fill(z < kth, -math.inf)
        if self.top_p < 1:
            ordered = torch.sort(z, dim=-1, descending=True).values
            probs = torch.softmax(ordered, dim=-1)
            keep = (probs.cumsum(-1) - probs) < self.top_p  # the mass before a token is still short of p
            cutoff = ordered.masked_fill(~keep, math.inf).min(dim=-1, keepdim=True).values
            z = z.masked_fill(z < cutoff, -math.inf)
        return z

    def scores(self, logits: torch.Tensor, positions: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """[N, vocab]: what the choice is the argmax of. Greedy: the logits themselves (float32). Sampling: the
        filtered tempered logits plus the Gumbel noise of each row's position (drawn once per distinct one)."""
        if self.greedy:
            return logits.float()
        positions = torch.as_tensor(positions, dtype=torch.int64, device=logits.device)
        unique, inverse = torch.unique(positions, return_inverse=True)
        noise = gumbel_noise(self.seed, unique, logits.shape[-1])
        return self.tempered(logits) + noise.index_select(0, inverse)

    def choose(self, logits: torch.Tensor, positions: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """Token ids [N]: the target's choice from logits [N, vocab] at absolute positions [N]."""
        return self.scores(logits, positions).argmax(dim=-1)

    def probs(self, logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """[N] float32: each token's probability under the distribution sampled from (softmax of the filtered
        tempered logits; greedy: 1 for the argmax, 0 elsewhere)."""
        if self.greedy:
            return (logits.argmax(dim=-1) == tokens).float()
        dist = torch.softmax(self.tempered(logits), dim=-1)
        return dist.gather(-1, tokens.view(-1, 1).to(dist.device))[:, 0]


GREEDY = Sampler()


def margin(scores: torch.Tensor) -> float:
    """The decision margin of one choice: the top score minus the runner-up (scores [vocab]; greedy: the top-1
    minus top-2 logit). inf when only one token survives the filters."""
    top = torch.topk(scores.float(), 2).values
    return float(top[0] - top[1])
