"""The target engines by name, torch-free (no engine import: the renderers read these names too): what each is called, where its class lives, which verify modes it runs,
how its reference is described, and which is preferred when the user names none.

Everything above the engine (options, CLI choices, the page's dropdowns, the trace's reference names) reads its
engine names from here, and `engines.make_engine` builds an engine through its entry, so adding a target engine
touches its own module and this registry only (docs/ARCHITECTURE.md, "Add a target engine").
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

EXACT, NAIVE = "exact", "naive"
VERIFY_MODES = (EXACT, NAIVE)
AUTO = "auto"  # the fastest exact engine that applies: engines.default_engine()


@dataclass(frozen=True)
class EngineEntry:
    """One target engine. `module:cls` names a class with a `name`, a `verify_modes` tuple, a classmethod
    `blocker(target, verify, reference_gdn) -> str | None` (why it cannot run this target; None when it can) and a
    classmethod `create(target, feature_layer_ids, *, verify, reference_gdn, tree_size, block_size,
    max_new_tokens)`."""

    name: str
    module: str  # dotted module path
    cls: str
    verify_modes: tuple[str, ...]
    reference_label: str  # how a reference decoded on this engine is named on the page, in `run` and in traces

    def load(self):
        """The engine's class (imports torch and the engine's module)."""
        return getattr(importlib.import_module(self.module), self.cls)


# In order of preference: `auto` takes the first entry that can run the target (engines.default_engine).
ENTRIES = (
    EngineEntry("runner", "ddtree_viz.engine.engines", "RunnerEngine", (EXACT,),
                "the runner (one-node trees on a second static runner)"),
    EngineEntry("transformers", "ddtree_viz.engine.engines", "TransformersEngine", (EXACT, NAIVE),
                "transformers' own forward (one token at a time)"),
)
BY_NAME = {e.name: e for e in ENTRIES}
ENGINES = tuple(sorted(BY_NAME, key=lambda n: n != "transformers"))  # the reference path first in every list
ENGINE_CHOICES = (AUTO, *ENGINES)
REFERENCE_ENGINE = "transformers"  # the reference path: naive rounds, the reference GDN, and `reference="transformers"`
REFERENCE_NAMES = {e.name: e.reference_label for e in ENTRIES}


def engine_for_verify(preferred: str, verify: str) -> str:
    """A named engine that runs `verify` rounds: `preferred` where it has that mode, else the reference path (the
    only engine with the naive mode). `auto` stays `auto` (it is decided against the target)."""
    if preferred == AUTO:
        return AUTO
    if preferred not in BY_NAME:
        raise ValueError(f"unknown engine {preferred!r}")
    return preferred if verify in BY_NAME[preferred].verify_modes else REFERENCE_ENGINE
