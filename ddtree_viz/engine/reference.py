"""The target's own decoding of a prompt, extended on demand: the reference every session is checked against.

    GreedyReference  transformers' own forward, one token at a time, no tree code involved (the independent check);
                     it also measures its own numerical noise (docs/EXACTNESS.md, "Noise or bug")
    EngineGreedy     the same loop through a target engine (one-node trees): a runner session's reference
    greedy_decode    the target's own decoding of a prompt, at once

Greedy, or with a sampler at T > 0 the same position-keyed sampling a session uses (sampling.py). What the session
does with a reference (the check, the verdict on a divergence) is engine/check.py's.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from .backends import sdpa_backends
from .cache import compact_kv
from .engines import TargetEngine
from .sampling import GREEDY, Sampler, margin
from .tree import build_chain, one_node
from .verify import EXACT, device_sync, input_device, verify_tree


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
