"""Does the tree beat the chain, and at which budget? Measured costs and exact counterfactuals put together.

A round's cost at budget b, `c(b)` = draft + tree + verify(b) + commit + host, and the greedy step `g` are measured
on the machine in use (`engine/costs.py: measure_costs`, cached here by model, engine and device). A session's (or a
prompt set's) rounds give, for every budget b up to their own, the tokens they would have gained under b
(`analysis.session_budget_curve`, exact per round). Together:

    tau(b) = tokens gained under b / rounds         (tokens per round)
    S(b)   = tau(b) * g / c(b)                       (tokens/s over greedy's tokens/s)

The DFlash chain's point comes from real chain rounds (its own tau) and its own measured cost. The best budget is
the measured budget with the largest S; the break-even budget is the largest measured budget at which the tree is
still at least as fast as the chain (as greedy when there is no chain point): past it a bigger tree loses.

The caveat (docs/SPEEDUP.md): each round's counterfactual starts from the state that round really started in; a
session run at budget b would have started its later rounds elsewhere, and its costs at other context lengths.
`analyze` checks the prediction by real runs (the `validation` rows). Pure functions and plain data: no torch.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import analysis
from .errors import InputError
from .trace import StepRecord

PHASES = ("draft", "tree", "verify", "commit", "host")
CACHE_ENV = "DDTREE_VIZ_CACHE"  # a folder; default ~/.cache/ddtree-viz
CACHE_FILE = "costs.json"
CACHE_VERSION = 2  # 2: a round's cost has `first` (a decode's first round)


@dataclass(frozen=True)
class RoundCost:
    """One round's measured cost in milliseconds: the mean over the timed rounds of each phase and of the whole
    round (host = the round's wall time minus the phases: building records, the session's own bookkeeping), and of
    a decode's first round, right after its prefill (`first`: the drafter's pass over the prompt's rows too)."""

    draft: float
    tree: float
    verify: float
    commit: float
    host: float
    total: float
    rounds: int  # rounds timed
    first: float

    def per_round(self, tau: float, new_tokens: float | None) -> float:
        """A round's share of a decode of `new_tokens` tokens at `tau` tokens a round: `total`, plus the first
        round's extra time spread over the decode's new_tokens / tau rounds, one at least (None: a steady round,
        `total`)."""
        return self.total + ((self.first - self.total) / max(new_tokens / tau, 1.0) if new_tokens else 0.0)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "RoundCost":
        """Checked as a cache entry must be (CostTable.from_dict): this version's keys, every time a finite number,
        the phases >= 0, the whole round > 0, at least one round timed (a 0, NaN or negative cost would make every
        speed-up figure after it wrong or infinite)."""
        names = {f.name for f in dataclasses.fields(cls)}
        _keys(d, names, "a round's cost")
        values = {name: _finite(d[name], name) for name in names}
        if any(values[p] < 0 for p in PHASES if p != "host") or values["total"] <= 0 or values["first"] <= 0:
            raise InputError(f"a round's cost must have phases >= 0 ms, a total > 0 ms and a first round > 0 ms, "
                             f"not {dict(values)}")
        if values["rounds"] < 1 or values["rounds"] != int(values["rounds"]):
            raise InputError(f"a round's cost must count whole rounds >= 1, not {d['rounds']!r}")
        return cls(**{**values, "rounds": int(values["rounds"])})


@dataclass(frozen=True)
class CostTable:
    """The costs of one model pair on one engine and device: greedy's step and a round per budget (and the chain's
    round at the block size). `key` names what was measured (costs_key); `measured_at` is an ISO date-time."""

    key: str
    device: str
    device_name: str
    engine: str
    block_size: int
    greedy_ms: float
    rounds: dict[int, RoundCost]
    chain: RoundCost | None
    measured_at: str

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["rounds"] = {str(b): dataclasses.asdict(c) for b, c in sorted(self.rounds.items())}
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "CostTable":
        """A table as the cache or a report keeps it, every entry checked (InputError naming the first bad one)."""
        try:
            _keys(d, {f.name for f in dataclasses.fields(cls)}, "a cost table")
            if not isinstance(d["rounds"], Mapping) or not d["rounds"]:
                raise InputError("a cost table's rounds must be a non-empty object of budget -> cost")
            rounds = {_budget(b): RoundCost.from_dict(c) for b, c in d["rounds"].items()}
            chain = RoundCost.from_dict(d["chain"]) if d["chain"] is not None else None
            greedy = _finite(d["greedy_ms"], "greedy_ms")
            if greedy <= 0:
                raise InputError(f"a cost table's greedy_ms must be > 0, not {greedy}")
            block = d["block_size"]
            if isinstance(block, bool) or not isinstance(block, int) or block < 2:
                raise InputError(f"a cost table's block_size must be a whole number >= 2, not {block!r}")
            texts = {name: d[name] for name in ("key", "device", "device_name", "engine", "measured_at")}
            if not all(isinstance(v, str) for v in texts.values()):
                raise InputError("a cost table's key, device, device_name, engine and measured_at must be text")
            return cls(**texts, block_size=block, greedy_ms=greedy, rounds=rounds, chain=chain)
        except (TypeError, AttributeError) as exc:
            raise InputError(f"not a cost table: {type(exc).__name__} {exc}") from None


def _keys(d: Any, names: set[str], what: str) -> None:
    if not isinstance(d, Mapping):
        raise InputError(f"{what} must be an object, not {type(d).__name__}")
    if set(d) != names:
        missing, extra = sorted(names - set(d)), sorted(set(d) - names)
        raise InputError(f"{what} has not this version's keys (missing {missing}, unknown {extra})")


def _finite(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InputError(f"{name} must be a finite number, not {value!r}")
    return float(value)


def _budget(key: Any) -> int:
    text = str(key)
    if not (text.isascii() and text.isdigit()) or len(text) > 6 or int(text) < 1:
        raise InputError(f"a cost table's budget must be a whole number >= 1, not {key!r}")
    return int(text)


def costs_key(target: str, draft: str, dtype: str, device: str, device_name: str, engine: str, block_size: int,
              record: bool) -> str:
    """What a cost table depends on, as one string (the cache's key)."""
    return json.dumps(dict(target=target, draft=draft, dtype=dtype, device=device, device_name=device_name,
                           engine=engine, block_size=block_size, record=record), sort_keys=True)


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


# ----------------------------------------------------------------------------------------------------------
# The cache: one JSON file of tables by key
# ----------------------------------------------------------------------------------------------------------


def cache_path() -> Path:
    root = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "ddtree-viz")
    return Path(root) / CACHE_FILE


def _read_cache(path: Path) -> dict[str, Any]:
    """The cache's tables by key; an unreadable or foreign file counts as empty (it is only a cache)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return {}
    if not isinstance(data, dict) or data.get("version") != CACHE_VERSION or not isinstance(data.get("tables"), dict):
        return {}
    return data["tables"]


def cached_costs(key: str, path: Path | None = None, notes: list[str] | None = None) -> CostTable | None:
    """The cache's table for `key`, or None: none there, or an entry that fails CostTable.from_dict's checks (then
    `notes`, if given, gets why: the caller measures again and says so)."""
    entry = _read_cache(path or cache_path()).get(key)
    if entry is None:
        return None
    try:
        return CostTable.from_dict(entry)
    except InputError as exc:
        if notes is not None:
            notes.append(f"the cached cost table was not used ({exc})")
        return None


def save_costs(table: CostTable, path: Path | None = None) -> Path:
    """Add (or replace) `table` in the cache; written to a temporary file and renamed, so a reader never sees half."""
    path = path or cache_path()
    tables = _read_cache(path)
    tables[table.key] = table.to_dict()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"version": CACHE_VERSION, "tables": tables}, indent=1, allow_nan=False),
                   encoding="utf-8")
    os.replace(tmp, path)
    return path


# ----------------------------------------------------------------------------------------------------------
# The prediction
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Point:
    """One method at one budget: tokens per round, a round's cost, tokens/s and the speed-up over greedy."""

    tau: float
    round_ms: float
    tokens_per_s: float
    speedup: float

    def to_dict(self) -> dict[str, float]:
        """speedup.json's keys for one point."""
        return dict(tau=self.tau, round_ms=self.round_ms, predicted_tokens_per_s=self.tokens_per_s,
                    predicted_speedup=self.speedup)

    @classmethod
    def of(cls, tau: float, round_ms: float, greedy_ms: float) -> "Point":
        return cls(tau, round_ms, 1e3 * tau / round_ms, tau * greedy_ms / round_ms)


@dataclass(frozen=True)
class Prediction:
    greedy_ms: float
    budgets: dict[int, Point]
    chain: Point | None
    best_budget: int | None
    break_even_budget: int | None
    rounds: int  # DDTree rounds the counterfactual is summed over

    new_tokens: float | None = None  # the decodes' mean length whose first rounds the costs include (None: steady rounds)

    def to_dict(self) -> dict[str, Any]:
        return dict(greedy_ms=self.greedy_ms, budgets={str(b): p.to_dict() for b, p in sorted(self.budgets.items())},
                    best_budget=self.best_budget, break_even_budget=self.break_even_budget,
                    chain=self.chain.to_dict() if self.chain else None, rounds=self.rounds,
                    new_tokens=self.new_tokens)


def tree_rounds(steps: Sequence[StepRecord]) -> list[StepRecord]:
    """The rounds whose counterfactual a prediction may use: DDTree rounds in exact verify mode."""
    return [s for s in steps if s.method == "ddtree" and analysis.curve_is_exact(s)]


def predict(steps: Sequence[StepRecord], costs: CostTable, chain_tau: float | None = None,
            new_tokens: float | None = None) -> Prediction:
    """S(b) at every measured budget the rounds reach (their own budget or less), the chain's point from its tokens
    per round in real chain rounds (`chain_tau`, None: no chain point) and the table's chain cost, the best and the
    break-even budgets. With `new_tokens`, for decodes of that many tokens: each one's first round (its drafter's
    pass over the prompt) spread over its rounds (RoundCost.per_round); without, for steady rounds."""
    rounds = tree_rounds(steps)
    if not rounds:
        raise InputError("no exact DDTree rounds to predict from (naive verify mode and the DFlash chain have no "
                         "budget counterfactual)")
    top = max(analysis.tree_size(s) - 1 for s in rounds)
    curve = analysis.session_budget_curve(rounds, top)
    taus = {b: curve[b] / len(rounds) for b in costs.rounds if b <= top}
    points = {b: Point.of(taus[b], c.per_round(taus[b], new_tokens), costs.greedy_ms)
              for b, c in sorted(costs.rounds.items()) if b <= top}
    chain = None
    if chain_tau is not None and costs.chain is not None:
        chain = Point.of(chain_tau, costs.chain.per_round(chain_tau, new_tokens), costs.greedy_ms)
    best = max(points, key=lambda b: (points[b].speedup, -b)) if points else None
    even = break_even(points, best, chain.speedup if chain else 1.0)
    return Prediction(costs.greedy_ms, points, chain, best, even, len(rounds), new_tokens)


def break_even(points: Mapping[int, Point], best: int | None, floor: float) -> int | None:
    """The largest budget from the best one up whose speed-up is still at least `floor` (the chain's, or greedy's
    1.0), or None: past it a bigger tree loses to what `floor` stands for."""
    even = [b for b, p in points.items() if best is not None and b >= best and p.speedup >= floor]
    return max(even) if even else None


def new_tokens_per_decode(steps: Sequence[StepRecord], decodes: int) -> float | None:
    """The tokens a decode made, on average over `decodes` decodes whose rounds are `steps` (None: none): the
    length over which predict spreads each decode's first round."""
    return sum(s.kept for s in steps) / decodes if decodes and steps else None


def tokens_per_round(steps: Sequence[StepRecord]) -> float | None:
    """Tokens kept per round (None: no rounds): a chain's tau from its real rounds."""
    return sum(s.kept for s in steps) / len(steps) if steps else None


@dataclass(frozen=True)
class SessionSpeedup:
    """Does the tree pay here: one session's own rounds x this machine's measured costs (the page's panel). A
    prediction, resting on `prediction.rounds` rounds, never a measurement."""

    prediction: Prediction  # S(b) at the measured budgets the rounds reach, the best budget, the chain's point
    costs: CostTable
    budget: int  # the session's budget
    reach: int  # the largest budget the rounds' counterfactual covers (their largest tree)
    pays_up_to: int | None  # break-even over greedy: the largest budget from the best up with S >= 1
    chain_nodes: int  # the chain's drafted tokens (block size - 1): its place on the budget axis
    chain_at_least: int  # rounds whose chain count is a lower bound (analysis.chain_gain): its S at least that
    chain_why: str | None  # why there is no chain point (None: there is one)

    @property
    def unreached(self) -> list[int]:
        """Measured budgets past the rounds' reach: no counterfactual there (the session's trees were smaller)."""
        return sorted(b for b in self.costs.rounds if b > self.reach)


def session_speedup(steps: Sequence[StepRecord], costs: CostTable, budget: int, final: bool = False
                    ) -> SessionSpeedup:
    """S(b) of a session's exact DDTree rounds at `costs`' measured budgets (predict), the chain's point from the
    same rounds (analysis.chain_gain: the drafter's top-1 path checked against the target's tokens the round
    verified), and the break-even budget over greedy. `final`: the last of `steps` is the session's last round
    (it stopped there: the chain would have too). InputError where no round has a budget counterfactual."""
    rounds = tree_rounds(steps)
    gains = [analysis.chain_gain(s, final and s is steps[-1]) for s in rounds]
    why = None
    if costs.chain is None:
        why = "the cost table has no chain round"
    elif not rounds or any(g is None for g in gains):
        why = _no_chain_why(rounds[-1] if rounds else None)
    chain_tau = sum(g for g, _ in gains) / len(gains) if why is None else None
    prediction = predict(steps, costs, chain_tau, new_tokens_per_decode(rounds, 1))  # a session: one decode
    return SessionSpeedup(prediction, costs, int(budget), max(analysis.tree_size(s) - 1 for s in rounds),
                          break_even(prediction.budgets, prediction.best_budget, 1.0), costs.block_size - 1,
                          sum(not exact for _, exact in gains) if why is None else 0, why)


def _no_chain_why(step: StepRecord | None) -> str:
    if step is not None and step.selector_pair:
        return "a DFlash2 selector tree: its chain walks the selector's pair scores, not the top-1 at each depth"
    return "the rounds' drafter grids were not recorded"


def validation_budgets(prediction: Prediction) -> list[int]:
    """The budgets real runs check: the best, the measured budget below it and the one above (where they exist)."""
    budgets = sorted(prediction.budgets)
    if prediction.best_budget is None:
        return []
    i = budgets.index(prediction.best_budget)
    return budgets[max(i - 1, 0): i + 2]


def relative_error(predicted: float, measured: float) -> float:
    return predicted / measured - 1.0 if measured > 0 else math.inf


# ----------------------------------------------------------------------------------------------------------
# Fast garbage: a degenerate output
# ----------------------------------------------------------------------------------------------------------

LOOP_SHARE = 0.5  # one token this share of the output (or more)...
REPEAT_SHARE = 0.5  # ...or this share of the output's 4-grams repeats of earlier ones
NGRAM = 4
MIN_TOKENS = 16  # shorter outputs are not judged


def degenerate(ids: Sequence[int]) -> str | None:
    """Why an output looks degenerate, or None: one token looping, or mostly repeated n-grams. Fast decoders that
    loop report high throughput and acceptance (a loop is easy to draft): every throughput figure shows this."""
    ids = list(ids)
    if len(ids) < MIN_TOKENS:
        return None
    token, count = Counter(ids).most_common(1)[0]
    if count >= LOOP_SHARE * len(ids):
        return f"one token is {count} of {len(ids)} output tokens (id {token})"
    grams = [tuple(ids[i:i + NGRAM]) for i in range(len(ids) - NGRAM + 1)]
    repeats = len(grams) - len(set(grams))
    if repeats >= REPEAT_SHARE * len(grams):
        return f"{repeats} of {len(grams)} {NGRAM}-grams repeat earlier ones"
    return None
