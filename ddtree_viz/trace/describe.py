"""What a trace says, in words: the verdict on its first divergence, its reference, its sampling settings (as a
label and as the `run` flags that reproduce it)."""

from __future__ import annotations

from typing import Any

from ..words import plural
from .records import Trace
from .schema import VERDICT_MISMATCH, VERDICT_NOISE


def verdict_text(trace: Trace) -> str | None:
    """The verdict on a trace's first divergence in words, with its evidence; None when nothing diverges."""
    if trace.first_divergence is None or trace.greedy_ids is None:
        return None
    return verdict_words(trace.divergence_verdict, trace.divergence_margin, trace.numerical_noise, trace.noise_positions)


def verdict_words(verdict: str | None, margin: float | None, noise: float | None, positions: int) -> str:
    """'within numerical noise (margin m <= noise n, ...)', 'beyond numerical noise: mismatch (...)', or why
    there is no verdict."""
    if verdict == VERDICT_NOISE and margin == 0.0:
        return "within numerical noise: an exact tie (the reference's top two choices are equal, margin 0)"
    if verdict == VERDICT_NOISE:
        return (f"within numerical noise (margin {margin:.3g} <= noise {noise:.3g}, measured over "
                f"{plural(positions, 'position')})")
    if verdict == VERDICT_MISMATCH:
        return (f"beyond numerical noise: mismatch (margin {margin:.3g} > noise {noise:.3g}, measured over "
                f"{plural(positions, 'position')})")
    if margin is None:
        return "no verdict: no reference margin there (the reference ended, or one token was left to choose)"
    return "no verdict yet: no numerical noise measured so far (it needs stretches of two or more tokens)"


def reference_of(settings: dict[str, Any]) -> str:
    """What a trace's reference ran on: 'runner' or 'transformers' (older traces: transformers' forward)."""
    return settings.get("reference", "transformers")


# Sampling settings (docs/SAMPLING.md): a trace without them (older, or greedy) was decoded greedily.
GREEDY_SAMPLING = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 0, "noise": None}


def sampling_of(settings: dict[str, Any]) -> dict[str, Any]:
    """temperature, top_k, top_p, seed and noise scheme from a trace's settings (greedy where absent)."""
    return {key: settings.get(key, default) for key, default in GREEDY_SAMPLING.items()}


def is_sampled(settings: dict[str, Any]) -> bool:
    return bool(sampling_of(settings)["temperature"])


def sampling_label(settings: dict[str, Any]) -> str:
    """'greedy', or e.g. 'sampling (T 0.7, top-k 50, top-p 0.9, seed 5)' (filters that are off are left out)."""
    s = sampling_of(settings)
    if not s["temperature"]:
        return "greedy"
    parts = [f"T {s['temperature']:g}"]
    parts += [f"top-k {s['top_k']}"] if s["top_k"] else []
    parts += [f"top-p {s['top_p']:g}"] if s["top_p"] < 1 else []
    parts.append(f"seed {s['seed']}")
    return f"sampling ({', '.join(parts)})"


def sampling_flags(settings: dict[str, Any]) -> str:
    """The `run` options that reproduce the trace's choices, e.g. '--temperature 0.7 --top-p 0.9 --seed 5'."""
    s = sampling_of(settings)
    return (f"--temperature {s['temperature']:g} --top-k {s['top_k']} --top-p {s['top_p']:g} --seed {s['seed']}"
            if s["temperature"] else "--temperature 0")
