"""Side-by-side speed of plain greedy decoding, DFlash (chain) and DDTree on the same prompts, in one run.

What is timed, the same way for all three methods: from the start of the prompt's prefill until
`max_new_tokens` tokens have been generated (or end of text), with the prompt already tokenised. Plain
greedy is `greedy_decode` (transformers' own forward, one token per step); DFlash and DDTree are
`DecodeSession` runs (method "dflash" / "ddtree", exact verification, on the default engine unless told: the
static runner on a Qwen3.5 hybrid, engines.default_engine), including the bookkeeping a session
does per round (tree records, cache snapshots), since that is what the tool runs. Each method is warmed up
once, untimed, before any measurement. Per prompt and repeat the three methods run back to back.

tokens/s = generated tokens / seconds, summed over every prompt and repeat. Each run is timed by the benchmarks' one
harness (benchmarks/harness.py: timed_call, to the end of the models' device work).
mean acceptance = tokens gained per target forward (accepted drafts + the bonus), pooled over all rounds.

Sampling (a Sampler with T > 0, engine/sampling.py): every method samples with the same seed and position-keyed
noise, so "greedy" is then plain sampled decoding (one token per forward) and the speculative outputs must still
equal it token for token. `run_sweep` measures several temperatures on the same prompts in one run.

No printing here: the CLI prints, tests and scripts read the result.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import torch

from ..errors import InputError
from ..prompts import DEFAULT_PROMPTS
from ..speedup import degenerate
from ..engine.engines import AUTO, engine_for
from ..engine.models import ModelPair
from ..engine.prompts import PromptSpec, check_spec, encode
from ..engine.sampling import GREEDY, Sampler
from ..analysis import first_divergence
from ..engine.reference import EngineGreedy, greedy_decode
from ..engine.session import DecodeSession
from ..engine.verify import EXACT, device_sync
from .harness import timed_call

# the speculative methods' sessions, and a DFlash2 drafter's two more: its selector's own chain and DDTree's tree
# under the selector's pair scores (the marginal tree and the per-depth argmax chain run for it too)
SPECULATIVE = {"dflash": dict(method="dflash"), "ddtree": dict(method="ddtree")}
SELECTOR_METHODS = {"dflash2": dict(method="dflash2"), "ddtree-selector": dict(method="ddtree", tree_scoring="selector")}
RUNNER_METHODS = ("runner-greedy", "runner-ddtree")  # --runner: the static runner (engine/runner/), same prompts
MAX_REPEATS = 100
WARMUP_TOKENS = 8


@dataclass
class MethodRun:
    """One timed generation."""

    output_ids: list[int]
    seconds: float
    rounds: int = 0  # target forwards after the prefill (speculative methods)
    accepted: int = 0  # tokens gained over those rounds, bonus included

    @property
    def tokens(self) -> int:
        return len(self.output_ids)


@dataclass
class PromptResult:
    prompt: str
    prompt_tokens: int
    runs: dict[str, list[MethodRun]] = field(default_factory=dict)  # method -> one run per repeat

    def tokens(self, method: str) -> int:
        return sum(r.tokens for r in self.runs[method])

    def seconds(self, method: str) -> float:
        return sum(r.seconds for r in self.runs[method])

    def tok_s(self, method: str) -> float:
        return _ratio(self.tokens(method), self.seconds(method))

    def mean_acceptance(self, method: str) -> float:
        return _ratio(sum(r.accepted for r in self.runs[method]), sum(r.rounds for r in self.runs[method]))

    def divergence(self, method: str) -> int | None:
        """First generated token where `method` differs from greedy (first repeat), None when identical."""
        return first_divergence(self.runs[method][0].output_ids, tuple(self.runs["greedy"][0].output_ids))


@dataclass
class BenchResult:
    settings: dict
    model: str
    prompts: list[PromptResult]

    def _total(self, method: str, what: str) -> float:
        return sum(getattr(p, what)(method) for p in self.prompts)

    def tok_s(self, method: str) -> float:
        return _ratio(self._total(method, "tokens"), self._total(method, "seconds"))

    def speedup(self, method: str) -> float:
        return _ratio(self.tok_s(method), self.tok_s("greedy"))

    def mean_acceptance(self, method: str) -> float:
        accepted = sum(r.accepted for p in self.prompts for r in p.runs[method])
        rounds = sum(r.rounds for p in self.prompts for r in p.runs[method])
        return _ratio(accepted, rounds)

    def identical_to_greedy(self, method: str) -> bool:
        return all(p.divergence(method) is None for p in self.prompts)

    def _selector_keys(self) -> dict:
        """A DFlash2 drafter's methods (SELECTOR_METHODS) under the seven keys' names, where they ran."""
        out = {}
        for m in SELECTOR_METHODS:
            if m in self.prompts[0].runs:
                key = m.replace("-", "_")
                out.update({f"{key}_tok_s": self.tok_s(m), f"{key}_speedup": self.speedup(m),
                            f"{key}_mean_acceptance": self.mean_acceptance(m),
                            f"{key}_identical_to_greedy": self.identical_to_greedy(m)})
        return out

    def degenerate(self, method: str) -> list[str]:
        """Why outputs of `method` look degenerate (speedup.degenerate: a token looping, repeated n-grams), one
        reason per flagged prompt (first repeat): fast garbage reads as a high tokens/s."""
        return [f"prompt {i + 1}: {r}" for i, p in enumerate(self.prompts)
                if (r := degenerate(p.runs[method][0].output_ids))]

    def to_dict(self) -> dict:
        """The bench JSON: the seven keys of docs/ARCHITECTURE.md first, then details."""
        return {
            "greedy_tok_s": self.tok_s("greedy"),
            "dflash_tok_s": self.tok_s("dflash"),
            "ddtree_tok_s": self.tok_s("ddtree"),
            "ddtree_speedup": self.speedup("ddtree"),
            "dflash_speedup": self.speedup("dflash"),
            "ddtree_mean_acceptance": self.mean_acceptance("ddtree"),
            "dflash_mean_acceptance": self.mean_acceptance("dflash"),
            "identical_to_greedy": all(self.identical_to_greedy(m) for m in self.prompts[0].runs
                                       if not m.endswith("greedy")),
            "dflash_identical_to_greedy": self.identical_to_greedy("dflash"),
            "ddtree_identical_to_greedy": self.identical_to_greedy("ddtree"),
            **self._selector_keys(),
            **({"runner_greedy_tok_s": self.tok_s("runner-greedy"), "runner_ddtree_tok_s": self.tok_s("runner-ddtree"),
                "runner_ddtree_speedup_vs_runner_greedy": _ratio(self.tok_s("runner-ddtree"), self.tok_s("runner-greedy")),
                "runner_ddtree_speedup": self.speedup("runner-ddtree"),
                "runner_ddtree_mean_acceptance": self.mean_acceptance("runner-ddtree"),
                "runner_identical_to_greedy": self.identical_to_greedy("runner-greedy")
                and self.identical_to_greedy("runner-ddtree")} if self.settings.get("runner") else {}),
            "degenerate": {m: self.degenerate(m) for m in self.prompts[0].runs},
            "model": self.model,
            "settings": self.settings,
            "timing": "seconds from the start of prefill to the last generated token, prompt pre-tokenised, "
                      "after one untimed warm-up per method; tok/s = tokens / seconds summed over prompts and repeats",
            "prompts": [
                {
                    "prompt": p.prompt,
                    "prompt_tokens": p.prompt_tokens,
                    **{
                        m: {
                            "tokens": p.tokens(m),
                            "seconds": p.seconds(m),
                            "median_seconds": statistics.median(r.seconds for r in p.runs[m]),
                            "tok_s": p.tok_s(m),
                            **({} if m.endswith("greedy") else {
                                "rounds": sum(r.rounds for r in p.runs[m]),
                                "mean_acceptance": p.mean_acceptance(m),
                                "first_divergence": p.divergence(m),
                            }),
                        }
                        for m in p.runs
                    },
                }
                for p in self.prompts
            ],
        }


def _ratio(a: float, b: float) -> float:
    return float(a) / float(b) if b else 0.0


def _sync(pair: ModelPair):
    return device_sync(pair.target, pair.drafter)


def _timed(fn, sync) -> tuple:
    """(fn()'s result, its seconds), from an idle device to the end of fn's work (the harness's timed_call)."""
    sync()
    result, ms = timed_call(fn, sync)
    return result, ms / 1e3


def _greedy(pair: ModelPair, prompt_ids: list[int], max_new_tokens: int, sync, sampler: Sampler = GREEDY) -> MethodRun:
    result, seconds = _timed(lambda: greedy_decode(pair.target, prompt_ids, max_new_tokens, pair.eos_token_ids,
                                                   sampler), sync)
    return MethodRun(list(result.ids), seconds)


def _speculative(session: DecodeSession, prompt_ids: list[int], sync) -> MethodRun:
    def decode() -> None:
        session.prefill(prompt_ids=prompt_ids)
        session.run()

    _, seconds = _timed(decode, sync)
    return MethodRun(list(session.generated), seconds, len(session.history), sum(r.kept for r in session.history))


def _engine_greedy(session: DecodeSession, prompt_ids: list[int], sync) -> MethodRun:
    """Greedy decoding through the session's target engine (one-node trees), timed like the others."""
    def decode() -> list[int]:
        reference = EngineGreedy(session.target_engine, prompt_ids, session.eos_ids, with_margins=False,
                                 sampler=session.sampler)
        return reference.extend_to(session.max_new_tokens).ids

    ids, seconds = _timed(decode, sync)
    return MethodRun(list(ids), seconds)


def run_bench(
    pair: ModelPair, prompts: list[str | PromptSpec] | tuple[str | PromptSpec, ...] | None = None, *, budget: int = 32, max_new_tokens: int = 64,
    block_size: int | None = None, repeats: int = 1, warmup: bool = True, progress=None, runner: bool = False,
    sampler: Sampler = GREEDY, engine: str = AUTO,
) -> BenchResult:
    """Measure greedy, DFlash chain and DDTree (exact) on each prompt, all choosing with `sampler` (greedy by
    default); with a DFlash2 drafter also its selector's chain (`dflash2`) and DDTree under the selector's pair
    scores (`ddtree-selector`). A prompt is raw text or a PromptSpec (engine/prompts.py: the chat template, a system prompt,
    thinking); each result's `prompt` is the text that went into the prefill (templated, with --chat). DFlash and
    DDTree run on `engine` ("auto": engines.default_engine, the fastest exact engine for the target, as `run` and
    the page use; "transformers" for the reference path). `progress(text)` is called between runs."""
    prompts = list(DEFAULT_PROMPTS if prompts is None else prompts)
    if not prompts:
        raise InputError("bench needs at least one prompt")
    specs = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, PromptSpec):
            specs.append(check_spec(prompt))
        elif not isinstance(prompt, str) or prompt == "":
            raise InputError(f"bench prompt {i + 1} is empty: every prompt needs some text")
        else:
            specs.append(PromptSpec(text=prompt))
    if isinstance(repeats, bool) or not isinstance(repeats, int) or not 1 <= repeats <= MAX_REPEATS:
        raise InputError(f"repeats must be a whole number between 1 and {MAX_REPEATS}, not {repeats!r}")
    say = progress or (lambda text: None)
    # Sessions validate budget / max new tokens / block size before anything runs. The runner's DDTree records
    # only what decoding needs (its greedy runs through the same engine, so they share one static runner).
    engine = engine_for(engine, EXACT, pair.target)
    kinds = dict(SPECULATIVE, **(SELECTOR_METHODS if getattr(pair.drafter, "family", "dflash") == "dflash2" else {}))
    sessions = {m: DecodeSession.of(pair, budget=budget, max_new_tokens=max_new_tokens, block_size=block_size,
                                    sampler=sampler, engine=engine, **kind) for m, kind in kinds.items()}
    if runner:
        sessions["runner-ddtree"] = DecodeSession.of(pair, budget=budget, max_new_tokens=max_new_tokens,
                                                     block_size=block_size, engine="runner", record=False,
                                                     sampler=sampler)
    prompted = [encode(pair.tokenizer, spec) for spec in specs]  # the chat template applied where asked
    prompts = [p.text for p in prompted]
    encoded = [list(p.ids) for p in prompted]
    sync = _sync(pair)
    methods = ("greedy", *kinds) + (RUNNER_METHODS if runner else ())

    def timed(method: str, ids: list[int]) -> MethodRun:
        if method == "greedy":
            return _greedy(pair, ids, max_new_tokens, sync, sampler)
        if method == "runner-greedy":
            return _engine_greedy(sessions["runner-ddtree"], ids, sync)
        return _speculative(sessions[method], ids, sync)

    if warmup:
        say("warming up")
        warm = min(max_new_tokens, WARMUP_TOKENS)
        _greedy(pair, encoded[0], warm, sync, sampler)
        for m, kind in kinds.items():
            s = DecodeSession.of(pair, budget=budget, max_new_tokens=warm, block_size=sessions[m].block_size,
                                 sampler=sampler, engine=engine, **kind)
            _speculative(s, encoded[0], sync)
        if runner:  # on the benchmarked session itself: that is where the graphs are captured
            fast = sessions["runner-ddtree"]
            EngineGreedy(fast.target_engine, encoded[0], fast.eos_ids, with_margins=False, sampler=sampler).extend_to(warm)
            fast.prefill(prompt_ids=encoded[0])
            fast.run(max_steps=2)

    results = []
    for i, (prompt, ids) in enumerate(zip(prompts, encoded)):
        result = PromptResult(prompt, len(ids), {m: [] for m in methods})
        for r in range(repeats):
            say(f"prompt {i + 1}/{len(prompts)}, repeat {r + 1}/{repeats}")
            # Speculative sessions first: their prefill checks the prompt (empty / too long) before greedy runs.
            for m in (*reversed(tuple(kinds)), "greedy") + (RUNNER_METHODS if runner else ()):
                result.runs[m].append(timed(m, ids))
        results.append(result)

    ddtree = sessions["ddtree"]
    settings = dict(budget=ddtree.budget, block_size=ddtree.block_size, max_new_tokens=ddtree.max_new_tokens,
                    repeats=repeats, verify="exact", engine=engine, dtype=ddtree.settings["dtype"], device=pair.device,
                    warmup=warmup, torch_threads=torch.get_num_threads(), runner=runner,
                    cuda_graphs=bool(runner and sessions["runner-ddtree"].cache.graphs), **sampler.settings,
                    **_chat_settings(specs))
    return BenchResult(settings, pair.describe(), results)


def _chat_settings(specs: list[PromptSpec]) -> dict:
    """How the prompts went in: chat_template (bool) and thinking (None: the template's default), when every
    prompt was given the same way (the CLI's --chat / --thinking apply to all), else per prompt as lists."""
    chat = [s.chat for s in specs]
    thinking = [s.thinking for s in specs]
    return dict(chat_template=chat[0] if len(set(chat)) == 1 else chat,
                thinking=thinking[0] if len(set(thinking)) == 1 else thinking)


def run_sweep(pair: ModelPair, prompts=None, temperatures=(0.0,), *, top_k: int = 0, top_p: float = 1.0,
              seed: int = 0, progress=None, **options) -> list[BenchResult]:
    """run_bench at each temperature (same prompts, filters and seed), one BenchResult per temperature. Every
    sampler is made before anything runs, so a bad setting stops the sweep at once."""
    samplers = [Sampler(t, top_k, top_p, seed) for t in temperatures]
    if not samplers:
        raise InputError("bench needs at least one temperature")
    say = progress or (lambda text: None)
    results = []
    for sampler in samplers:
        label = f"T {sampler.temperature:g}: "
        results.append(run_bench(pair, prompts, sampler=sampler, progress=lambda text, label=label: say(label + text),
                                 **options))
    return results


def sweep_dict(results: list[BenchResult]) -> dict:
    """The bench JSON of a sweep: the first temperature's figures (the seven keys first), and with several
    temperatures `by_temperature`, each one's whole figures in the order measured."""
    out = results[0].to_dict()
    if len(results) > 1:
        out["by_temperature"] = [r.to_dict() for r in results]
    return out


__all__ = ["DEFAULT_PROMPTS", "RUNNER_METHODS", "SELECTOR_METHODS", "BenchResult", "MethodRun", "PromptResult", "run_bench", "run_sweep",
           "sweep_dict"]
