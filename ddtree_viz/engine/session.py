"""DecodeSession: prefill a prompt, then one DDTree (or DFlash chain) round per step(), each yielding a StepRecord.

A round, top to bottom:
    draft   the drafter proposes B-1 per-depth distributions for the block [root, MASK, ...]
    tree    best-first tree under the node budget (or DFlash's top-1 chain); positions + ancestor mask
    verify  one target pass over [root, nodes...] (exact: tree-exact GDN; naive: the flattened-tree bug)
    accept  walk the tree along the target's choice (its argmax, or its position-keyed sample: sampling.py); the
            choice at the last accepted node is the bonus token
    commit  KV rows of prefix + accepted path; GDN state of the accepted path; drafter context = their features
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from .. import analysis
from ..analysis import first_divergence  # noqa: F401 - the session's comparison with its reference
from ..errors import InputError
from ..words import plural
from ..options import (CHAINS, DDTREE, DFLASH, DFLASH2, DRAFT_TOP_K, DecodeSettings, MARGINAL, MAX_BUDGET, MAX_NEW_TOKENS,
                       MAX_TOP_K, METHODS, REFERENCE_ENGINE, REFERENCES, SELECTOR, TARGET_TOP_K, TREE_SCORINGS,
                       VERIFY_MODES, check_int)
from ..trace import VERDICT_MISMATCH, VERDICT_NOISE, StepRecord, Trace, TreeNode
from .backends import sdpa_backends
from .cache import compact_kv
from .engines import AUTO, ENGINES, QueuedWalk, TargetEngine, TreePass, make_engine
from .models import ModelPair
from .prompts import PromptSpec, check_prompt_text, encode
from .kernels.device import triton_available
from .sampling import GREEDY, Sampler, gumbel_noise_at, margin
from .timing import PhaseClock, single_cuda_device
from .dflash2 import SelectorScores
from .tree import (DeviceTree, DeviceTreeBuilder, DraftTree, build_chain, build_selector_tree, one_node, selector_chain,
                   to_host)
from .verify import EXACT, NAIVE, device_sync, input_device, verify_tree

TRANSFORMERS_REFERENCE = REFERENCE_ENGINE


# ----------------------------------------------------------------------------------------------------------
# Proposers: who drafts the per-depth distributions
# ----------------------------------------------------------------------------------------------------------


class Proposer(Protocol):
    block_size: int  # root + (block_size - 1) drafted depths
    feature_layer_ids: list[int] | None  # target layers whose hidden states it needs as context

    def reset(self) -> None: ...

    def propose(self, root_token_id: int, committed_len: int, new_features: torch.Tensor | None, block_size: int) -> torch.Tensor:
        """Log-probs [block_size - 1, vocab] (fp32) for depths 1..block_size-1. A proposer with a candidate selector
        (DFlash2Proposer) also has `selector_scores()`: the selector over its last proposal (dflash2.SelectorScores)."""


class DFlashProposer:
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
        self.family = getattr(drafter, "family", "dflash")  # the drafter family, as traces record it
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
    def drafts_queued(self) -> bool:
        """Whether propose_queued can run: the static path, made (a session's first round drafts through propose)."""
        return self.static and self.runner is not None

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


def make_proposer(drafter, target, **options) -> DFlashProposer:
    """The proposer of a drafter's family: DFlash2Proposer for a DFlash2 drafter, DFlashProposer otherwise."""
    return (DFlash2Proposer if getattr(drafter, "family", "dflash") == "dflash2" else DFlashProposer)(
        drafter, target, **options)


def selector_fields(tree: DraftTree, scores: SelectorScores) -> dict:
    """Per tree position (the root 0): the node's unary score U_t(b) and pair score S_t(parent's token, b), rounded
    to 3 decimals; a node's rank is its candidate's index at its depth (tree.build_selector_tree)."""
    unary, pair = [0.0], [0.0]
    for pos in range(1, len(tree)):
        d, j, parent = tree.depths[pos], tree.ranks[pos], tree.parents[pos]
        unary.append(round(float(scores.unary[d - 1, j]), 3))
        pair.append(round(float(scores.root[j] if d == 1 else scores.pair[d - 2, tree.ranks[parent], j]), 3))
    return dict(selector_unary=tuple(unary), selector_pair=tuple(pair))


def check_family(proposer, method: str, tree_scoring: str) -> str:
    """The tree scoring, checked against the method and the drafter: the `selector` scoring and the `dflash2` chain
    need a candidate selector (a DFlash2 drafter); a DFlash 1 drafter has none (InputError saying so)."""
    if tree_scoring not in TREE_SCORINGS:
        raise InputError(f"tree scoring must be one of {', '.join(TREE_SCORINGS)}, not {tree_scoring!r}")
    if hasattr(proposer, "selector_scores"):
        return tree_scoring
    family = getattr(proposer, "family", "dflash")
    if method == DFLASH2:
        raise InputError(f"method dflash2 (the candidate selector's chain) needs a DFlash2 drafter; this drafter is "
                         f"{family} and has no candidate selector: pick method ddtree or dflash, or load a DFlash2 drafter")
    if method == DDTREE and tree_scoring == SELECTOR:
        raise InputError(f"tree scoring selector needs a DFlash2 drafter (its candidate selector's pair scores); this "
                         f"drafter is {family} and has none: use tree scoring marginal, or load a DFlash2 drafter")
    return tree_scoring


# ----------------------------------------------------------------------------------------------------------
# The reference: transformers' own forward, one token at a time, no tree code involved
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GreedyResult:
    ids: tuple[int, ...]
    # the decision margin at each generated token: top-1 minus top-2 logit (greedy), or top-1 minus top-2 of
    # the sampler's scores (sampling; inf where the filters leave one token)
    margins: tuple[float, ...]
    # the reference's own numerical noise (docs/EXACTNESS.md, "Noise or bug"): max |margin of a multi-position
    # pass - margin of the one-token pass| over the positions compared so far (None: none compared yet)
    noise: float | None = None
    noise_positions: int = 0
    nonfinite: int | None = None  # the first of these tokens chosen from logits holding NaN or inf (None: none)


class GreedyReference:
    """The target's own decoding of a prompt, extended on demand (the UI asks for it token by token): greedy,
    or with a sampler at T > 0 the same position-keyed sampling a session uses (same seed, same noise).

    This one runs transformers' own forward, one token at a time, no tree code involved: the independent check.
    EngineGreedy below runs the same loop through a target engine (one-node trees).

    Numerical noise (`control`, on with the margins): before stepping through the next tokens one at a time,
    the reference runs one multi-position pass (a chain of up to `chain` positions, the exact tree pass's
    arithmetic) over the tokens a session proposes there (`extend_to(n, candidates)`), keeps its top-2 margins
    and forgets the pass (the state is untouched). Where the one-token steps then choose the same token after
    the same prefix, |chain margin - one-token margin| is one sample of what this run's numerics alone move a
    margin by. Nothing a session does (its tree, walk, commit or state) enters those samples."""

    name = "transformers"  # what the reference runs on (trace settings["reference"])

    def __init__(self, target, prompt_ids: list[int], eos_ids: set[int], with_margins: bool = True,
                 sampler: Sampler = GREEDY, control: bool | None = None, chain: int = 16):
        self.target, self.prompt_ids, self.eos_ids = target, list(prompt_ids), set(eos_ids)
        self.with_margins = with_margins  # False: no decision margins (a benchmark's plain decoding)
        self.sampler = sampler
        self.control = with_margins if control is None else control
        self.chain = max(2, int(chain))
        self.ids: list[int] = []
        self.margins: list[float] = []
        self.noise_deltas: list[float] = []  # |chain margin - one-token margin| per compared position
        self._pending: dict[int, tuple[tuple[int, ...], int, float, int]] = {}
        self.finished = False  # end of text reached
        self.nonfinite: int | None = None  # the first token chosen from logits holding NaN or inf
        self.seconds = 0.0  # time spent decoding so far (prefill included)
        # the same time split for a page's estimates: the first token's step (the prefill, unless shared_prefill)
        # and the steps of the tokens after it (their noise chains included)
        self.prefill_seconds = 0.0
        self.token_seconds = 0.0
        self.shared_prefill = False  # started from another engine's prefilled state (EngineGreedy.start_from)
        self._sync = device_sync(target)
        self.cache = None

    def _first(self) -> torch.Tensor:
        """Logits [vocab] after the prompt."""
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.target.config)
        return self._forward(self.prompt_ids)

    def _next(self, token: int) -> torch.Tensor:
        """Logits [vocab] after one more token."""
        return self._forward([token])

    def _forward(self, inputs: list[int]) -> torch.Tensor:
        ids = torch.tensor([inputs], device=input_device(self.target))
        with sdpa_backends(ids.device):
            return self.target(input_ids=ids, cache=self.cache, use_cache=True, logits_to_keep=1).logits[0, -1]

    def _chain(self, tokens: list[int]) -> torch.Tensor:
        """Logits [len(tokens), vocab] of one exact pass over `tokens` as a chain after the tokens fed so far;
        the cache is left as it was (the tree-exact GDN only reads it; the chain's KV rows are dropped)."""
        committed = len(self.prompt_ids) + len(self.ids) - 1
        chain = build_chain(tokens[0], tokens[1:], [0.0] * (len(tokens) - 1))
        result = verify_tree(self.target, self.cache, chain, committed, EXACT, want_hidden=False)
        compact_kv(self.cache, len(chain), [])
        return result.logits

    @torch.no_grad()
    def extend_to(self, n: int, candidates=(), most: int | None = None) -> GreedyResult:
        """The first n tokens. `candidates`: the tokens a session generated (its own guesses of these tokens),
        used only to measure the numerical noise (class docstring); they never decide a token. `most`: decode at
        most this many tokens in this call (a caller that shows its progress and may stop: calls of `most` tokens
        towards the same n decode the tokens, margins and noise of one call; the result is those decoded so
        far)."""
        if len(self.ids) >= n or self.finished:  # nothing to decode: no time spent
            return self.result(n)
        start, made = time.perf_counter(), 0
        while len(self.ids) < n and not self.finished and (most is None or made < most):
            first, began = not self.ids, time.perf_counter()
            self._decide(self._first() if first else self._after(n, candidates))
            spent = time.perf_counter() - began  # (the token's choice read it back: its step is done)
            if first:
                self.prefill_seconds += spent
            else:
                self.token_seconds += spent
            made += 1
        self._sync()
        self.seconds += time.perf_counter() - start
        return self.result(n)

    def _after(self, n: int, candidates) -> torch.Tensor:
        """Logits [vocab] after the last token chosen (its noise chain first, where one is due)."""
        if self.control:
            self._control(n, candidates)
        return self._next(self.ids[-1])

    def _decide(self, logits: torch.Tensor) -> None:
        """The next token from its logits [vocab], with its margin and noise sample; end of text noted."""
        logits = logits.float()
        if self.nonfinite is None and not bool(torch.isfinite(logits).all()):  # (read as the token is: no wait)
            self.nonfinite = len(self.ids)
        scores = self.sampler.scores(logits[None], [len(self.prompt_ids) + len(self.ids)])[0]
        token = int(scores.argmax())
        self.ids.append(token)
        if self.with_margins:
            self.margins.append(margin(scores))
            self._compare(len(self.ids) - 1, token, self.margins[-1])
        self.finished = token in self.eos_ids

    def result(self, n: int | None = None) -> GreedyResult:
        """The first n tokens decoded so far (all of them: None), with the noise measured so far."""
        n = len(self.ids) if n is None else n
        noise = max(self.noise_deltas) if self.noise_deltas else None
        bad = self.nonfinite if self.nonfinite is not None and self.nonfinite < n else None
        return GreedyResult(tuple(self.ids[:n]), tuple(self.margins[:n]), noise, len(self.noise_deltas), bad)

    def _control(self, n: int, candidates) -> None:
        """One chain pass over [the last token, candidates...] predicting the next tokens up to n (not already
        predicted by an earlier chain); its choices and margins wait in _pending for the one-token steps."""
        j = len(self.ids) - 1  # ids[j] is the last token, not fed yet
        if j + 1 in self._pending:
            return
        k = min(self.chain, n - 1 - j, len(candidates) - j)
        if k < 2:  # a one-position chain is the one-token pass itself: nothing to learn
            return
        tokens = [self.ids[j]] + [int(t) for t in candidates[j + 1:j + k]]
        logits = self._chain(tokens).float()
        positions = [len(self.prompt_ids) + j + 1 + t for t in range(k)]
        scores = self.sampler.scores(logits, positions)
        for t in range(k):
            self._pending[j + 1 + t] = (tuple(tokens[1:t + 1]), int(scores[t].argmax()), margin(scores[t]), j)

    def _compare(self, i: int, token: int, one_token_margin: float) -> None:
        """Token i was just chosen by a one-token pass: compare it with the chain that predicted it, if that
        chain assumed the same prefix and chose the same token."""
        pending = self._pending.pop(i, None)
        if pending is None:
            return
        assumed, chain_token, chain_margin, j = pending
        if chain_token == token and tuple(self.ids[j + 1:i]) == assumed:
            delta = abs(chain_margin - one_token_margin)
            if math.isfinite(delta):
                self.noise_deltas.append(delta)


class EngineGreedy(GreedyReference):
    """Greedy decoding through a target engine: every step is a one-node tree (forward, then commit it).

    `start_from(logits)`: the engine already holds the prompt (a copy of a session's state after its prefill,
    engine.load_state) and these are the prefill's last logits: no prefill of its own."""

    def __init__(self, engine: TargetEngine, prompt_ids: list[int], eos_ids: set[int], with_margins: bool = True,
                 sampler: Sampler = GREEDY, control: bool | None = None, chain: int = 16):
        self.engine = engine
        super().__init__(engine.target, prompt_ids, eos_ids, with_margins, sampler, control, chain)
        self.name = engine.name
        self._sync = engine.sync
        self._start: torch.Tensor | None = None

    def start_from(self, logits: torch.Tensor) -> None:
        self._start, self.shared_prefill = logits, True

    def _first(self) -> torch.Tensor:
        if self._start is not None:
            logits, self._start = self._start, None
            return logits
        return self.engine.prefill(self.prompt_ids)[0]

    def _next(self, token: int) -> torch.Tensor:
        tree_pass = self.engine.forward(one_node(token))
        logits = tree_pass.logits[0]
        self.engine.commit(tree_pass, [0])
        return logits

    def _chain(self, tokens: list[int]) -> torch.Tensor:
        tree_pass = self.engine.forward(build_chain(tokens[0], tokens[1:], [0.0] * (len(tokens) - 1)))
        logits = tree_pass.logits.clone()  # the runner's output buffers are reused by the next pass
        self.engine.discard(tree_pass)
        return logits


def greedy_decode(target, prompt_ids: list[int], max_new_tokens: int, eos_ids: set[int],
                  sampler: Sampler = GREEDY) -> GreedyResult:
    """The target's own decoding: greedy, or position-keyed sampling with `sampler`."""
    return GreedyReference(target, prompt_ids, eos_ids, sampler=sampler).extend_to(max_new_tokens)


@dataclass(frozen=True)
class DivergenceCheck:
    """The output against the reference, and the verdict on where they part (docs/EXACTNESS.md)."""

    index: int | None  # first generated token that differs from the reference (None: identical so far)
    margin: float | None  # the reference's decision margin there
    noise: float | None  # the reference's own numerical noise (GreedyResult.noise)
    noise_positions: int
    drift: float | None  # max |tree pass margin - reference margin| over agreeing accepted positions before it
    drift_positions: int
    verdict: str | None  # VERDICT_NOISE, VERDICT_MISMATCH, or None (no divergence, or nothing to judge it by)
    reference: str  # what the reference ran on: "runner" or "transformers"
    pending: bool  # the reference has not reached the end of the output yet (compared as far as it has)
    result: GreedyResult
    invalid: str | None = None  # why no verdict stands (logits held NaN or inf: invalid_reason); None: it does


def invalid_reason(round_index: int | None, reference_token: int | None, reference: str) -> str | None:
    """Why a comparison with the reference proves nothing, or None: a round's verify logits or the reference's held
    NaN or inf (argmax then picks whatever the NaN sits on, both sides alike: '!!!!' equal to '!!!!')."""
    where = [f"round {round_index}'s verify logits"] if round_index is not None else []
    where += [f"the reference's logits at generated token {reference_token}"] if reference_token is not None else []
    if not where:
        return None
    return (f"{' and '.join(where)} hold NaN or inf ({reference} reference), so the tokens chosen there mean nothing "
            "and agreeing with the reference proves nothing: the target's weights (or a quantization scale) or its "
            "arithmetic are not finite; load a checkpoint whose weights are finite, or a wider dtype")


def verdict(margin: float | None, noise: float | None) -> str | None:
    """A divergence whose reference margin is at most the measured noise is a numerical tie; one beyond it is a
    mismatch. A margin of 0 is an exact tie (the reference's top two are equal, as bf16 logits often are over a
    large vocabulary): either token is its argmax, so it is noise whatever was measured. None when either is
    unknown otherwise."""
    if margin == 0.0:
        return VERDICT_NOISE
    if margin is None or noise is None:
        return None
    return VERDICT_NOISE if margin <= noise else VERDICT_MISMATCH


# ----------------------------------------------------------------------------------------------------------
# The session
# ----------------------------------------------------------------------------------------------------------


class DecodeSession:
    """Rounds of DDTree (or the DFlash chain) on one prompt through a target engine (engines.py).

    `record=False` keeps only what decoding needs (tree, accepted path, bonus) in each StepRecord: no node texts,
    margins or cache snapshots (what a benchmark of the method itself wants). `time_phases` (default: as
    `record`) times each phase (timing.PhaseClock: CUDA events on one GPU, read once after the round; elsewhere
    the wall clock after waiting for the devices); without it a round has no device waits but the one its
    acceptance walk needs.

    `sampler` (sampling.py) says how the target chooses its tokens: greedy (the default) or position-keyed
    sampling; the reference (`greedy()`) decodes with the same sampler, so the two still match token for token.

    `reference` says where the reference decodes: "engine" (default) on the session's kind of engine (the
    runner: one-node trees on a second static runner that starts from a copy of the session's state after the
    prefill; the transformers engine: transformers' own one-token forward, which is that engine's greedy), or
    "transformers" (transformers' own forward whatever the engine: the independent check, slow at real sizes).
    `check_transformers()` runs that independent check beside an engine reference. `reference_engine`: an
    engine made by the caller for an engine reference (a page reuses its engines from prompt to prompt)."""

    def __init__(
        self, pair: ModelPair, *, budget: int = 32, max_new_tokens: int = 64, verify: str = EXACT,
        method: str = "ddtree", block_size: int | None = None, proposer: Proposer | None = None,
        reference_gdn: bool = False, engine: str | TargetEngine = AUTO, record: bool = True,
        time_phases: bool | None = None, sampler: Sampler = GREEDY, target_top_k: int = TARGET_TOP_K,
        draft_top_k: int = DRAFT_TOP_K, reference: str = "engine", reference_engine: TargetEngine | None = None,
        tree_scoring: str = MARGINAL, tree_on_device: bool | None = None, queue_draft: bool | None = None,
        launch_ahead: bool | None = None, draft_ahead: bool = True, verify_ahead: bool = True,
    ):
        """`engine`: "auto" (default: engines.default_engine, the fastest exact engine that applies: the static runner
        for exact rounds on a Qwen3.5 hybrid on one device, else transformers' forward), a name from
        engines.ENGINES (the engine is made here, sized for these settings) or an engine made by the caller. When
        recording, each round keeps the target's top `target_top_k` tokens at every tree position and the
        drafter's top min(budget, `draft_top_k`) candidates at every depth (DFlash chain: `draft_top_k`); 0 records
        none. `reference`: "engine" checks the output against the target's own decoding on a second engine of the
        session's kind (`reference_engine`, if given), "transformers" on transformers' own forward
        (docs/EXACTNESS.md, "The reference"). `tree_scoring`: how DDTree scores a node, "marginal" (the drafter's
        per-depth log-probs) or "selector" (a DFlash2 drafter's pair scores; see check_family). `tree_on_device`:
        DDTree's marginal tree built where the log-probs are (tree.DeviceTreeBuilder: a CUDA graph on a GPU) and
        handed to the engine as tensors (the runner engine's forward_tensors), its copy to the host queued before
        the verify and read after the walk; the same trees and records. None (default): where that was measured to
        cost less (_tree_where: DDTree's marginal rounds on the runner, both models on one GPU). `queue_draft`: each
        round queues the next one's draft before the host reads its record (None: where that costs no wait,
        `queues_draft`); the same rounds and records either way.
        `launch_ahead`: DDTree's marginal rounds launch the verify graph before the tree is built, where the engine
        can (the runner on a GPU; engine/launch.py) and both models are on that one GPU (a phase timed by the wall
        clock would wait for the whole device inside the window); the same passes. None (default): where the
        rounds keep no record (a recorded round's reads may wait on the whole device; docs/lab/NOTEBOOK.md section 19).
        `draft_ahead`: a queued draft goes in before the host reads the walk, from its result on the device, where
        it can (`draft_ahead`); `verify_ahead`: and the next round's tree and verify behind it (`verify_ahead`); the
        same rounds and records either way."""
        self.pair = pair
        self.target, self.tokenizer = pair.target, pair.tokenizer
        if proposer is None:
            if pair.drafter is None:
                raise InputError("no drafter loaded")
            proposer = make_proposer(pair.drafter, pair.target)
        self.proposer = proposer
        self.budget = check_int("budget", budget, 1, MAX_BUDGET)
        self.max_new_tokens = check_int("max new tokens", max_new_tokens, 1, MAX_NEW_TOKENS)
        if verify not in VERIFY_MODES:
            raise InputError(f"verify mode must be one of {', '.join(VERIFY_MODES)}, not {verify!r}")
        if method not in METHODS:
            raise InputError(f"method must be one of {', '.join(METHODS)}, not {method!r}")
        self.verify, self.method, self.record = verify, method, record
        self.tree_scoring = check_family(proposer, method, tree_scoring)
        self.time_phases = record if time_phases is None else time_phases
        if not isinstance(sampler, Sampler):
            raise InputError(f"sampler must be a Sampler, not {type(sampler).__name__}")
        self.sampler = sampler
        self.target_top_k = check_int("target top-k", target_top_k, 0, MAX_TOP_K)
        self.draft_top_k = check_int("drafter top-k", draft_top_k, 0, MAX_TOP_K)
        self.block_size = check_int("block size", proposer.block_size if block_size is None else block_size, 2, proposer.block_size)
        self.reference_gdn = reference_gdn
        self.tree_size = tree_size = self.budget + 1 if method == DDTREE else self.block_size  # at most, a round
        if isinstance(engine, str):
            engine = make_engine(engine, self.target, proposer.feature_layer_ids, verify=verify,
                                 reference_gdn=reference_gdn, tree_size=tree_size, block_size=self.block_size,
                                 max_new_tokens=self.max_new_tokens)
        self.target_engine = engine
        self.engine = self.target_engine.name
        if reference not in REFERENCES:
            raise InputError(f"reference must be one of {', '.join(REFERENCES)}, not {reference!r}")
        # what the reference runs on: a second engine of this kind, or transformers' own forward
        self.reference = (self.engine if reference == "engine" and self.engine != TRANSFORMERS_REFERENCE
                          else TRANSFORMERS_REFERENCE)
        self._reference_engine = reference_engine
        self._token_texts_seen: dict[int, str] = {}
        self.eos_ids = pair.eos_token_ids
        self._sync = device_sync(self.target, getattr(proposer, "drafter", None))
        # one GPU: phases timed with CUDA events (no waits between them); else the wall clock after a wait
        self._cuda_device = single_cuda_device(self.target, getattr(proposer, "drafter", None))
        self.tree_on_device = self._tree_where(tree_on_device, launch_ahead)
        self.tree_builder = DeviceTreeBuilder(self.budget) if self.tree_on_device else None  # a CUDA graph on a GPU
        self.queue_draft = queue_draft  # None: where it costs no wait (queues_draft)
        self._draft_ahead, self._verify_ahead = draft_ahead, verify_ahead  # where they can (draft_ahead, verify_ahead)
        self.launch_ahead = self._launch_where(launch_ahead)
        self.reset()

    def _launch_where(self, asked: bool | None) -> bool:
        """Whether the verify graph is launched before the tree is built (launched ahead: DDTree's marginal tree on
        the host, on an engine that can; _verify_tree): as asked, or for None where the rounds keep no record."""
        wanted = not self.record if asked is None else bool(asked)
        return (wanted and hasattr(self.target_engine, "launch_ahead") and self._cuda_device is not None
                and not self.tree_on_device and self.method == DDTREE and self.tree_scoring == MARGINAL)

    def _tree_where(self, asked: bool | None, launch_ahead: bool | None) -> bool:
        """Whether DDTree's marginal tree is built on the device (`tree_on_device`): as asked (refused where the
        engine cannot take a tree as tensors), or for None where it was measured to cost the host least and the
        round no more (docs/lab/NOTEBOOK.md sections 20-21): rounds on the runner, recorded (the page) or not, a drafter
        and the target on one GPU (the log-probs where the tree is built), the tree by the best-first kernel
        (Triton), unless a launch ahead was asked for (a host tree's)."""
        engine = self.target_engine
        marginal = (self.method == DDTREE and self.tree_scoring == MARGINAL and hasattr(engine, "forward_tensors"))
        if asked is None:
            drafted_here = getattr(self.proposer, "drafter", None) is not None and self._cuda_device is not None
            return marginal and drafted_here and launch_ahead is not True and triton_available()
        if asked and not marginal:
            raise InputError("tree_on_device builds DDTree's marginal tree for the runner engine only, not "
                             f"method {self.method!r} with {self.tree_scoring!r} scoring on the {self.engine} engine")
        return bool(asked)

    @classmethod
    def from_settings(cls, pair: ModelPair, settings: DecodeSettings, **runtime) -> "DecodeSession":
        """THE way a caller above the engine starts a session: `settings` (options.DecodeSettings, plain data)
        plus what only the caller has (`runtime`: proposer, engine object, reference_engine, record, ...)."""
        s = settings
        sampler = Sampler(s.temperature, s.top_k, s.top_p, s.seed)
        return cls(pair, budget=s.budget, max_new_tokens=s.max_new_tokens, verify=s.verify, method=s.method,
                   block_size=s.block_size, engine=runtime.pop("engine", s.engine), reference=s.reference,
                   sampler=runtime.pop("sampler", sampler), tree_scoring=s.tree_scoring, **runtime)

    # -- state ---------------------------------------------------------------------------------------------

    def reset(self) -> None:
        self.prompt: str = ""
        self.prompt_ids: list[int] = []
        self.prompt_spec: PromptSpec | None = None  # how the prompt was given (chat template, thinking), if known
        self.generated: list[int] = []
        self.history: list[StepRecord] = []
        self.started = False
        self.committed_len = 0
        self.done = False
        self._features: torch.Tensor | None = None
        self._queued: tuple | None = None  # the next round's draft, queued by step(): (root, committed_len), log-probs, clock
        # and its tree and verify (_queue_verify): (root, committed_len), tree, its read, the pass
        self._verified: tuple | None = None
        self.verified_ahead = 0  # rounds whose tree and verify the round before queued (_queue_verify)
        # why the last queued draft or verify that failed did (the next step made its own)
        self.queue_error: str | None = None
        self._greedy: GreedyReference | None = None
        self._independent: GreedyReference | None = None  # check_transformers()
        self.prefill_cache: tuple = ()
        self.prefill_ms = 0.0
        # to_trace's token texts, kept as ids appear: str(id) -> text of every id named so far, the ids named since
        # (decoded at the next to_trace), and how far the prompt, the output and the reference have been named
        self._texts: dict[str, str] = {}
        self._unnamed: set[int] = set()
        self._named: dict[str, int] = {"prompt": 0, "output": 0, "reference": 0}
        # _drift's rounds already compared in full: (the reference, their count, their deltas, the limit then)
        self._drift_done: tuple = (None, 0, (), 0)
        self.nonfinite_round: int | None = None  # the first round whose verify logits held NaN or inf

    @property
    def cache(self):
        """The engine's committed state: transformers' DynamicCache, or the static runner."""
        return self.target_engine.cache

    @property
    def settings(self) -> dict:
        return dict(
            budget=self.budget, block_size=self.block_size, verify=self.verify, dtype=str(self.pair.dtype).removeprefix("torch."),
            max_new_tokens=self.max_new_tokens, method=self.method, device=self.pair.device, engine=self.engine,
            reference=self.reference, target_precision=self.pair.target_precision,
            draft_precision=self.pair.draft_precision, **self.sampler.settings, tree_scoring=self.tree_scoring,
            **({"drafter_family": self.proposer.family} if hasattr(self.proposer, "family") else {}),
        )

    def token_text(self, token_id: int) -> str:
        """One token's text (decoded once per id: every round names each of its tree nodes)."""
        text = self._token_texts_seen.get(token_id)
        if text is None:
            text = self._token_texts_seen[token_id] = self.tokenizer.decode([token_id], clean_up_tokenization_spaces=False)
        return text

    @property
    def output_text(self) -> str:
        return self.tokenizer.decode(self.generated, clean_up_tokenization_spaces=False)

    # -- prefill -------------------------------------------------------------------------------------------

    @torch.no_grad()
    def prefill(self, prompt: str | None = None, prompt_ids: list[int] | None = None, *,
                spec: PromptSpec | None = None) -> int:
        """Run the prompt through the target; its choice (argmax or sample) becomes the first generated token
        (the first root). `spec` (prompts.py): the prompt as text or messages, through the chat template or not;
        it is encoded here and recorded in the trace."""
        if spec is not None:
            encoded = encode(self.tokenizer, spec)
            prompt, prompt_ids = encoded.text, list(encoded.ids)
        if prompt_ids is None:
            if not isinstance(prompt, str) or prompt == "":
                raise InputError("the prompt is empty: type some text to continue")
            check_prompt_text(prompt)
            prompt_ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        if len(prompt_ids) == 0:
            raise InputError("the prompt encodes to no tokens")
        positions = self.pair.max_positions
        room = positions - self.budget - self.block_size  # positions a round's tree may need past the output
        limit = room - self.max_new_tokens
        if limit < 1:  # no prompt can fit: say which setting is too large, not that the prompt is too long
            if room - 1 < 1:
                raise InputError(f"budget {self.budget} and block size {self.block_size} leave no room in the target's "
                                 f"{plural(positions, 'position')}: lower the budget")
            raise InputError(f"max new tokens {self.max_new_tokens} is too many for this target: it has "
                             f"{plural(positions, 'position')}, and with budget {self.budget} and block size "
                             f"{self.block_size} at most {plural(room - 1, 'new token')} "
                             f"{'fits' if room - 1 == 1 else 'fit'} (after a one-token prompt)")
        if len(prompt_ids) > limit:
            raise InputError(
                f"the prompt is {plural(len(prompt_ids), 'token')}; with max new tokens {self.max_new_tokens} and budget "
                f"{self.budget} it must be at most {plural(max(limit, 0), 'token')} (the target has "
                f"{plural(self.pair.max_positions, 'position')})"
            )
        self.reset()
        self.prompt = prompt if prompt is not None else self.tokenizer.decode(prompt_ids)
        self.prompt_spec = spec
        self.prompt_ids = [int(t) for t in prompt_ids]
        self.proposer.reset()
        reserve = getattr(self.proposer, "reserve", None)
        if reserve is not None:  # the static drafter's state, sized once for this prompt (DFlashProposer.reserve)
            reserve(len(self.prompt_ids) + self.max_new_tokens + 2 * self.block_size)
        start = time.perf_counter()
        logits, self._features = self.target_engine.prefill(self.prompt_ids)
        self._sync()
        self.prefill_ms = (time.perf_counter() - start) * 1e3
        self.started = True
        self.prefill_cache = self.target_engine.snapshot()
        self.committed_len = len(self.prompt_ids)
        first = int(self.sampler.choose(logits[None], [self.committed_len])[0])
        self.generated = [first]
        if self.record and self.reference != TRANSFORMERS_REFERENCE:  # the reference starts from this state
            start = time.perf_counter()
            self._greedy = self._engine_reference()
            self._greedy.engine.load_state(self.target_engine)
            self._greedy.start_from(logits)
            self._greedy.engine.sync()
            self._greedy.seconds += time.perf_counter() - start
        self.done = first in self.eos_ids or self.max_new_tokens <= 1
        return first

    # -- one round -----------------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self) -> StepRecord:
        """One round: draft, tree, verify, walk and commit, then its record. Where the session queues drafts
        (`queues_draft`), the next round's draft is queued as soon as this round's tokens are known, after the
        record's reads are queued and before the host waits for them: on a GPU the host builds the record (and a
        page renders it) while the drafter runs; the queued draft's time is the next round's "draft" phase."""
        if not self.started:
            raise InputError("nothing to step: prefill a prompt first")
        if self.done:
            raise InputError("this session has finished (end of text or max new tokens); reset to start again")
        record = self.record
        clock = PhaseClock(self._sync, self._cuda_device) if self.time_phases else None

        def lap(name):
            if clock is not None:
                clock.lap(name)

        engine = self.target_engine
        root = self.generated[-1]
        logprobs, drafted = self._draft(root)  # drafted: the queued draft's clock, if it was timed
        if drafted is None:
            lap("draft")

        tree, scores, tree_pass, verified = self._verify_tree(root, logprobs, lap)
        logits = tree_pass.logits
        argmax = chosen = logits.argmax(-1)
        if not self.sampler.greedy:  # the node at depth d chooses the token at position committed_len + d + 1
            positions = torch.as_tensor(tree.depths, device=logits.device) + (self.committed_len + 1)
            chosen = self.sampler.choose(logits, positions)
        if not verified:  # (a verify queued by the last round was timed by its clock, with its draft)
            lap("verify")
        before = engine.snapshot(pending=len(tree)) if record else ()
        ahead = self.draft_ahead and self.queues_draft
        if ahead:  # the walk's result read after the record's reads and the next draft are queued behind it
            accepted, bonus, reads = self._accept_ahead(tree_pass, logits, argmax, chosen, logprobs, lap)
        else:
            accepted, bonus, self._features = engine.accept(tree_pass, chosen)  # the walk and the commit
            self._queued = None  # this round's draft is spent
            lap("commit")
            # what the record reads of the verify's logits and the drafter's log-probs: queued after the commit (on
            # a GPU the copies run after it), then the next draft, then the wait for the copies alone
            reads = self._record_reads(logits, argmax, chosen, logprobs, len(accepted), bonus)
        if isinstance(tree, DeviceTree):
            tree = self._tree_read()
        new_tokens = tuple(self._extend([tree.token_ids[a] for a in accepted[1:]] + [bonus]))
        if self.queues_draft and not self.done and not ahead:
            self._queue_draft(self.committed_len + len(accepted))
        timings = {**(drafted.times() if drafted is not None else {}), **clock.times()} if clock is not None else {}
        host = self._host(*reads)
        if not host.pop("finite") and self.nonfinite_round is None:
            self.nonfinite_round = len(self.history)
        target_argmax = host["argmax"]
        state_error = engine.state_error(tree, accepted)
        own = len(tree) - 1 if self.method in CHAINS else self.budget
        step = StepRecord(
            index=len(self.history), committed_len=self.committed_len, root_token_id=root,
            nodes=self._nodes(tree) if record else (), target_argmax=tuple(target_argmax), accepted=tuple(accepted),
            target_choice=() if self.sampler.greedy else tuple(host["chosen"]), target_prob=tuple(host.get("probs", ())),
            bonus_token_id=bonus, timings_ms=timings, cache=engine.snapshot() if record else (),
            cache_before_commit=before, new_token_ids=new_tokens, method=self.method, verify=self.verify,
            bonus_draft_rank=host.get("bonus_rank"), bonus_draft_logprob=host.get("bonus_logprob"),
            naive_state_error=state_error if state_error is not None else (),
            budget_curve={str(b): v for b, v in analysis.budget_curve_of(accepted, own).items()} if record else {},
            **self._record_fields(host), **(selector_fields(tree, scores) if record and scores is not None else {}),
        )
        self.committed_len += len(accepted)
        self.history.append(step)
        self._unnamed.update(step.target_argmax, step.target_choice, (n.token_id for n in step.nodes),
                             (t for row in step.target_top_ids for t in row),
                             (t for row in step.draft_top_ids for t in row))
        return step

    def _verify_tree(self, root: int, logprobs: torch.Tensor, lap):
        """The round's tree (and the selector's scores, where they made it), the engine's pass over it, and whether
        the last round queued both (_queue_verify; taken here, for this root and context). Where the session
        launches ahead (DDTree's marginal tree on the host), the engine's verify is queued while the top-k comes back
        (engines' launch_ahead), so the host's launch overlaps the draft still running. Between the launch and the
        forward the host only waits on the main stream and allocates nothing on the device or in pinned memory
        (either may wait on the whole device, which waits on the launch); whatever the tree's making raises, the
        launch is let go."""
        engine = self.target_engine
        verified, self._verified = self._verified, None  # spent here (a retry after a failure rebuilds both)
        if verified is not None:
            key, tree, self._tree_read, tree_pass = verified
            if key != (root, self.committed_len):
                raise RuntimeError(f"a queued verify for {key} out of step with root {root} at {self.committed_len}")
            self.verified_ahead += 1
            return tree, None, tree_pass, True
        if self.tree_on_device:
            tree = self.tree_builder(root, logprobs)
            self._tree_read = self.tree_builder.queue_host(tree)  # read in step, after the walk's own wait
            lap("tree")
            return tree, None, engine.forward_tensors(tree), False
        # the launch: once the top-k's copies are queued (their pinned buffers taken), before the host waits
        launch = (lambda: engine.launch_ahead(self.tree_size)) if self.launch_ahead else None
        try:
            tree, scores = self._tree(root, logprobs, launch)
        except BaseException:
            if launch is not None:
                engine.release_ahead()  # a no-op where the launch was not made
            raise
        lap("tree")
        return tree, scores, engine.forward(tree), False

    @property
    def queues_draft(self) -> bool:
        """Whether a round queues the next round's draft: `queue_draft` if given, else where it costs no wait (rounds
        not timed by phase, or timed by CUDA events on one GPU; a CPU's timed rounds draft at their start, so a
        page's Step there draws its own round only)."""
        if self.queue_draft is not None:
            return self.queue_draft
        return not self.time_phases or self._cuda_device is not None

    def _accept_ahead(self, tree_pass: TreePass, logits, argmax, chosen, logprobs, lap):
        """The walk and the commit queued on the device (the engine's accept_queued), then, before the host reads
        the walk, the record's reads of it and the next round's draft from what the device holds (its root the
        bonus token, its context the committed length and the path's features: proposer.propose_queued); then the
        read. Returns (accepted path, bonus, the record's reads). A draft that fails here is not queued (the next
        step drafts from the host's values, as `_queue_draft`)."""
        walk = self.target_engine.accept_queued(tree_pass, chosen)
        self._queued = None  # this round's draft is spent
        lap("commit")
        reads = self._record_reads(logits, argmax, chosen, logprobs, walk.length, walk.bonus)
        clock = PhaseClock(self._sync, self._cuda_device) if self.time_phases or self._cuda_device else None
        try:
            drafted = self.proposer.propose_queued(walk, self.block_size)
        except Exception as exc:  # noqa: BLE001 - the round stands; the next step drafts again, raises what persists
            drafted, self.queue_error = None, f"{type(exc).__name__}: {exc}"
        if drafted is not None and clock is not None:
            clock.lap("draft")
        verified = self._queue_verify(walk, drafted, clock) if drafted is not None else None
        accepted, bonus, self._features = walk.result()  # the wait: for the walk's copy alone
        if drafted is not None:
            committed = self.committed_len + len(accepted)
            self.proposer.settle(committed)
            self._queued = (bonus, committed), drafted, clock
            if verified is not None:
                self._verified = (bonus, committed), *verified
        return accepted, bonus, reads

    def _queue_verify(self, walk: QueuedWalk, logprobs: torch.Tensor, clock: PhaseClock | None):
        """The next round's tree and verify queued behind its draft, before the host reads this round's walk, where
        the session does (`verify_ahead`) and this round cannot end the output by its length (a round past the end
        costs the device a verify no one reads): the tree from the draft's log-probs with the walk's bonus token as
        its root, on the device, its copy to the host queued, and the engine's pass over it (its inputs' positions
        the device's committed length; its key bucket with room for the walk's path). Returns (tree, its read, the
        pass), or None where it was not queued (one that fails: why in queue_error; the next step makes both)."""
        if not self.verify_ahead or len(self.generated) + self.block_size >= self.max_new_tokens:
            return None
        try:
            tree = self.tree_builder(walk.bonus, logprobs)
            read = self.tree_builder.queue_host(tree)
            if clock is not None:
                clock.lap("tree")
            tree_pass = self.target_engine.forward_tensors(tree, ahead=True)
        except Exception as exc:  # noqa: BLE001 - the round stands; the next step builds and verifies its tree
            self.queue_error = f"{type(exc).__name__}: {exc}"
            return None
        if clock is not None:
            clock.lap("verify")
        return tree, read, tree_pass

    @property
    def verify_ahead(self) -> bool:
        """Whether a round that drafts ahead (`draft_ahead`) queues the next round's tree and verify too
        (_queue_verify): where the session's `verify_ahead` allows it and the tree is built on the device (a
        DeviceTree's root can be the walk's bonus token there)."""
        return self._verify_ahead and self.tree_on_device and self.draft_ahead

    @property
    def draft_ahead(self) -> bool:
        """Whether a round that queues the next draft (`queues_draft`) queues it before the host reads its walk
        (`_accept_ahead`): where the session's `draft_ahead` allows it and it can, the walk on the device (the runner
        engine's accept_queued) and a static drafter made on the target's device (its inputs are the walk's
        tensors)."""
        engine, proposer = self.target_engine, self.proposer
        can = (getattr(engine, "walk", None) == "device" and hasattr(engine, "accept_queued")
               and getattr(proposer, "drafts_queued", False)
               and proposer.runner.device == input_device(self.target))
        return can and self._draft_ahead

    def _draft(self, root: int) -> tuple[torch.Tensor, PhaseClock | None]:
        """This round's drafter log-probs, and the clock that timed them if they were queued by the last round (for
        this root and context); else made now. A draft is spent only when its round commits (step): drafting moves
        the proposer's context on, so a round that fails before its commit (its tree, its verify) leaves the draft
        queued for the next try, which could not draft the same context again."""
        if self._queued is None:
            logprobs = self.proposer.propose(root, self.committed_len, self._features, self.block_size)
            self._queued = (root, self.committed_len), logprobs, None
        key, logprobs, clock = self._queued
        if key != (root, self.committed_len):
            raise RuntimeError(f"a queued draft for {key} out of step with root {root} at {self.committed_len}")
        return logprobs, clock

    def _queue_draft(self, committed_len: int) -> None:
        """The next round's draft, queued now (its root is the last output token, its context this round's
        accepted features) and timed where the rounds may be (CUDA events on one GPU: no wait); the next step
        takes it. A draft that fails here is not queued: this round's record and state are kept whole, and the next
        step drafts as a round does without a queue (an error that persists is raised there)."""
        root = self.generated[-1]
        clock = PhaseClock(self._sync, self._cuda_device) if self.time_phases or self._cuda_device else None
        try:
            logprobs = self.proposer.propose(root, committed_len, self._features, self.block_size)
        except Exception as exc:  # noqa: BLE001 - the round stands; the next step drafts again, raises what persists
            self.queue_error = f"{type(exc).__name__}: {exc}"
            return
        if clock is not None:
            clock.lap("draft")
        self._queued = (root, committed_len), logprobs, clock

    def _record_reads(self, logits, argmax, chosen, logprobs, depth: int,
                      bonus: int) -> tuple[dict[str, torch.Tensor], torch.cuda.Event | None]:
        """The round's record as tensors where they are computed, their copies to the host queued without a wait
        (`_host` waits): the target's choices (argmax, the samples and their probabilities), and when recording its
        margins and top tokens, the drafter's top candidates per depth and its rank and log-prob of the target's
        choice at the depth the walk stopped (`depth` accepted nodes); and on a GPU the event after the copies.
        Queued before the next round's draft, so on a GPU the copies do not wait behind it."""
        reads = {"argmax": argmax, "finite": torch.isfinite(logits).all()}  # (one reduction: invalid_reason)
        greedy = self.sampler.greedy
        if not greedy:
            reads["chosen"] = chosen
        if self.record:
            if not greedy:
                reads["probs"] = self.sampler.probs(logits, chosen)
            k = min(self.target_top_k, logits.shape[-1])
            top2 = None
            if k:  # the distribution the target chooses from: softmax of the logits, or of the filtered tempered ones
                z = logits.float() if greedy else self.sampler.tempered(logits)
                top = torch.topk(z, k, dim=-1)
                reads["target_top_ids"] = top.indices
                reads["target_top_probs"] = torch.exp(top.values - torch.logsumexp(z, dim=-1, keepdim=True))
                if z is logits and k >= 2:  # float32 logits, greedy: their top two are these (one top-k, not two)
                    top2 = top.values[:, :2]
            if top2 is None:
                top2 = torch.topk(logits, 2, dim=-1).values
            reads["margins"] = top2[:, 0] - top2[:, 1]
            k = min(self.draft_top_k if self.method in CHAINS else min(self.budget, self.draft_top_k),
                    logprobs.shape[-1])
            if k:  # what the tree was built from (k = min(budget, cap); the chain: the cap)
                top = torch.topk(logprobs, k, dim=-1)
                reads["draft_top_ids"], reads["draft_top_logprobs"] = top.indices, top.values.float().clamp(min=-999.0)
            reads.update(self._bonus_reads(logprobs, depth, bonus))
        if self._cuda_device is None:  # a CPU, or several devices: plain copies (each waits for its tensor)
            return {name: t.cpu() for name, t in reads.items()}, None
        copies = {name: t.to("cpu", non_blocking=True) for name, t in reads.items()}  # into pinned memory
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(self._cuda_device))
        return copies, ready

    @staticmethod
    def _bonus_reads(logprobs: torch.Tensor, depth, bonus) -> dict[str, torch.Tensor]:
        """The drafter's log-prob and rank of the bonus token at the depth the walk stopped (`depth` accepted nodes,
        the root included: the drafter's row depth - 1), where it drafted that deep. `depth` and `bonus` are ints,
        or [] tensors on the device (a walk not read yet): then the row is gathered there, clamped, and whether the
        drafter drafted that deep goes with the reads (`_host` drops the two where it did not)."""
        rows = logprobs.shape[0]
        if isinstance(depth, int):
            if depth > rows:
                return {}
            row = logprobs[depth - 1]
            return {"bonus_logprob": row[bonus], "bonus_rank": (row > row[bonus]).sum()}
        row = logprobs.index_select(0, (depth - 1).clamp(max=rows - 1).view(1))[0]
        value = row.index_select(0, bonus.view(1))[0]
        return {"bonus_logprob": value, "bonus_rank": (row > value).sum(), "bonus_drafted": depth <= rows}

    @staticmethod
    def _host(copies: dict[str, torch.Tensor], ready: torch.cuda.Event | None) -> dict:
        """`_record_reads`' copies once they have landed (`ready`), as Python values."""
        if ready is not None:
            ready.synchronize()
        host = {name: t.item() if t.dim() == 0 else t.tolist() for name, t in copies.items()}
        if not host.pop("bonus_drafted", True):  # the walk went past the drafter's last depth (_bonus_reads)
            del host["bonus_logprob"], host["bonus_rank"]
        return host

    @staticmethod
    def _record_fields(host: dict) -> dict:
        """The record's margins, the target's top tokens (filtered-out ones left out) and the drafter's top
        candidates (log-probs rounded to 3 decimals, floored at -999: JSON has no infinity), from `_host`'s values."""
        fields = {}
        if "margins" in host:
            fields["target_margin"] = tuple(host["margins"])
        if "target_top_ids" in host:
            ids, probs = host["target_top_ids"], host["target_top_probs"]
            keep = [[j for j, p in enumerate(row) if p > 0] for row in probs]
            fields["target_top_ids"] = tuple(tuple(ids[i][j] for j in kj) for i, kj in enumerate(keep))
            fields["target_top_probs"] = tuple(tuple(round(probs[i][j], 4) for j in kj) for i, kj in enumerate(keep))
        if "draft_top_ids" in host:
            fields["draft_top_ids"] = tuple(tuple(r) for r in host["draft_top_ids"])
            fields["draft_top_logprobs"] = tuple(tuple(round(v, 3) for v in r) for r in host["draft_top_logprobs"])
        return fields

    def _tree(self, root: int, logprobs: torch.Tensor, before_wait=None) -> tuple[DraftTree, SelectorScores | None]:
        """This round's tree, by method and scoring: DFlash's chain, DFlash2's selector chain (sampled with the
        target's position-keyed noise at T > 0: the token at depth d sits at position committed_len + d), or
        DDTree's best-first tree over the per-depth marginals or over the selector's pair scores; and the selector's
        scores where the tree came from them (None elsewhere). `before_wait`: DDTree's marginal tree calls it between
        queueing the top-k's copies to the host and waiting for them (_verify_tree's launch ahead)."""
        if self.method == DFLASH:
            return DraftTree.chain_from_logprobs(root, logprobs), None
        if self.method == DDTREE and self.tree_scoring == MARGINAL:
            return DraftTree.from_logprobs(root, logprobs, self.budget, before_wait=before_wait), None
        scores = self.proposer.selector_scores()
        cond_root, cond_pair = (t.numpy() for t in scores.conditional())
        if self.method == DDTREE:
            return build_selector_tree(root, cond_root, cond_pair, scores.ids.numpy(), self.budget), scores
        noise = None
        if not self.sampler.greedy:
            positions = torch.arange(1, scores.ids.shape[0] + 1) + self.committed_len
            noise = gumbel_noise_at(self.sampler.seed, positions, scores.ids).numpy()
        return selector_chain(root, cond_root, cond_pair, scores.ids.numpy(), noise,
                              self.sampler.temperature or 1.0), scores

    def _nodes(self, tree: DraftTree) -> tuple[TreeNode, ...]:
        return tuple(
            TreeNode(i, tree.parents[i], tree.depths[i], tree.token_ids[i], self.token_text(tree.token_ids[i]),
                     float(tree.logprobs[i]), tree.ranks[i])
            for i in range(len(tree))
        )

    def _extend(self, tokens: list[int]) -> list[int]:
        """Append this round's tokens to the output, stopping at end of text or max new tokens."""
        added = []
        for token in tokens:
            if len(self.generated) >= self.max_new_tokens:
                break
            self.generated.append(int(token))
            added.append(int(token))
            if token in self.eos_ids:
                break
        if len(self.generated) >= self.max_new_tokens or (self.generated and self.generated[-1] in self.eos_ids):
            self.done = True
        return added

    def run(self, max_steps: int | None = None) -> list[StepRecord]:
        records = []
        while not self.done and (max_steps is None or len(records) < max_steps):
            records.append(self.step())
        return records

    # -- comparison with the target's own decoding -----------------------------------------------------------

    def _engine_reference(self) -> EngineGreedy:
        if self._reference_engine is None:
            self._reference_engine = make_engine(self.engine, self.target, None, tree_size=self.block_size,
                                                 block_size=self.block_size, max_new_tokens=self.max_new_tokens)
        return EngineGreedy(self._reference_engine, self.prompt_ids, self.eos_ids, sampler=self.sampler,
                            chain=self.block_size)

    @property
    def reference_engine(self) -> TargetEngine | None:
        """The engine the reference decodes on (None: transformers' own forward)."""
        return self._reference_engine if self.reference != TRANSFORMERS_REFERENCE else None

    def _reference(self) -> GreedyReference:
        if not self.started:
            raise InputError("prefill a prompt first")
        if self._greedy is None:
            self._greedy = (GreedyReference(self.target, self.prompt_ids, self.eos_ids, sampler=self.sampler,
                                            chain=self.block_size)
                            if self.reference == TRANSFORMERS_REFERENCE else self._engine_reference())
        return self._greedy

    def greedy(self, upto: int | None = None, most: int | None = None) -> GreedyResult:
        """The reference: the target's own tokens for this prompt, greedy or sampled with this session's
        sampler (same seed, same position-keyed noise): the first `upto` (default: all max_new_tokens). `most`:
        at most this many more tokens decoded by this call (GreedyReference.extend_to)."""
        ref = self._reference()
        return ref.extend_to(self.max_new_tokens if upto is None else min(upto, self.max_new_tokens), self.generated,
                             most)

    def check_reference(self, independent: bool = False) -> GreedyReference | None:
        """The reference a check extends, as far as it has gone (None: not made yet): the session's (greedy()), or
        with `independent` transformers' own forward (check_transformers())."""
        if independent and self.reference != TRANSFORMERS_REFERENCE:
            return self._independent
        return self._greedy

    def reference_target(self) -> int:
        """How far the check of the output (divergence_check) extends the reference: every token a finished
        session could have had (max new tokens: an output ended at end of text is checked past its end), else
        the tokens generated so far."""
        return self.max_new_tokens if self.done else len(self.generated)

    @property
    def reference_shares_prefill(self) -> bool:
        """True when the reference started from a copy of this session's prefilled state (its `greedy_seconds`
        has no prefill of its own)."""
        return isinstance(self._greedy, EngineGreedy) and self._greedy.shared_prefill

    @property
    def greedy_seconds(self) -> float:
        """Time the reference has spent so far (for tokens/s side by side with the rounds)."""
        return self._greedy.seconds if self._greedy is not None else 0.0

    def check_transformers(self, upto: int | None = None, most: int | None = None) -> tuple[GreedyResult, float]:
        """The independent check: transformers' own forward, one token at a time, over the first `upto` tokens
        (default: those generated so far; `most`: at most this many more in this call). Returns its tokens and the
        seconds it has spent in all."""
        if not self.started:
            raise InputError("prefill a prompt first")
        if self.reference == TRANSFORMERS_REFERENCE:
            ref = self._reference()
        else:
            if self._independent is None:
                self._independent = GreedyReference(self.target, self.prompt_ids, self.eos_ids, sampler=self.sampler,
                                                    chain=self.block_size)
            ref = self._independent
        n = len(self.generated) if upto is None else upto
        return ref.extend_to(min(n, self.max_new_tokens), self.generated, most), ref.seconds

    def divergence(self) -> tuple[int | None, float | None]:
        """(index of the first generated token that differs from the reference, the reference's decision margin
        there: greedy's top-1 minus top-2 logit, or the sampled scores' top-2 gap; None where only one token
        survived the filters). While running, only the tokens generated so far are compared."""
        check = self.divergence_check()
        return check.index, check.margin

    def divergence_check(self, extend: bool = True) -> DivergenceCheck:
        """The first divergence from the reference, its margin, and the verdict on it (noise or mismatch) with
        its evidence. extend=False: compare with the reference only as far as it has decoded (pending = True
        when that is short of the output)."""
        ref = self._reference()
        if extend:
            result = self.greedy(self.reference_target())
        else:
            result = ref.result()
        pending = (not extend and len(result.ids) < len(self.generated) and not ref.finished
                   and len(result.ids) < self.max_new_tokens)
        output = self.generated[:len(result.ids)] if pending else self.generated
        idx = first_divergence(output, result.ids)
        gap = result.margins[idx] if idx is not None and idx < len(result.margins) else None
        gap = gap if gap is not None and math.isfinite(gap) else None
        drift, drift_n = self._drift(result, len(output) if idx is None else idx)
        invalid = invalid_reason(self.nonfinite_round, result.nonfinite, self.reference)
        return DivergenceCheck(idx, gap, result.noise, result.noise_positions, drift, drift_n,
                               verdict(gap, result.noise) if idx is not None and invalid is None else None,
                               self.reference, pending, result, invalid)

    def _drift(self, ref: GreedyResult, upto: int) -> tuple[float | None, int]:
        """max |tree pass margin - reference margin| over the output tokens before `upto` that the rounds chose
        at an accepted position (greedy only: a sampled round records logit margins, the reference score gaps).
        The leading rounds compared in full are kept (_drift_done) and not compared again: the reference's tokens
        and margins never change once decoded, and a page asks twice a Step over every round so far."""
        if not self.sampler.greedy or not self.record:
            return None, 0
        limit = min(upto, len(ref.ids), len(ref.margins))
        owner, done, kept, then = self._drift_done
        if owner is not self._greedy or then > limit:  # (a smaller limit: never from the page, whose only grows)
            done, kept = 0, ()
        deltas = list(kept)
        complete, counted = done, len(deltas)  # the leading rounds compared in full, and their deltas
        offset = len(self.prompt_ids)
        for k in range(done, len(self.history)):
            r = self.history[k]
            first = r.committed_len - offset + 1  # the output index the root's choice decides
            if r.target_margin:
                for j, a in enumerate(r.accepted):
                    i = first + j
                    if i >= limit:
                        break
                    if r.choices[a] == ref.ids[i]:
                        delta = abs(r.target_margin[a] - ref.margins[i])
                        if math.isfinite(delta):
                            deltas.append(delta)
            if complete == k and first + len(r.accepted) <= limit:
                complete, counted = k + 1, len(deltas)
        if complete > done:
            self._drift_done = (self._greedy, complete, tuple(deltas[:counted]), limit)
        return (max(deltas) if deltas else None), len(deltas)

    @property
    def mean_acceptance(self) -> float:
        return float(np.mean([r.kept for r in self.history])) if self.history else 0.0

    def to_trace(self, with_greedy: bool = True, extend: bool = True) -> Trace:
        """The session as a Trace. extend=False: the reference only as far as it has decoded (a page shows the
        round at once and checks it next; reference_pending says the comparison is not complete yet)."""
        greedy_ids, div, margin, check = None, None, None, None
        if with_greedy and self.started:
            check = self.divergence_check(extend)
            greedy_ids, div, margin = check.result.ids, check.index, check.margin
        extra = {} if check is None else dict(
            numerical_noise=check.noise, noise_positions=check.noise_positions, tree_drift=check.drift,
            drift_positions=check.drift_positions, divergence_verdict=check.verdict, reference_pending=check.pending,
            reference_ms=self.greedy_seconds * 1e3, invalid=check.invalid)
        return Trace(
            target=self.pair.target_name, draft=self.pair.draft_name, prompt=self.prompt, prompt_ids=tuple(self.prompt_ids),
            output_ids=tuple(self.generated), greedy_ids=greedy_ids, first_divergence=div, settings=self.settings,
            steps=tuple(self.history), divergence_margin=margin, output_text=self.output_text,
            token_texts=self._token_texts(greedy_ids), prefill_ms=self.prefill_ms, prefill_cache=self.prefill_cache,
            **extra,
            **self._prompt_fields(),
        )

    def _prompt_fields(self) -> dict:
        """The trace's record of how the prompt was given: the raw messages (system prompt first), the chat
        template switch and the thinking flag (None: the template's default, or no chat template)."""
        spec = self.prompt_spec
        if spec is None or not spec.chat:
            return {}
        return dict(messages=tuple(spec.conversation()), chat_template=True, thinking=spec.thinking)

    def _token_texts(self, greedy_ids) -> dict[str, str]:
        """Text of every id the trace names (prompt, output, reference, records), by str(id). Kept as the ids
        appear: each call decodes only the ids named since the last and copies the dict, so a Step's to_trace does
        not decode, sort or gather every id of the session again (at 27B shapes with random weights the records
        name ~31,000 ids by round 100, which cost the page's Step 20 ms: docs/lab/NOTEBOOK.md section 22)."""
        for source, ids in (("prompt", self.prompt_ids), ("output", self.generated), ("reference", greedy_ids or ())):
            self._name_new(source, ids)
        texts, unnamed = self._texts, self._unnamed
        for i in unnamed:
            key = str(i)
            if key not in texts:
                texts[key] = self.token_text(i)
        unnamed.clear()
        return dict(texts)

    def _name_new(self, source: str, ids) -> None:
        """Queue the ids of a list that only grows while a prompt lasts (the prompt's, the output's, the
        reference's) past those queued before (prefill's reset starts every count again). A shorter view of it (a
        trace without the reference, or the reference cut to the output) queues nothing and forgets nothing."""
        count = self._named[source]
        self._unnamed.update(ids[count:])
        self._named[source] = max(count, len(ids))


WARM_PROMPT = "def add(a, b):\n    return a + b\n\nprint(add(2, 3))"


def warm_rounds(pair: ModelPair, settings: DecodeSettings, rounds: int = 2) -> float:
    """A short session of `settings` run and dropped (its prefill, `rounds` rounds and their check against the
    reference), so that what a process makes at its first round of a tree size is made now: the Triton kernels of
    the tree rule and the tree at budget + 1 positions, the drafter's compiled pieces and graphs' shapes, the GEMM
    libraries' choices at these row counts. The page calls it at load (page/host.py) with its default settings, so a
    user's first Step costs a round and the graphs' capture, not the compiler. Returns the seconds it took."""
    start = time.perf_counter()
    block = settings.block_size or pair.drafter.block_size
    s = settings.replace(max_new_tokens=max(settings.max_new_tokens, (rounds + 1) * block))
    session = DecodeSession.from_settings(pair, s)
    session.prefill(prompt=WARM_PROMPT)
    for _ in range(rounds):
        if session.done:
            break
        session.step()
    session.divergence_check()
    return time.perf_counter() - start
