"""--costs (issue #30 at real shapes): the runner's cost table (a round per budget, the chain's round, greedy's step)
and S(b) at an acceptance the run controls (an oracle drafter on a float32 target at real widths)."""

from __future__ import annotations

import torch

from ..harness import clock
from .config import BenchConfig
from .exactness import exactness_setup
from .models import measured_models, pair_of


# the oracle drafter's rank of the true token, position by position (cycled): the chain stops at the first rank
# above 0, a tree reaches ranks 1-3 where its budget allows: an acceptance the run controls
COST_RANKS = (0, 0, 1, 0, 0, 2, 0, 0, 0, 1, 0, 3)


@torch.no_grad()
def cost_study(bench: BenchConfig, layers: int, dtype: torch.dtype, budgets: list[int], prompt_len: int = 512,
               rounds: int = 8, ranks=COST_RANKS) -> dict:
    """issue #30 at real shapes: the runner's cost table (engine/costs.py: a round per budget, the chain's round,
    greedy's step) with the DFlash drafter's real pass, and S(b) (speedup.py) at an acceptance the run controls.
    Tokens per round come from an oracle drafter (the target's own greedy tokens at ranks `ranks`) on the target at
    real widths, 8 layers, float32, where the tree's decode equals greedy exactly (a bf16 target with random weights
    has near-zero margins: its greedy and its tree passes part at once, and the oracle would draft the wrong tokens);
    a session at the largest budget gives the counterfactual for every smaller one, a chain session the chain's."""
    from ...engine.costs import measure_costs
    from ...speedup import predict, tokens_per_round

    target, drafter, sync, out = measured_models(bench, layers, dtype)
    pair = pair_of(bench, target, drafter, dtype)
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, target.config.vocab_size, (prompt_len,), generator=gen).tolist()
    t0 = clock()
    table = measure_costs(pair, prompt, budgets, engine="runner", rounds=rounds)
    out["measure_s"] = clock() - t0
    out["costs"] = table.to_dict()
    del pair, target, drafter
    if bench.cuda:
        torch.cuda.empty_cache()
    runs, out["oracle"] = oracle_rounds(bench, max(budgets), table.block_size, rounds, ranks)
    prediction = predict(runs["ddtree"], table, tokens_per_round(runs["dflash"]))
    out["speedup"] = prediction.to_dict()
    out["cost_table"] = cost_lines(table, prediction)
    return out


def oracle_rounds(bench: BenchConfig, budget: int, block: int, rounds: int, ranks, prompt_len: int = 64):
    """DDTree at `budget` and the chain, oracle drafts at `ranks`, on the fp32 8-layer real-width target: their
    rounds, and what they were (ranks, layers, whether each decode equals the runner's greedy)."""
    from ...engine.engines import RunnerEngine
    from ...engine.oracle import OracleProposer
    from ...engine.runner import StaticRunner
    from ...engine.reference import EngineGreedy
    from ...engine.session import DecodeSession

    layers = 8 if not bench.smoke else 4
    target, pair, prompt = exactness_setup(bench, layers, torch.float32, prompt_len)
    new = (rounds + 2) * block
    runner = StaticRunner(target, max_len=prompt_len + new + 512, sizes=[1, block, budget + 1],
                          forms=bench.runner_forms())

    def engine(tree_size: int) -> RunnerEngine:
        return RunnerEngine(target, None, tree_size=tree_size, block_size=block, max_new_tokens=new, runner=runner)

    greedy = list(EngineGreedy(engine(1), prompt, set(), with_margins=False).extend_to(new).ids)
    runs, info = {}, {"ranks": list(ranks), "layers": layers, "dtype": "float32", "budget": budget}
    for method, b, size in (("ddtree", budget, budget + 1), ("dflash", 1, block)):
        oracle = OracleProposer(greedy, prompt_len, list(ranks), target.config.vocab_size, block_size=block)
        session = DecodeSession.of(pair, budget=b, method=method, max_new_tokens=new, proposer=oracle,
                                   engine=engine(size), record=False, block_size=block)
        session.prefill(prompt_ids=prompt)
        runs[method] = session.run()
        info[f"{method}_identical_to_greedy"] = session.generated == greedy[:len(session.generated)]
    del runner, target
    if bench.cuda:
        torch.cuda.empty_cache()
    return runs, info


def cost_lines(table, prediction) -> str:
    """The cost table and S(b) as text: one row per budget, the chain last."""
    head = (f"{'budget':>7} {'draft':>7} {'tree':>7} {'verify':>7} {'commit':>7} {'host':>7} {'round':>8} "
            f"{'x step':>7} {'tau':>6} {'S(b)':>6}")
    lines = [f"greedy step {table.greedy_ms:.2f} ms", head]
    rows = [(str(b), c, prediction.budgets.get(b)) for b, c in sorted(table.rounds.items())]
    rows.append(("chain", table.chain, prediction.chain))
    for label, c, p in rows:
        tail = f" {p.tau:>6.2f} {p.speedup:>6.2f}" if p is not None else ""
        lines.append(f"{label:>7} {c.draft:>7.2f} {c.tree:>7.2f} {c.verify:>7.2f} {c.commit:>7.2f} {c.host:>7.2f} "
                     f"{c.total:>8.2f} {c.total / table.greedy_ms:>7.2f}{tail}")
    lines.append(f"best budget {prediction.best_budget}, break-even budget {prediction.break_even_budget}")
    return "\n".join(lines)
