"""What a round and a greedy step cost on this machine (speedup.py's c(b) and g), and real runs that check a
prediction.

`measure_costs` times, for each budget, rounds of a session on the engine asked for (after one warm-up round),
each phase with the session's PhaseClock and the whole round with the wall clock after a device wait, and keeps the
medians; greedy's step is the same engine's one-token step (the speed-up's denominator, as `bench` and the page
use). Rounds run lean (`record=False`: no top-k grids, no cache snapshots), as a decoder in production would.

`timed_runs` decodes prompts for real at one budget (or with the chain) and returns tokens, rounds and the rounds'
wall time: the measured side of speedup.py's validation, on a GPU after an untimed pass (warm_up: its CUDA graphs
captured, as a long-running decoder has them).
"""

from __future__ import annotations

import platform
import statistics
import time
from dataclasses import dataclass

import torch

from ..errors import InputError
from ..words import plural
from ..options import DDTREE, DFLASH, MARGINAL, MAX_NEW_TOKENS, check_int
from ..speedup import PHASES, CostTable, RoundCost, costs_key, now
from .engines import engine_for
from .models import ModelPair
from .sampling import GREEDY, Sampler
from .reference import EngineGreedy
from .session import DecodeSession
from .verify import EXACT

MIN_ROUNDS, MAX_ROUNDS = 2, 1000
GREEDY_STEPS = 32


def device_name(pair: ModelPair) -> str:
    """The cost table's machine: the GPU's name, else the CPU and its torch threads (they set a CPU's speed)."""
    if not on_threads(pair):
        return torch.cuda.get_device_name(torch.device(pair.device))
    return f"{platform.machine() or 'cpu'} cpu, {torch.get_num_threads()} threads"


def on_threads(pair: ModelPair) -> bool:
    """Whether `pair`'s cost table is keyed by the torch threads (device_name): it runs on the CPU (or is split
    across devices), not on one GPU."""
    device = torch.device(pair.device if isinstance(pair.device, str) else "cpu")
    return not (device.type == "cuda" and torch.cuda.is_available())


def pair_key(pair: ModelPair, engine: str, block_size: int, record: bool = False) -> str:
    """The cost table's key: each model by its name and, where its weights are not plain (a checkpoint's format, a
    drafter quantized at load: --draft-weights), their precision too, since the costs differ."""
    def named(name: str, weights: str | None) -> str:
        return f"{name} [{weights}]" if weights else name

    return costs_key(named(pair.target_name, pair.target_format), named(pair.draft_name, pair.draft_format),
                     str(pair.dtype).removeprefix("torch."), str(pair.device), device_name(pair), engine, block_size,
                     record)


def _session(pair: ModelPair, method: str, budget: int, block_size: int | None, engine: str, max_new: int,
             sampler: Sampler, tree_scoring: str = MARGINAL, time_phases: bool = True) -> DecodeSession:
    """A lean session (no records), as a decoder in production runs; the scoring applies to DDTree only."""
    return DecodeSession.of(pair, budget=budget, block_size=block_size, method=method, engine=engine, record=False,
                            time_phases=time_phases, max_new_tokens=max_new, sampler=sampler,
                            tree_scoring=tree_scoring if method == DDTREE else MARGINAL)


def _timed_step(session: DecodeSession):
    """One round between device waits: (its record, its wall time in ms)."""
    session.target_engine.sync()
    start = time.perf_counter()
    step = session.step()
    session.target_engine.sync()
    return step, (time.perf_counter() - start) * 1e3


class _Timed:
    """One budget's (or the chain's) session and the times of its rounds."""

    def __init__(self, session: DecodeSession):
        self.session = session
        self.phases: dict[str, list[float]] = {p: [] for p in PHASES}
        self.totals: list[float] = []
        self.firsts: list[float] = []

    def start(self, context: list[int]) -> None:
        """The context prefilled and a round run untimed (first use of this tree size here: allocations, compiled
        pieces, graphs), then prefilled again and its first round timed: a decode's first round drafts over the
        prompt's rows too (RoundCost.first)."""
        self.session.prefill(prompt_ids=context)
        self.session.step()
        self.session.prefill(prompt_ids=context)
        self.firsts.append(_timed_step(self.session)[1])

    def time_round(self, context: list[int]) -> None:
        session = self.session
        if session.done:  # a finished session starts the context again, untimed
            self.start(context)
        step, total = _timed_step(session)
        self.totals.append(total)
        for p in PHASES[:-1]:
            self.phases[p].append(step.timings_ms.get(p, 0.0))
        self.phases["host"].append(max(total - sum(step.timings_ms.get(p, 0.0) for p in PHASES[:-1]), 0.0))

    def cost(self) -> RoundCost:
        """Means, not medians: a decode's tokens/s is its tokens over the sum of its rounds' times, slow rounds
        (a collection, a longer context) included, and the prediction divides by the same mean."""
        mean = {p: statistics.fmean(v) for p, v in self.phases.items()}
        return RoundCost(**mean, total=statistics.fmean(self.totals), rounds=len(self.totals),
                         first=statistics.fmean(self.firsts))


def greedy_step_ms(session: DecodeSession, contexts: list[list[int]], steps: int = GREEDY_STEPS) -> float:
    """The engine's one-token step: the mean over contexts of `steps` steps after the prefill and a first token
    (both untimed)."""
    seconds = 0.0
    for ids in contexts:
        greedy = EngineGreedy(session.target_engine, ids, set(), with_margins=False, sampler=session.sampler)
        greedy.extend_to(2)
        before = greedy.seconds
        greedy.extend_to(2 + steps)
        seconds += greedy.seconds - before
    return seconds * 1e3 / (steps * len(contexts))


def measure_costs(pair: ModelPair, contexts, budgets, *, engine: str = "auto", block_size: int | None = None,
                  rounds: int = 8, chain: bool = True, sampler: Sampler = GREEDY, progress=None,
                  tree_scoring: str = MARGINAL) -> CostTable:
    """The cost table of `pair` on `engine` at `budgets` (each 1..MAX_BUDGET), the chain's round at the block size
    when `chain`, and greedy's step. `contexts`: the prompts the rounds start from (token ids; one prompt or a
    list), `rounds` timed rounds per context and budget, one after another as a decode runs them (budgets taking
    turns round by round ran ~25% slower on a CPU: each session's working set evicted the others'); the contexts
    are passes over every budget, so a drift in the machine's speed falls on all of them. Each figure is a mean."""
    rounds = check_int("cost rounds", rounds, MIN_ROUNDS, MAX_ROUNDS)
    budgets = sorted({check_int("budget", b, 1, 10**9) for b in budgets})
    contexts = [list(contexts)] if contexts and isinstance(contexts[0], int) else [list(c) for c in contexts]
    if not budgets:
        raise InputError("cost measurement needs at least one budget")
    if not contexts or not all(contexts):
        raise InputError("cost measurement needs a prompt")
    say = progress or (lambda text: None)
    engine = engine_for(engine, EXACT, pair.target)
    max_new = min(MAX_NEW_TOKENS, (rounds + 2) * 64)  # enough for every timed round; a finished session restarts
    timed = {b: _Timed(_session(pair, DDTREE, b, block_size, engine, max_new, sampler, tree_scoring))
             for b in budgets}
    block = timed[budgets[0]].session.block_size
    if chain:
        timed["chain"] = _Timed(_session(pair, DFLASH, 1, block, engine, max_new, sampler))
    for i, context in enumerate(contexts):
        say(f"context {i + 1}/{len(contexts)} ({plural(len(context), 'token')}): {plural(rounds, 'round')} at each of "
            f"{', '.join(map(str, timed))}")
        for t in timed.values():
            t.start(context)
            for _ in range(rounds):
                t.time_round(context)
    say("greedy step")
    greedy_ms = greedy_step_ms(timed[budgets[0]].session, contexts)
    return CostTable(key=pair_key(pair, engine, block), device=str(pair.device), device_name=device_name(pair),
                     engine=engine, block_size=block, greedy_ms=greedy_ms,
                     rounds={b: timed[b].cost() for b in budgets},
                     chain=timed["chain"].cost() if chain else None, measured_at=now())


@dataclass(frozen=True)
class TimedRun:
    """Real decoding of some prompts at one setting: what it produced and what its rounds took (prefill apart)."""

    tokens: int
    rounds: int
    seconds: float
    outputs: tuple[tuple[int, ...], ...]

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def tau(self) -> float:
        return self.tokens / self.rounds if self.rounds else 0.0


def warm_up(pair: ModelPair, prompts: list[list[int]], decode) -> None:
    """On a GPU, `decode` each prompt once untimed, the longest first, before a timed pass. The runner captures a
    CUDA graph on a shape's first use (a tree size at a length bucket) and is rebuilt, its graphs with it, for a
    prompt longer than its room: a process's one-time costs, as the prefill is a prompt's, which measure_costs
    keeps out of a round's cost by an untimed round at each context. Timed cold, an H100's rounds of the embedded
    pair took 2.28 ms where their cost was 1.74 (docs/lab/NOTEBOOK.md section 51). The longest first sizes the
    runner for all of them, so the timed pass replays what this pass captured. Nothing to warm on a CPU."""
    if not on_threads(pair):
        for ids in sorted(prompts, key=len, reverse=True):
            decode(ids)


def timed_runs(pair: ModelPair, prompts: list[list[int]], *, method: str = DDTREE, budget: int = 32,
               block_size: int | None = None, max_new_tokens: int = 64, engine: str = "auto",
               sampler: Sampler = GREEDY, tree_scoring: str = MARGINAL) -> TimedRun:
    """Decode each prompt for real (lean rounds, as measure_costs times them, after warm_up); the rounds' wall
    time summed."""
    engine = engine_for(engine, EXACT, pair.target)
    session = _session(pair, method, budget, block_size, engine, max_new_tokens, sampler, tree_scoring,
                       time_phases=False)

    def decode(ids) -> tuple[int, int, float]:  # tokens, rounds, seconds
        session.prefill(prompt_ids=ids)
        tokens = rounds = 0
        seconds = 0.0
        while not session.done:
            step, ms = _timed_step(session)
            seconds += ms / 1e3
            tokens, rounds = tokens + step.kept, rounds + 1
        return tokens, rounds, seconds

    warm_up(pair, prompts, decode)
    runs, outputs = [], []
    for ids in prompts:
        runs.append(decode(ids))
        outputs.append(tuple(session.generated))
    tokens, rounds, seconds = (sum(column) for column in zip(*runs)) if runs else (0, 0, 0.0)
    return TimedRun(tokens, rounds, seconds, tuple(outputs))


def timed_greedy(pair: ModelPair, prompts: list[list[int]], *, max_new_tokens: int = 64, engine: str = "auto",
                 sampler: Sampler = GREEDY) -> TimedRun:
    """The target's own decoding of each prompt on `engine` (one-token steps), its steps' time (prefill and the
    first token apart, as the rounds' prefill is): a "round" is one token."""
    engine = engine_for(engine, EXACT, pair.target)
    session = DecodeSession.of(pair, budget=1, engine=engine, record=False, max_new_tokens=max_new_tokens,
                               sampler=sampler)

    def decode(ids) -> tuple[float, tuple[int, ...]]:  # the steps' seconds, the tokens
        greedy = EngineGreedy(session.target_engine, ids, pair.eos_token_ids, with_margins=False, sampler=sampler)
        greedy.extend_to(1)
        before = greedy.seconds
        result = greedy.extend_to(max_new_tokens)
        return greedy.seconds - before, tuple(result.ids)

    warm_up(pair, prompts, decode)
    runs = [decode(ids) for ids in prompts]
    tokens = sum(len(ids) - 1 for _, ids in runs)
    return TimedRun(tokens, tokens, sum(seconds for seconds, _ in runs), tuple(ids for _, ids in runs))
