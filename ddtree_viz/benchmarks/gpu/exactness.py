"""--exactness: DDTree (oracle drafts at chosen ranks, so trees are deep) against greedy decoding at real widths,
on transformers' forward (exactness) and on the runner (fast_exactness: against its own greedy and transformers',
each divergence judged against the runner's measured noise; plain, FP8 or 4-bit weights), and the outcomes counted
(verdict_summary)."""

from __future__ import annotations

from dataclasses import asdict

import torch

from .config import BenchConfig
from ..harness import progress
from .models import build_quantized_target, build_target, layer_devices, pair_of


def verdict_summary(results: list[dict]) -> dict:
    """A check list's runs by outcome: identical, or diverging with the verdict `noise`, `mismatch` or none (no noise
    measured there); `mismatches_none` is the reduced-precision target (every divergence within the noise)."""
    from ...trace import VERDICT_MISMATCH, VERDICT_NOISE

    counts = {"runs": len(results), "identical": sum(r["identical"] for r in results)}
    for name, verdict in (("noise", VERDICT_NOISE), ("mismatch", VERDICT_MISMATCH), ("unjudged", None)):
        counts[name] = sum(not r["identical"] and r.get("verdict") == verdict for r in results)
    return {**counts, "mismatches_none": counts["mismatch"] == 0 and counts["unjudged"] == 0}


def exactness_setup(bench: BenchConfig, layers: int, dtype: torch.dtype, prompt_len: int, weights: str = "plain"):
    """The exactness checks' target (real widths, random weights; `weights` "fp8" or "int4": quantized weights made
    at random), its pair (no drafter: oracle drafts) and a seeded random prompt."""
    target = (build_target(bench, layers, dtype) if weights == "plain"
              else build_quantized_target(bench, layers, dtype, weights))
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, target.config.vocab_size, (prompt_len,), generator=gen).tolist()
    return target, pair_of(bench, target, None, dtype), prompt


@torch.no_grad()
def exactness(bench: BenchConfig, layers: int, dtype: torch.dtype, budgets: list[int], new_tokens: int,
              prompt_len: int = 64, ranks_list=((0,), (1,), (0, 2, 1))) -> list[dict]:
    """DDTree (oracle drafts at chosen ranks, so trees are deep) vs the target's own greedy decoding."""
    from ...engine.oracle import OracleProposer
    from ...analysis import first_divergence
    from ...engine.reference import GreedyReference
    from ...engine.session import DecodeSession

    target, pair, prompt = exactness_setup(bench, layers, dtype, prompt_len)
    greedy = GreedyReference(target, prompt, set()).extend_to(new_tokens)
    results = []
    for budget in budgets:
        for ranks in ranks_list:
            oracle = OracleProposer(greedy.ids, prompt_len, list(ranks), target.config.vocab_size, block_size=16)
            session = DecodeSession.of(pair, budget=budget, max_new_tokens=new_tokens, proposer=oracle,
                                       engine="transformers")  # the runner's exactness: fast_exactness
            session.prefill(prompt_ids=prompt)
            session.run()
            idx = first_divergence(session.generated, greedy.ids)
            results.append({
                "layers": layers, "dtype": str(dtype).removeprefix("torch."), "budget": budget, "ranks": list(ranks),
                "tokens": len(session.generated), "rounds": len(session.history), "mean_acceptance": session.mean_acceptance,
                "identical": idx is None, "first_divergence": idx,
                "greedy_margin_at_divergence": greedy.margins[idx] if idx is not None else None,
                "min_greedy_margin": min(greedy.margins),
                **({"layer_devices": layer_devices(target)} if bench.split else {}),
            })
            progress("exactness", results[-1])
    del target
    if bench.cuda:
        torch.cuda.empty_cache()
    return results


@torch.no_grad()
def fast_exactness(bench: BenchConfig, layers: int, dtype: torch.dtype, budgets: list[int], new_tokens: int,
                   prompt_len: int = 64, ranks_list=((0,), (1,), (0, 2, 1)), weights: str = "plain") -> list[dict]:
    """The runner's DDTree (oracle drafts) vs the runner's greedy, and the runner's greedy vs transformers' (`weights`
    "fp8" or "int4": on quantized weights made at random, each result saying so). Each divergence is judged as the page judges one
    (check.verdict): its margin against the runner's own numerical noise, measured over the same tokens (the
    largest |margin of a chain pass - margin of the one-token step| where both choose the same token)."""
    from ...engine.engines import RunnerEngine
    from ...engine.oracle import OracleProposer
    from ...engine.runner import StaticRunner
    from ...analysis import first_divergence
    from ...engine.check import verdict
    from ...engine.reference import EngineGreedy, GreedyReference
    from ...engine.session import DecodeSession

    target, pair, prompt = exactness_setup(bench, layers, dtype, prompt_len, weights)
    runner = StaticRunner(target, max_len=prompt_len + new_tokens + 512, sizes=[1, *(b + 1 for b in budgets)],
                          forms=bench.runner_forms())

    def engine(tree_size: int) -> RunnerEngine:  # every check on the one runner (its graphs are captured once)
        return RunnerEngine(target, None, tree_size=tree_size, block_size=16, max_new_tokens=new_tokens, runner=runner)

    # the runner's greedy, then again with its noise measured: chains over the first run's tokens (as long as the
    # runner's largest tree takes) beside the one-token steps, which decide the same tokens
    first = EngineGreedy(engine(1), prompt, set(), control=False).extend_to(new_tokens).ids
    reference = EngineGreedy(engine(1), prompt, set(), chain=min(16, max(budgets) + 1)).extend_to(new_tokens, first)
    greedy, margins, noise = list(reference.ids), reference.margins, reference.noise
    judged = {"runner_noise": noise, "runner_noise_positions": reference.noise_positions,
              "runner_greedy_repeated": greedy == list(first)}  # the same tokens twice (the chains change nothing)
    hf = list(GreedyReference(target, prompt, set()).extend_to(new_tokens).ids)
    idx = first_divergence(greedy, hf)
    results = [{"layers": layers, "dtype": str(dtype).removeprefix("torch."), "weights": weights,
                "check": "runner greedy vs transformers greedy",
                "runner_options": asdict(runner.forms), "kernel_error": runner.kernel_error,
                "compile_error": runner.compile_error, "identical": idx is None, "first_divergence": idx,
                "runner_margin_at_divergence": margins[idx] if idx is not None else None,
                "verdict": verdict(margins[idx], noise) if idx is not None else None, **judged}]
    progress("fast_exactness", results[-1])
    for budget in budgets:
        for ranks in ranks_list:
            oracle = OracleProposer(greedy, prompt_len, list(ranks), target.config.vocab_size, block_size=16)
            session = DecodeSession.of(pair, budget=budget, max_new_tokens=new_tokens, proposer=oracle,
                                       engine=engine(budget + 1), record=False)
            session.prefill(prompt_ids=prompt)
            session.run()
            out, rounds = session.generated, [r.kept for r in session.history]
            idx = first_divergence(out, greedy)
            results.append({"layers": layers, "dtype": str(dtype).removeprefix("torch."), "weights": weights,
                            "check": "runner ddtree vs runner greedy",
                            "budget": budget, "ranks": list(ranks), "rounds": len(rounds),
                            "mean_acceptance": sum(rounds) / len(rounds), "identical": idx is None, "first_divergence": idx,
                            "greedy_margin_at_divergence": margins[idx] if idx is not None else None,
                            "verdict": verdict(margins[idx], noise) if idx is not None else None,
                            "min_greedy_margin": min(margins), **judged})
            progress("fast_exactness", results[-1])
    del runner, target
    if bench.cuda:
        torch.cuda.empty_cache()
    return results
