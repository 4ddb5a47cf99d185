"""What the target's and the drafter's trainings share: AdamW with weight decay on matrices only, a linear warm-up
then cosine decay of the learning rate, gradients clipped at norm 1, the step count (fixed, or set from a time
budget), bf16 autocast on CUDA, and the rounding of the weights to the dtype they are stored in."""

from __future__ import annotations

import math
import time

from .data import log


def cosine_lr(step: int, total: int, peak: float, warmup: int, floor_frac: float = 0.1) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (floor_frac + (1 - floor_frac) * 0.5 * (1 + math.cos(math.pi * t)))


class StepBudget:
    """Fix the number of optimisation steps from a wall-clock budget, measured on early steps.

    With ``steps`` given, that count is used as is (the reproducible form). Otherwise the mean time
    of steps ``probe_from..probe_to`` sets ``total = budget_s / mean`` (clamped), once, before the
    learning-rate schedule leaves warm-up.
    """

    def __init__(self, steps: int | None, budget_s: float | None, probe_from: int = 3, probe_to: int = 13,
                 min_steps: int = 50, max_steps: int = 100_000):
        if steps is None and budget_s is None:
            raise ValueError("give steps or a time budget")
        self.total = steps
        self.budget_s, self.probe_from, self.probe_to = budget_s, probe_from, probe_to
        self.min_steps, self.max_steps = min_steps, max_steps
        self._t_start = time.time()
        self._t_probe: float | None = None

    @property
    def provisional_total(self) -> int:
        return self.total if self.total is not None else self.max_steps

    def after_step(self, step: int, synchronize=None) -> None:
        if self.total is not None:
            return
        if step + 1 == self.probe_from:
            if synchronize:
                synchronize()
            self._t_probe = time.time()
        elif step + 1 == self.probe_to:
            if synchronize:
                synchronize()
            per_step = (time.time() - self._t_probe) / (self.probe_to - self.probe_from)
            remaining = self.budget_s - (time.time() - self._t_start)
            self.total = int(min(self.max_steps, max(self.min_steps, step + 1 + remaining / per_step)))
            log(f"step budget: {per_step * 1000:.1f} ms/step -> {self.total} steps in {self.budget_s:.0f}s")


class Optimiser:
    """AdamW (betas 0.9 / 0.95; ``weight_decay`` on parameters of two or more dimensions, none on the others)
    under ``cosine_lr`` (peak ``lr``, ``warmup`` steps) over the steps of ``start_budget``'s ``StepBudget``.

    A training loop: ``while step < optim.total: optim.set_lr(step); loss = ...; optim.step(step, loss)``.
    """

    def __init__(self, params, device, *, lr: float, weight_decay: float, warmup: int):
        import torch

        self.params = list(params)
        decay = [p for p in self.params if p.dim() >= 2]
        no_decay = [p for p in self.params if p.dim() < 2]
        self.opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                      {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95),
                                     fused=device.type == "cuda")
        self.peak, self.warmup = lr, warmup
        self.sync = torch.cuda.synchronize if device.type == "cuda" else None
        self.budget: StepBudget | None = None

    def start_budget(self, steps: int | None, time_budget_s: float | None, max_steps: int = 100_000) -> StepBudget:
        """The step count: ``steps``, or what fits in ``time_budget_s`` from now (at least warm-up + 10)."""
        self.budget = StepBudget(steps, time_budget_s, min_steps=self.warmup + 10, max_steps=max_steps)
        return self.budget

    @property
    def total(self) -> int:
        return self.budget.provisional_total

    @property
    def lr(self) -> float:
        return self.opt.param_groups[0]["lr"]

    def set_lr(self, step: int) -> None:
        for g in self.opt.param_groups:
            g["lr"] = cosine_lr(step, self.total, self.peak, self.warmup)

    def step(self, step: int, loss):
        """Backward, clip the gradients' norm to 1, update, count the step. Returns the norm before clipping."""
        import torch

        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.opt.step()
        self.budget.after_step(step, self.sync)
        return gnorm


def autocast(device):
    """bf16 autocast on CUDA; full float32 on the CPU."""
    import torch

    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def round_weights_(model, dtype_name: str = "bfloat16") -> None:
    """Round parameters in place to what is stored (``dtype_name``), keeping their dtype."""
    import torch

    dt = getattr(torch, dtype_name)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(dt).to(p.dtype))
