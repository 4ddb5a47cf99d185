"""The speed-up study of a decoded prompt set (`analyze`): measured costs + the traces' exact counterfactuals ->
S(b) (ddtree_viz/speedup.py), checked by real runs at three budgets, the chain and greedy on the same prompts.
Writes DIR/speedup.json (the contract in docs/ARCHITECTURE.md) and returns it; `table_rows` turns one or several
studies into the papers' table (render/table.py writes it).
"""

from __future__ import annotations

from collections import Counter

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .. import speedup
from ..engine.costs import measure_costs, pair_key, timed_runs, timed_greedy
from ..engine.models import ModelPair
from ..engine.prompts import encode
from ..engine.sampling import Sampler
from ..errors import InputError
from ..options import DDTREE, DFLASH, DecodeSettings
from ..trace import Trace
from .files import write_json
from .report import load_dir

SPEEDUP_FILE = "speedup.json"


def budget_grid(top: int) -> list[int]:
    """Powers of two up to `top`, and `top` itself."""
    grid, b = [], 1
    while b < top:
        grid.append(b)
        b *= 2
    return grid + [top]


COST_CONTEXTS = 4  # prompts of the set the costs are timed from (spread over its prompt lengths)


def cost_contexts(prompts: list[list[int]], n: int = COST_CONTEXTS) -> list[list[int]]:
    """Up to n prompts spread over the set's prompt lengths (shortest to longest)."""
    ordered = sorted(prompts, key=len)
    if len(ordered) <= n:
        return ordered
    return [ordered[round(i * (len(ordered) - 1) / (n - 1))] for i in range(n)]


def costs_for(pair: ModelPair, contexts: list[list[int]], budgets: list[int], *, engine: str, block_size: int,
              rounds: int, remeasure: bool, sampler: Sampler, say, tree_scoring: str = "marginal"
              ) -> tuple[speedup.CostTable, bool]:
    """The cached cost table when it has every budget asked for (and not `remeasure`), else measured and cached.
    Returns (table, whether it came from the cache)."""
    from ..engine.engines import engine_for
    from ..engine.verify import EXACT

    engine = engine_for(engine, EXACT, pair.target)
    key = pair_key(pair, engine, block_size)
    notes: list[str] = []
    table = None if remeasure else speedup.cached_costs(key, notes=notes)
    for note in notes:
        say(f"costs: {note}: measured again")
    if table is not None and set(budgets) <= set(table.rounds) and table.chain is not None:
        say(f"costs: cached ({table.measured_at}, {table.device_name})")
        return table, True
    table = measure_costs(pair, contexts, budgets, engine=engine, block_size=block_size, rounds=rounds,
                          sampler=sampler, progress=lambda t: say("costs: " + t), tree_scoring=tree_scoring)
    try:
        speedup.save_costs(table)
    except OSError as exc:  # only a cache: say so and go on
        say(f"costs: not cached ({exc.strerror or exc})")
    return table, False


def _validate(pair, prompts, prediction: speedup.Prediction, budgets: list[int], settings: DecodeSettings,
              engine: str, sampler: Sampler, say) -> dict[str, Any]:
    """Real runs: greedy, the chain and DDTree at `budgets`, on every prompt; measured vs predicted."""
    common = dict(max_new_tokens=settings.max_new_tokens, engine=engine, sampler=sampler)
    say("validation: greedy")
    greedy = timed_greedy(pair, prompts, **common)
    say("validation: chain")
    chain = timed_runs(pair, prompts, method=DFLASH, block_size=settings.block_size, **common)
    rows = []
    for b in budgets:
        say(f"validation: budget {b}")
        run = timed_runs(pair, prompts, budget=b, block_size=settings.block_size, tree_scoring=settings.tree_scoring,
                         **common)
        point = prediction.budgets[b]
        rows.append(dict(budget=b, predicted_tau=point.tau, measured_tau=run.tau, predicted_round_ms=point.round_ms,
                         measured_round_ms=1e3 * run.seconds / run.rounds if run.rounds else None,
                         predicted_tokens_per_s=point.tokens_per_s, measured_tokens_per_s=run.tokens_per_s,
                         error=speedup.relative_error(point.tokens_per_s, run.tokens_per_s),
                         measured_speedup=run.tokens_per_s / greedy.tokens_per_s if greedy.tokens_per_s else None,
                         identical_to_greedy=run.outputs == greedy.outputs if sampler.greedy else None,
                         degenerate=_degenerate(run.outputs)))
    return dict(greedy=_measured(greedy), chain=_measured(chain, greedy), rows=rows, chain_run=chain)


def _measured(run, greedy=None) -> dict[str, Any]:
    return dict(tau=run.tau, measured_tokens_per_s=run.tokens_per_s, tokens=run.tokens, seconds=run.seconds,
                measured_speedup=(run.tokens_per_s / greedy.tokens_per_s) if greedy and greedy.tokens_per_s else
                (1.0 if greedy is None else None), degenerate=_degenerate(run.outputs))


def _degenerate(outputs) -> dict[str, Any]:
    """How many outputs look degenerate (speedup.degenerate), and the first reason."""
    reasons = [r for r in (speedup.degenerate(o) for o in outputs) if r]
    return dict(outputs=len(outputs), flagged=len(reasons), example=reasons[0] if reasons else None)


def study(pair: ModelPair, out: Path, items: list[dict], spec_of: Callable[[dict], Any], settings: DecodeSettings, *,
          engine: str = "auto", budgets: Sequence[int] | None = None, validate: Sequence[int] | None | bool = True,
          cost_rounds: int = 8, remeasure: bool = False, say=lambda text: None) -> dict[str, Any]:
    """The speed-up study of the set decoded in `out` (its traces); writes out/speedup.json and returns it.
    `budgets`: the cost grid (default: powers of two up to the run's budget); `validate`: True (the best budget, the
    one below, the one above), budgets to run, or False/None (no real runs: the chain's point is then the chain's
    traces' with --method both, else absent)."""
    report = load_dir(out)
    traces = report.traces.get("", {})
    if not traces:
        raise InputError(f"{out}: no traces to predict from")
    order = sorted(traces)
    steps = [s for i in order for s in traces[i].steps]
    grid = sorted(set(budgets or budget_grid(settings.budget)))
    if max(grid) > settings.budget:
        raise InputError(f"the speed-up budgets go up to the run's own budget ({settings.budget}): the counterfactual "
                         f"knows nothing past it, not {max(grid)}")
    by_index = {it["index"]: it for it in items}
    prompts = [list(encode(pair.tokenizer, spec_of(by_index[i])).ids) for i in order]
    sampler = Sampler(settings.temperature, settings.top_k, settings.top_p, settings.seed)
    first = traces[order[0]]
    costs, cached = costs_for(pair, cost_contexts(prompts), grid, engine=engine, block_size=first.settings["block_size"],
                              rounds=cost_rounds, remeasure=remeasure, sampler=sampler, say=say,
                              tree_scoring=settings.tree_scoring)
    chain_traces = report.traces.get(DFLASH, {})
    chain_tau = speedup.tokens_per_round([s for t in chain_traces.values() for s in t.steps])
    per_decode = speedup.new_tokens_per_decode(steps, len(order))
    prediction = speedup.predict(steps, costs, chain_tau, per_decode)
    checked = None
    if validate:
        vb = speedup.validation_budgets(prediction) if validate is True else sorted(set(validate))
        missing = [b for b in vb if b not in prediction.budgets]
        if missing:
            raise InputError(f"--validate budgets must be among the measured budgets {sorted(prediction.budgets)}, "
                             f"not {missing}")
        checked = _validate(pair, prompts, prediction, vb, settings, costs.engine, sampler, say)
        if chain_tau is None and checked["chain_run"].rounds:  # the chain's point from its real rounds
            prediction = speedup.predict(steps, costs, checked["chain_run"].tau, per_decode)
    result = _result(prediction, costs, cached, checked, items, traces)
    write_json(out / SPEEDUP_FILE, result)
    return result


def _result(prediction, costs, cached, checked, items, traces: dict[int, Trace]) -> dict[str, Any]:
    d = prediction.to_dict()
    result = dict(device=costs.device, device_name=costs.device_name, engine=costs.engine, greedy_ms=costs.greedy_ms,
                  budgets=d["budgets"],
                  best_budget=prediction.best_budget, break_even_budget=prediction.break_even_budget,
                  chain=prediction.chain.to_dict() if prediction.chain else None, rounds=prediction.rounds,
                  new_tokens=prediction.new_tokens,
                  validation=checked["rows"] if checked else [],
                  measured=dict(greedy=checked["greedy"], chain=checked["chain"]) if checked else None,
                  costs=costs.to_dict(), costs_cached=cached,
                  degenerate=_degenerate([t.output_ids for t in traces.values()]),
                  categories=_categories(items, traces, costs))
    return result


def _categories(items: list[dict], traces: dict[int, Trace], costs) -> dict[str, Any]:
    """Per category (the prompts' own 'category'): S(b), best and break-even budgets (no chain point)."""
    cats: dict[str, list] = {}
    decodes: Counter = Counter()
    for it in items:
        if isinstance(it.get("category"), str) and it["index"] in traces:
            cats.setdefault(it["category"], []).extend(traces[it["index"]].steps)
            decodes[it["category"]] += 1
    if len(cats) < 2:
        return {}
    out = {}
    for name, steps in sorted(cats.items()):
        p = speedup.predict(steps, costs, new_tokens=speedup.new_tokens_per_decode(steps, decodes[name]))
        out[name] = dict(best_budget=p.best_budget, break_even_budget=p.break_even_budget, rounds=p.rounds,
                         budgets={str(b): q.to_dict() for b, q in p.budgets.items()})
    return out


def table_rows(studies: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The papers' table: per benchmark, greedy, the DFlash chain and DDTree at its best budget; measured speed-up and
    tau where the study ran them, predicted otherwise (`measured` says which)."""
    rows = []
    for bench, s in studies.items():
        best = s["best_budget"]
        check = next((r for r in s["validation"] if r["budget"] == best), None)
        measured = s.get("measured")
        rows.append(dict(benchmark=bench, method="greedy", speedup=1.0, tau=1.0, measured=measured is not None))
        if measured is not None:
            rows.append(dict(benchmark=bench, method="DFlash chain", speedup=measured["chain"]["measured_speedup"],
                             tau=measured["chain"]["tau"], measured=True))
        elif s["chain"] is not None:
            rows.append(dict(benchmark=bench, method="DFlash chain", speedup=s["chain"]["predicted_speedup"],
                             tau=s["chain"]["tau"], measured=False))
        if check is not None:
            rows.append(dict(benchmark=bench, method=f"DDTree (b={best})", speedup=check["measured_speedup"],
                             tau=check["measured_tau"], measured=True))
        elif best is not None:
            p = s["budgets"][str(best)]
            rows.append(dict(benchmark=bench, method=f"DDTree (b={best})", speedup=p["predicted_speedup"],
                             tau=p["tau"], measured=False))
    return rows
