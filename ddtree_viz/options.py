"""The names and limits every layer above the engine shares, and the checks on them; torch-free.

One place for: the methods, verify modes, engine names (read from the engine registry), dtypes, the engine's
limits, the integer and settings checks, and the port helpers. The engine, the CLI, the page, the prompt-set
loop, the benchmarks and the trace reader import these names; none spells them again.
"""

from __future__ import annotations

import argparse
import dataclasses
import numbers
import re
import socket

from .registry import (AUTO, ENGINE_CHOICES, ENGINES, EXACT, NAIVE, REFERENCE_ENGINE, REFERENCE_NAMES,
                              VERIFY_MODES, engine_for_verify)
from .errors import InputError

__all__ = [
    "AUTO", "ENGINE_CHOICES", "ENGINES", "EXACT", "NAIVE", "REFERENCE_ENGINE", "REFERENCE_NAMES", "VERIFY_MODES",
    "engine_for_verify", "DDTREE", "DFLASH", "DFLASH2", "PRECISION_B", "METHODS", "CHAINS", "MARGINAL", "SELECTOR",
    "TREE_SCORINGS", "DRAFTER_FAMILIES", "VERIFY_LABELS", "DTYPES", "DEVICES", "REFERENCES", "MAX_BUDGET",
    "MAX_NEW_TOKENS", "MAX_TOP_K", "MAX_SEED", "TARGET_TOP_K", "DRAFT_TOP_K", "check_int", "whole",
    "number", "whole_number", "port_number", "EXPORT_FORMATS", "EXPORT_FIGURES", "SHOW_CHOICES",
    "SCHEME_NAMES", "COLOR_RANGES", "PHASES", "DEFAULT_DPI", "PAPER_WIDTHS_CM", "PAPER_WIDTHS", "length_inches",
    "paper_width", "check_port", "DecodeSettings",
]

# A round's method: DDTree's best-first tree, DFlash's top-1 chain, or DFlash2's chain (its candidate selector's
# greedy walk, or its sample at T > 0; a DFlash2 drafter only).
DDTREE, DFLASH, DFLASH2 = "ddtree", "dflash", "dflash2"
METHODS = (DDTREE, DFLASH, DFLASH2)
CHAINS = (DFLASH, DFLASH2)  # the methods whose tree is one chain of block_size - 1 drafts
# How DDTree scores a node: the sum along its path of the drafter's per-depth log-probs (marginal), or of the
# candidate selector's log_softmax over its K candidates of S_t(parent's token, b) (selector: a DFlash2 drafter only).
MARGINAL, SELECTOR = "marginal", "selector"
TREE_SCORINGS = (MARGINAL, SELECTOR)
DRAFTER_FAMILIES = ("dflash", "dflash2")  # the drafter families a trace may name
# a prompt set's second configuration in a precision audit (analyze --target-b / --draft-b / --dtype-b): its traces
# are NNNN.b.json, its figures summary["b"], the comparison summary["precision_audit"]
PRECISION_B = "b"
# The page's verify dropdown: label shown -> mode.
VERIFY_LABELS = {"exact": EXACT, "naive (known-wrong: flattened tree)": NAIVE}
DTYPES = ("float32", "bfloat16", "float16")
DEVICES = ("cpu", "cuda", "auto")  # auto: every visible GPU through accelerate's device_map
DRAFT_WEIGHTS = ("int4",)  # --draft-weights: a plain drafter's Linears quantized at load (models.quantize_drafter)
HEAD_WEIGHTS = ("int4", "fp8")  # --head-weights: the target's lm_head quantized at load (models.quantize_head)
REFERENCES = ("engine", "transformers")  # where a session's reference decodes (DecodeSession's `reference`)
RECORD_LEVELS = ("full", "light")  # what `run --record` keeps a round (light: DecodeSession(record=False))

# Exports (render/export.py) and the round's phases, named here so that parsing and the page import no renderer.
EXPORT_FORMATS = ("svg", "pdf", "png", "tikz", "html", "json")
EXPORT_FIGURES = ("tree", "mask", "acceptance", "grid")
SHOW_CHOICES = ("text", "ids", "both")  # token labels: text, ids, or both
SCHEME_NAMES = ("colorblind", "grayscale")
COLOR_RANGES = ("trace", "round")  # the log-prob colour scale over the whole trace or the round
PHASES = ("drafted", "verified")  # a round as the drafter built it, or with the accepted path and bonus
DEFAULT_DPI = 300
# A paper's widths for an exported figure (issue #65 item 4): one column of a two-column paper (ACL, ICML, IEEE:
# \columnwidth 3.25-3.5 in; 8.5 cm = 241 pt) and the full text width (6.75-7.2 in). The default is a column.
PAPER_WIDTHS_CM = {"column": 8.5, "full": 17.5}
PAPER_WIDTHS = tuple(PAPER_WIDTHS_CM)
FIGURE_INCHES = (0.5, 200.0)  # an exported figure's width or height, at least and at most
_UNITS = {"cm": 1 / 2.54, "mm": 0.1 / 2.54, "in": 1.0, "pt": 1 / 72.27}  # inches per unit (pt: TeX's, as \columnwidth)

MAX_BUDGET = 4096  # nodes of one tree (the root apart)
MAX_NEW_TOKENS = 8192
MAX_TOP_K = 256  # entries of a recorded top-k row
MAX_SEED = 2**32 - 1
TARGET_TOP_K = 5  # the target's top-k recorded at each tree position
DRAFT_TOP_K = 16  # cap on the drafter's candidates recorded per depth (the grid)


def whole(name: str, value) -> int:
    """`value` as an int, or an InputError that names the setting. A float with no fraction counts (gradio's Number
    gives floats); bools and other types do not."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise InputError(f"{name} must be a whole number, not {value!r}")
    return int(value)


def check_int(name: str, value, lo: int, hi: int) -> int:
    """`value` as an int in [lo, hi], or an InputError that names the setting (whole's types)."""
    value = whole(name, value)
    if not lo <= value <= hi:
        raise InputError(f"{name} must be between {lo} and {hi}, not {value}")
    return value


def number(text: str) -> float:
    """argparse type: a number (argparse's own error and exit status 2 otherwise)."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, not {text!r}") from None


def whole_number(text: str) -> int:
    """argparse type: a whole number (argparse's own error and exit status 2 otherwise)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, not {text!r}") from None


def length_inches(text: str, what: str = "a length") -> float:
    """'8.5cm', '85mm', '3.3in', '241pt' or a bare number (centimetres) -> inches; InputError naming the forms, and
    the limits (FIGURE_INCHES), otherwise."""
    m = re.fullmatch(r"\s*([-+.\de]+?)\s*(cm|mm|in|pt)?\s*", str(text).lower())
    try:
        inches = float(m[1]) * _UNITS[m[2] or "cm"] if m else None
    except ValueError:
        inches = None
    if inches is None:
        raise InputError(f"{what} must be a number of centimetres or a length such as 8.5cm, 85mm, 3.3in or 241pt, "
                         f"not {text!r}")
    lo, hi = FIGURE_INCHES
    if not lo <= inches <= hi:
        raise InputError(f"{what} must be from {lo:g} to {hi:g} in ({lo * 2.54:g} to {hi * 2.54:g} cm), not {text!r}")
    return inches


def paper_width(text: str) -> str | float:
    """--width: 'column', 'full' (PAPER_WIDTHS_CM) or a length (length_inches: a bare number is centimetres) ->
    the name, or inches; InputError naming every form otherwise."""
    name = str(text).strip().lower()
    if name in PAPER_WIDTHS_CM:
        return name
    try:
        return length_inches(text, "the width")
    except InputError as exc:
        raise InputError(f"{exc} (or column: {PAPER_WIDTHS_CM['column']:g} cm, full: {PAPER_WIDTHS_CM['full']:g} cm)") \
            from None


def port_number(text: str) -> int:
    """--port: a whole number from 1 to 65535 (argparse's own error and exit status 2 otherwise)."""
    port = whole_number(text)
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number from 1 to 65535, not {port}")
    return port


def check_port(host: str, port: int) -> None:
    """Refuse, before any model loads, a port the server could not listen on (in use, or not allowed)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise InputError(f"cannot listen on {host}:{port}: {getattr(exc, 'strerror', None) or exc}") from None
    family, kind, proto, _, address = infos[0]
    try:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server does: TIME_WAIT is no obstacle
            probe.bind(address)
    except OSError as exc:
        why = "it is in use (another server?)" if exc.errno == 98 else (exc.strerror or str(exc))
        raise InputError(f"cannot listen on {host}:{port}: {why}; pick another with --port") from None


@dataclasses.dataclass(frozen=True)
class DecodeSettings:
    """What a decoding session is asked for, as plain data: the one bundle the CLI, the page, the prompt-set loop
    and the benchmarks hand to `DecodeSession` (engine/session.py). Checked once, as it is made (the checks that
    need no model: ranges and names; a setting out of range is an InputError that names it), so a DecodeSettings
    is a valid one: nothing downstream checks it again; the block size against the drafter's is the session's.
    `block_size` None: the drafter's own. `engine`: a name from ENGINE_CHOICES. Sampling: T 0 is greedy (the
    sampler's own fields are checked by engine/sampling.py's Sampler)."""

    budget: int = 32
    max_new_tokens: int = 64
    block_size: int | None = None
    method: str = DDTREE
    verify: str = EXACT
    engine: str = AUTO
    reference: str = "engine"
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    tree_scoring: str = MARGINAL

    def __post_init__(self):
        set_ = object.__setattr__  # (frozen: the checked values, as ints, in place of those given)
        set_(self, "budget", check_int("budget", self.budget, 1, MAX_BUDGET))
        set_(self, "max_new_tokens", check_int("max new tokens", self.max_new_tokens, 1, MAX_NEW_TOKENS))
        if self.block_size is not None:
            set_(self, "block_size", whole("block size", self.block_size))
            if self.block_size < 2:
                raise InputError(f"block size must be at least 2 (the root + one drafted depth), not {self.block_size}")
        for name, value, allowed in (("method", self.method, METHODS), ("tree scoring", self.tree_scoring, TREE_SCORINGS),
                                     ("verify mode", self.verify, VERIFY_MODES),
                                     ("engine", self.engine, ENGINE_CHOICES), ("reference", self.reference, REFERENCES)):
            if value not in allowed:
                raise InputError(f"{name} must be one of {', '.join(allowed)}, not {value!r}")

    def replace(self, **changes) -> "DecodeSettings":
        return dataclasses.replace(self, **changes)
