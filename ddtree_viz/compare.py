"""Compare mode, written once: configuration B is A's settings with some changed, decoded on A's prompt with A's
sampler, stepped beside A; the two recorded together as a CompareTrace (trace.py). `run --compare` and the page's
compare mode both go through here.

Which pair B decodes on (A's, or the same models in B's dtype) is the caller's: it loads models, this module
does not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from .options import DecodeSettings, engine_for_verify

if TYPE_CHECKING:  # torch-free at import: the CLI reads COMPARE_KEYS while parsing
    from .engine.models import ModelPair
    from .engine.prompts import PromptSpec
    from .engine.sampling import Sampler
    from .engine.session import DecodeSession

# What B may change: its DecodeSettings fields, and the dtype (which picks B's pair: the caller's).
COMPARE_KEYS = ("budget", "block_size", "method", "verify", "engine", "dtype", "tree_scoring")


def settings_b(a: DecodeSettings, changes: Mapping) -> DecodeSettings:
    """B's settings: A's with `changes` (keys of COMPARE_KEYS; "dtype" is left to the caller). An engine not named
    in the changes is A's, where it runs B's verify mode; else the reference path (naive rounds run on
    transformers' forward only: options.engine_for_verify). A named engine is taken as named."""
    b = a.replace(**{k: v for k, v in changes.items() if k != "dtype"})
    if "engine" not in changes:
        b = b.replace(engine=engine_for_verify(a.engine, b.verify))
    return b


def start_b(pair: ModelPair, settings: DecodeSettings, spec: PromptSpec, sampler: Sampler, rounds: int = 0,
            **runtime) -> DecodeSession:
    """B's session: `settings` (settings_b's) on A's prompt (`spec`) with A's `sampler`, prefilled and stepped
    `rounds` rounds (A's so far: the two then step in lockstep), unless it finishes first. `runtime`: as for
    DecodeSession.of (recorded top-k, ...)."""
    from .engine.session import DecodeSession

    b = DecodeSession.of(pair, settings, sampler=sampler, **runtime)
    b.prefill(spec=spec)
    while len(b.history) < rounds and not b.done:
        b.step()
    return b


def step_both(a: DecodeSession, b: DecodeSession | None) -> None:
    """One round of each configuration that has not finished: A and (compare mode) B; one that finished first
    leaves the other to go on alone."""
    if not a.done:
        a.step()
    if b is not None and not b.done:
        b.step()


def finished(a: DecodeSession, b: DecodeSession | None) -> bool:
    """Both configurations done (A alone outside compare mode)."""
    return a.done and (b is None or b.done)
