"""What a round and a greedy step cost on this machine (speedup.py's c(b) and g), and real runs that check a
prediction.

`measure_costs` times, for each budget, rounds of a session on the engine asked for (after one warm-up round),
each phase with the session's PhaseClock and the whole round with the wall clock after a device wait, and keeps the
medians; greedy's step is the same engine's one-token step (the speed-up's denominator, as `bench` and the page
use). Rounds run lean (`record=False`: no top-k grids, no cache snapshots), as a decoder in production would.

`timed_runs` decodes prompts for real at one budget (or with the chain) and returns tokens, rounds and the rounds'
wall time: the measured side of speedup.py's validation.
"""

from __future__ import annotations

import platform
import statistics
import time
from dataclasses import dataclass

import torch

from ..errors import InputError
from ..options import DDTREE, DFLASH, MAX_NEW_TOKENS, check_int
from ..speedup import PHASES, CostTable, RoundCost, costs_key, now
from .engines import engine_for
from .models import ModelPair
from .sampling import GREEDY, Sampler
from .session import DecodeSession, EngineGreedy
from .verify import EXACT

MIN_ROUNDS, MAX_ROUNDS = 2, 1000
GREEDY_STEPS = 32


def device_name(pair: ModelPair) -> str:
    device = torch.device(pair.device if isinstance(pair.device, str) else "cpu")
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(device)
    return f"{platform.machine() or 'cpu'} cpu, {torch.get_num_threads()} threads"


def pair_key(pair: ModelPair, engine: str, block_size: int, record: bool = False) -> str:
    return costs_key(pair.target_name, pair.draft_name, str(pair.dtype).removeprefix("torch."), str(pair.device),
                     device_name(pair), engine, block_size, record)


def _session(pair: ModelPair, method: str, budget: int, block_size: int | None, engine: str, max_new: int,
             sampler: Sampler) -> DecodeSession:
    return DecodeSession(pair, budget=budget, block_size=block_size, method=method, engine=engine, record=False,
                         time_phases=True, max_new_tokens=max_new, sampler=sampler)


def _round_cost(session: DecodeSession, prompt_ids: list[int], rounds: int) -> RoundCost:
    """Median phases and wall time of `rounds` rounds (a finished session starts the prompt again, untimed)."""
    phases = {p: [] for p in PHASES}
    totals = []
    session.prefill(prompt_ids=prompt_ids)
    session.step()  # warm-up: first use of this tree size (allocations, compiled pieces, graphs)
    while len(totals) < rounds:
        if session.done:
            session.prefill(prompt_ids=prompt_ids)
        session.target_engine.sync()
        start = time.perf_counter()
        step = session.step()
        session.target_engine.sync()
        total = (time.perf_counter() - start) * 1e3
        totals.append(total)
        for p in PHASES[:-1]:
            phases[p].append(step.timings_ms.get(p, 0.0))
        phases["host"].append(max(total - sum(step.timings_ms.get(p, 0.0) for p in PHASES[:-1]), 0.0))
    med = {p: statistics.median(v) for p, v in phases.items()}
    return RoundCost(**med, total=statistics.median(totals), rounds=len(totals))


def greedy_step_ms(session: DecodeSession, prompt_ids: list[int], steps: int = GREEDY_STEPS) -> float:
    """The engine's one-token step: `steps` steps after the prefill and a first token (both untimed)."""
    greedy = EngineGreedy(session.target_engine, prompt_ids, set(), with_margins=False, sampler=session.sampler)
    greedy.extend_to(2)
    before = greedy.seconds
    greedy.extend_to(2 + steps)
    return (greedy.seconds - before) * 1e3 / steps


def measure_costs(pair: ModelPair, prompt_ids: list[int], budgets, *, engine: str = "auto",
                  block_size: int | None = None, rounds: int = 8, chain: bool = True,
                  sampler: Sampler = GREEDY, progress=None) -> CostTable:
    """The cost table of `pair` on `engine` at `budgets` (each 1..MAX_BUDGET), the chain's round at the block size
    when `chain`, and greedy's step. `prompt_ids`: the context the rounds start from (a real prompt of the set)."""
    rounds = check_int("cost rounds", rounds, MIN_ROUNDS, MAX_ROUNDS)
    budgets = sorted({check_int("budget", b, 1, 10**9) for b in budgets})
    if not budgets:
        raise InputError("cost measurement needs at least one budget")
    if not prompt_ids:
        raise InputError("cost measurement needs a prompt")
    say = progress or (lambda text: None)
    engine = engine_for(engine, EXACT, pair.target)
    max_new = min(MAX_NEW_TOKENS, (rounds + 2) * 64)  # enough for every timed round; a finished session restarts
    costs = {}
    for b in budgets:
        say(f"budget {b}: {rounds} rounds")
        session = _session(pair, DDTREE, b, block_size, engine, max_new, sampler)
        costs[b] = _round_cost(session, prompt_ids, rounds)
    say("greedy step")
    greedy_ms = greedy_step_ms(session, prompt_ids)
    chain_cost = None
    if chain:
        say(f"chain (block {session.block_size}): {rounds} rounds")
        chain_cost = _round_cost(_session(pair, DFLASH, 1, session.block_size, engine, max_new, sampler),
                                 prompt_ids, rounds)
    return CostTable(key=pair_key(pair, engine, session.block_size), device=str(pair.device),
                     device_name=device_name(pair), engine=engine, block_size=session.block_size,
                     greedy_ms=greedy_ms, rounds=costs, chain=chain_cost, measured_at=now())


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


def timed_runs(pair: ModelPair, prompts: list[list[int]], *, method: str = DDTREE, budget: int = 32,
               block_size: int | None = None, max_new_tokens: int = 64, engine: str = "auto",
               sampler: Sampler = GREEDY) -> TimedRun:
    """Decode each prompt for real (lean rounds, as measure_costs times them); the rounds' wall time summed."""
    engine = engine_for(engine, EXACT, pair.target)
    session = DecodeSession(pair, budget=budget, block_size=block_size, method=method, engine=engine, record=False,
                            max_new_tokens=max_new_tokens, sampler=sampler)
    tokens = rounds = 0
    seconds = 0.0
    outputs = []
    for ids in prompts:
        session.prefill(prompt_ids=ids)
        while not session.done:
            session.target_engine.sync()
            start = time.perf_counter()
            step = session.step()
            session.target_engine.sync()
            seconds += time.perf_counter() - start
            tokens, rounds = tokens + step.kept, rounds + 1
        outputs.append(tuple(session.generated))
    return TimedRun(tokens, rounds, seconds, tuple(outputs))


def timed_greedy(pair: ModelPair, prompts: list[list[int]], *, max_new_tokens: int = 64, engine: str = "auto",
                 sampler: Sampler = GREEDY) -> TimedRun:
    """The target's own decoding of each prompt on `engine` (one-token steps), its steps' time (prefill and the
    first token apart, as the rounds' prefill is): a "round" is one token."""
    engine = engine_for(engine, EXACT, pair.target)
    session = DecodeSession(pair, budget=1, engine=engine, record=False, max_new_tokens=max_new_tokens,
                            sampler=sampler)
    tokens = 0
    seconds = 0.0
    outputs = []
    for ids in prompts:
        greedy = EngineGreedy(session.target_engine, ids, pair.eos_token_ids, with_margins=False, sampler=sampler)
        greedy.extend_to(1)
        before = greedy.seconds
        result = greedy.extend_to(max_new_tokens)
        seconds += greedy.seconds - before
        tokens += len(result.ids) - 1
        outputs.append(tuple(result.ids))
    return TimedRun(tokens, tokens, seconds, tuple(outputs))
