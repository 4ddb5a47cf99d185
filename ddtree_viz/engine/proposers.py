"""Proposers: who drafts a round's per-depth distributions, one named class per drafter family (transformers'
CandidateGenerator habit: a named extension point per strategy, never a string switch inside the round).

A proposer is a `Proposer` (the class below names every member and its default):

    propose(root, committed_len, new_features [n, F] | None, block_size) -> log-probs [block_size - 1, vocab] fp32
                                 depths 1..block_size-1 of the block [root, MASK, ...]; the context grows by the
                                 features of the positions committed since the last proposal
    reset() / reserve(length)    a new prompt; room for contexts of up to `length` positions (sized once per prompt)
    selector_scores()            where `selector`: the candidate selector over the last proposal (dflash2.SelectorScores)
    queue_device, propose_queued(walk, block_size), settle(committed_len)
                                 where a proposal can be queued from a walk the device holds (the scheduler's draft
                                 ahead): the device it drafts on (None: it cannot, yet), the proposal, and the
                                 context's length once the host knows it

Named implementations: DFlashProposer ("dflash"), DFlash2Proposer ("dflash2", with a candidate selector), picked by
the drafter's family (PROPOSERS, make_proposer); oracle.OracleProposer drafts greedy's tokens for the tests. What a
round builds from a proposal (DDTree's tree, DFlash's chain, DFlash2's selector chain) is engine/shapes.py's.
"""

from __future__ import annotations

import torch

from .dflash2 import SelectorScores
from .engines import QueuedWalk
from .tree import to_host


class Proposer:
    """The proposer interface, with its defaults: a proposer drafts (`propose`) and declares the rest."""

    family: str | None = None  # the drafter family traces record (settings.drafter_family); None: no drafter's
    block_size: int  # root + (block_size - 1) drafted depths
    feature_layer_ids: list[int] | None = None  # target layers whose hidden states it needs as context
    drafter = None  # the drafter module where one drafts (its device: the session's timing and waits)
    selector: bool = False  # selector_scores() gives a candidate selector over the last proposal

    def reset(self) -> None:
        """A new prompt: the context is empty."""

    def reserve(self, length: int) -> None:
        """Room for contexts of up to `length` positions (DecodeSession.prefill calls it once per prompt)."""

    def propose(self, root_token_id: int, committed_len: int, new_features: torch.Tensor | None,
                block_size: int) -> torch.Tensor:
        """Log-probs [block_size - 1, vocab] (fp32) for depths 1..block_size-1."""
        raise NotImplementedError(f"{type(self).__name__} does not propose")

    @property
    def queue_device(self) -> torch.device | None:
        """The device propose_queued drafts on (None: no proposal can be queued from a walk the device holds)."""
        return None

    def propose_queued(self, walk: QueuedWalk, block_size: int) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} cannot draft from a queued walk")

    def settle(self, committed_len: int) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot draft from a queued walk")

    def selector_scores(self) -> SelectorScores:
        raise NotImplementedError(f"{type(self).__name__} has no candidate selector")


class DFlashProposer(Proposer):
    """The DFlash drafter: one non-causal pass over [root, MASK...] conditioned on target features.

    Two paths, the same log-probs: the dynamic drafter (drafter.py: a growing DraftKVCache, eager; the reference)
    and the static one (draft_runner.py: preallocated K/V, one shape-static function, CUDA graphs on a GPU).
    `static`: None (default) takes the static path on CUDA wherever it applies (drafter, embeddings and lm_head
    whole on one device) and the dynamic one elsewhere, so a CPU's arithmetic stays the reference's; True asks for
    the static path (ValueError where it cannot run; on a CPU it runs eagerly), False for the dynamic one.
    `graphs` (None: on CUDA), `attention` ("eager" | "sdpa") and `compile` (its pieces through torch.compile; None:
    where the graphs are on CUDA) go to the static path."""

    def __init__(self, drafter, target, *, static: bool | None = None, graphs: bool | None = None,
                 attention: str = "eager", compile: bool | None = None):
        from .draft_runner import static_blocker

        self.drafter, self.target = drafter, target
        self.family = drafter.family  # the drafter family, as traces record it
        self.block_size = drafter.block_size
        self.feature_layer_ids = list(drafter.target_layer_ids)
        self.mask_token_id = drafter.mask_token_id
        self.static_blocker = static_blocker(drafter, target)  # why the static path cannot run (None: it can)
        if static and self.static_blocker is not None:
            raise ValueError(f"the static drafter cannot run here: {self.static_blocker}")
        on_cuda = next(drafter.parameters()).device.type == "cuda"
        self.static = self.static_blocker is None and (on_cuda if static is None else bool(static))
        self._graphs, self._attention, self._compile = graphs, attention, compile
        self.runner = None  # the StaticDrafter, made at the first reserve() or propose()
        self._reserved = 0
        self.cache = drafter.new_cache()

    @property
    def path(self) -> str:
        """Which path drafts: "static graphs", "static eager" or "dynamic"."""
        if not self.static:
            return "dynamic"
        graphs = self.runner.graphs if self.runner is not None else (
            self._graphs if self._graphs is not None else next(self.drafter.parameters()).device.type == "cuda")
        return "static graphs" if graphs else "static eager"

    def reset(self) -> None:
        self.cache = self.drafter.new_cache()
        if self.runner is not None:
            self.runner.reset()

    def reserve(self, length: int) -> None:
        """Room for contexts of up to `length` positions (prompt + new tokens + a block or two), sized once
        (DecodeSession.prefill calls it); a later propose that needs more makes room itself."""
        self._reserved = max(self._reserved, int(length))
        if self.static and self.runner is not None:
            self.runner.ensure(self._reserved)

    def _static_runner(self, need: int):
        if self.runner is None:
            from .draft_runner import StaticDrafter

            self.runner = StaticDrafter(self.drafter, self.target, max_len=max(need, self._reserved, 256),
                                        graphs=self._graphs, attention=self._attention, compile=self._compile)
        return self.runner

    @torch.no_grad()
    def propose(self, root_token_id, committed_len, new_features, block_size):
        if self.static:
            return self._static_runner(committed_len + 2 * block_size).propose(
                root_token_id, committed_len, new_features, block_size)
        return self.propose_dynamic(root_token_id, committed_len, new_features, block_size)

    @property
    def queue_device(self) -> torch.device | None:
        """The static path's device once it is made (a session's first round drafts through propose)."""
        return self.runner.device if self.static and self.runner is not None else None

    @torch.no_grad()
    def propose_queued(self, walk: QueuedWalk, block_size: int) -> torch.Tensor:
        """propose from a walk the device holds and the host has not read (engines.QueuedWalk: the root is its
        bonus token, the context its committed length and path's features): the static path's draft_queued. The
        context is unsettled until `settle`."""
        return self._outputs(self.runner.draft_queued(walk.bonus, walk.committed, walk.features, block_size))

    def _outputs(self, outputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """The log-probs of the static path's outputs (a family with more keeps them: DFlash2Proposer)."""
        return outputs[0]

    def settle(self, committed_len: int) -> None:
        """The context length of the last propose_queued, once the host knows it."""
        self.runner.settle(committed_len)

    @torch.no_grad()
    def propose_dynamic(self, root_token_id, committed_len, new_features, block_size):
        """The reference path: the drafter's own forward over its DraftKVCache, eagerly."""
        hidden = self._hidden(root_token_id, committed_len, new_features, block_size)
        return torch.log_softmax(self._logits(hidden), dim=-1)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The drafter's logits of its output: the target's lm_head (a Linear, or one kept quantized: no `weight`)
        on its own device, then the drafter's compute_logits."""
        lm_head = self.target.get_output_embeddings()
        return self.drafter.compute_logits(lm_head(hidden.to(next(lm_head.parameters()).device)))

    def _hidden(self, root_token_id, committed_len, new_features, block_size) -> torch.Tensor:
        """The drafter's normed output at depths 1..block_size-1 [block_size - 1, hidden] (its cache extended)."""
        embed = self.target.get_input_embeddings()
        block = torch.tensor([[root_token_id] + [self.mask_token_id] * (block_size - 1)], device=embed.weight.device)
        device, dtype = self.drafter.activations
        noise = embed(block).to(device, dtype)
        ctx = new_features.to(device, dtype)[None]
        start = self.cache.seq_length
        if start + ctx.shape[1] != committed_len:
            raise RuntimeError(f"drafter context out of step: {start} cached + {ctx.shape[1]} new != {committed_len}")
        positions = torch.arange(start, committed_len + block_size, device=device)[None]
        return self.drafter(noise, ctx, positions, cache=self.cache)[0, 1:]


class DFlash2Proposer(DFlashProposer):
    """A DFlash2 drafter: DFlash's pass with its convolutions, on either path, and the candidate selector's scores of
    the last proposal (`selector_scores`: what the `selector` tree scoring and the `dflash2` chain are built from),
    computed in the same pass (the static path's CUDA graph includes the selector: drafter.extra_outputs)."""

    selector = True

    def __init__(self, drafter, target, **options):
        super().__init__(drafter, target, **options)
        self.top_k = drafter.top_k
        self._last = None  # the selector's scores of the last proposal (SelectorScores' fields), on the device

    def reset(self) -> None:
        super().reset()
        self._last = None

    @torch.no_grad()
    def propose(self, root_token_id, committed_len, new_features, block_size):
        if not self.static:
            return self.propose_dynamic(root_token_id, committed_len, new_features, block_size)
        return self._outputs(self._static_runner(committed_len + 2 * block_size).draft(
            root_token_id, committed_len, new_features, block_size))

    def _outputs(self, outputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """The log-probs; the selector's outputs kept for selector_scores."""
        logprobs, *selected = outputs
        self._last = tuple(selected)
        return logprobs

    @torch.no_grad()
    def propose_dynamic(self, root_token_id, committed_len, new_features, block_size):
        hidden = self._hidden(root_token_id, committed_len, new_features, block_size)
        logits = self._logits(hidden)
        self._last = self.drafter.extra_outputs(hidden, logits, int(root_token_id))
        return torch.log_softmax(logits, dim=-1)

    def selector_scores(self) -> SelectorScores:
        """The selector over the last proposal: top-K candidates per depth, unary and pair scores (on the host)."""
        if self._last is None:
            raise RuntimeError("selector_scores before any proposal")
        return SelectorScores(*to_host(*self._last))


# The proposer of each drafter family (a drafter's `family`, drafter.py / dflash2.py): one line a family.
PROPOSERS: dict[str, type[DFlashProposer]] = {"dflash": DFlashProposer, "dflash2": DFlash2Proposer}


def make_proposer(drafter, target, **options) -> DFlashProposer:
    """The proposer of a drafter's family (PROPOSERS), with `options` for its static path."""
    return PROPOSERS[drafter.family](drafter, target, **options)
