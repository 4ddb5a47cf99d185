"""The models behind the page: loaded once (in the background, so the page can show progress) and shared by every
tab, with one fair lock so that model work never interleaves and tabs take turns round by round."""

from __future__ import annotations

import gc
import os
import threading
import shlex
import time

from ..engine.cache import cache_layout
from ..engine.engines import default_engine, engine_for, warm_runner
from ..engine.models import ModelPair, embedded_draft, load_pair
from ..engine.prompts import has_chat_template, takes_thinking
from ..engine.session import warm_rounds
from ..errors import DDTreeVizError, InputError, ModelLoadError
from ..options import AUTO, DTYPES, DecodeSettings
from ..render.cache_view import cache_layout_table, cache_table_html
from ..render.text import esc
from ..words import plural


MAX_PAGE_PROMPT_CHARS = 1 << 20  # a prompt typed, sent or uploaded to the page (and each of a set's)


def cpu_threads(device: str = "cpu", cores: int | None = None) -> int:
    """Torch threads for the page's model work: one core less than this process may use (at least one), leaving a
    core to the server and the browser. On the CPU, two threads against a busy browser spin-wait in every
    operation's barrier: on a 2-core machine a DDTree round went from ~25 ms to ~450 ms while the page drew
    (docs/lab/NOTEBOOK.md section 8). On a GPU the host needs one thread."""
    if device != "cpu":
        return 1
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores - 1)


class FairLock:
    """A lock granted in the order it was asked for. The model is shared by every tab: a Run releases it between
    rounds, and a Step another tab asked for meanwhile goes next (threading.Lock lets the Run take it straight back)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._next = 0  # the next ticket to hand out
        self._serving = 0  # the ticket that holds the lock

    def __enter__(self) -> "FairLock":
        with self._cond:
            ticket = self._next
            self._next += 1
            while ticket != self._serving:
                self._cond.wait()
        return self

    def __exit__(self, *exc) -> None:
        with self._cond:
            self._serving += 1
            self._cond.notify_all()


class ModelHost:
    """Loads the target + drafter once, shared by every tab; one fair lock so model work never interleaves and tabs
    take turns round by round."""

    def __init__(self, target: str | None, draft: str | None, dtype: str, device: str, engine: str = AUTO,
                 draft_weights: str | None = None, head_weights: str | None = None):
        self.args = (target, draft, dtype, device)
        # --draft-weights / --head-weights: the drafter's Linears, the target's lm_head quantized at load (every pair)
        self.quantized = {"draft_weights": draft_weights, "head_weights": head_weights}
        # exact sessions run on it ("auto": engines.default_engine, the fastest exact engine for the target);
        # naive sessions always on transformers' forward
        self.engine = engine
        self.pair: ModelPair | None = None
        self.layout: list[dict] = []
        self.error: str | None = None
        self.stage = "waiting to load"
        self.started = time.monotonic()
        self.lock = FairLock()
        self.replay_only = False  # `replay FILE` / app.py --replay without --target: no model, by design
        self._thread: threading.Thread | None = None
        self._pairs: dict[str, ModelPair] = {}  # compare mode: the pair in another dtype, loaded on first use
        self._loading = threading.Lock()  # (pair_for loads outside the model lock: one load of each at a time)
        self._layout_html: str | None = None
        self.warmup_s = 0.0  # the static runner's compile and a first round at load (warm_runner, warm_rounds; CUDA)
        self._exact: tuple[ModelPair, str] | None = None  # exact_engine's answer for the pair it was asked for
        # the last pace measured on this machine by a check of each reference kind ("runner", "transformers"):
        # progress.Pace, what a check's estimate starts from before its own reference has one
        self.paces: dict = {}

    def start(self, background: bool = True) -> None:
        if background:
            self._thread = threading.Thread(target=self._load, name="model-loader", daemon=True)
            self._thread.start()
        else:
            self._load()

    def _load(self) -> None:
        target, draft, dtype, device = self.args
        self.stage = f"loading target {target or 'embedded default'} and its drafter ({dtype}, {device})"
        try:
            pair = load_pair(target, draft, dtype=dtype, device=device, **self.quantized)
            self.stage = "measuring the cache layout"
            self.layout = cache_layout_table(cache_layout(pair.target, pair.layer_types))
            if self.engine in (AUTO, "runner") and engine_for(self.engine, "exact", pair.target) == "runner":
                # the runner compiles its fused pieces once per process (CUDA): here, not in the first Step
                self.stage = ("compiling the static runner's fused kernels (once per process: ~35 s on a fresh "
                              "machine, seconds with a warm cache)")
                self.warmup_s = self.warm(pair)
            settle_heap()
            self.pair = pair
            self.stage = "ready"
        except DDTreeVizError as exc:
            self.error, self.stage = str(exc), "failed"
        except Exception as exc:  # noqa: BLE001 - the page must say what happened and keep serving
            self.error, self.stage = f"{type(exc).__name__}: {exc}", "failed"

    def warm(self, pair: ModelPair, budget: int = DecodeSettings.budget) -> float:
        """What a process compiles once, paid at load and not in a user's first Step (CUDA; 0.0 where nothing
        compiles): the runner's fused pieces (warm_runner), then a first round at the page's default settings
        (warm_rounds: the tree size's Triton kernels, the drafter's shapes; `budget`: the Step tab's default). Returns
        the seconds it took."""
        seconds = warm_runner(pair.target)
        if seconds:
            self.stage = ("running a first round at the page's default settings (kernels of its tree size compiled "
                          "once per process)")
            seconds += warm_rounds(pair, DecodeSettings(budget=budget, engine="runner"))
        return seconds

    def wait(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def ready(self) -> bool:
        return self.pair is not None

    def status_markdown(self) -> str:
        if self.pair is not None:
            p = self.pair
            n_gdn = sum(t == "linear_attention" for t in p.layer_types)
            return (f"**Model:** {esc(p.describe())} — {esc(p.parameters_line())}; {plural(len(p.layer_types), 'layer')}: {n_gdn} Gated DeltaNet, "
                    f"{len(p.layer_types) - n_gdn} attention; drafter block size {p.drafter.block_size}; "
                    f"exact rounds on the {esc(self.exact_engine)} engine{self._engine_why()}; naive rounds on "
                    f"transformers; {plural(_threads(), 'torch thread')}"
                    + (f"; the runner's kernels compiled and a first round run at load in {self.warmup_s:.1f} s"
                       if self.warmup_s else "")
                    + f"; {esc(self.chat_note())}")
        if self.replay_only:
            return ("**Replay mode (no model):** step through the saved trace with Back / Forward and the round slider, "
                    "or load another; Step and Run need a model (start the app without --replay, or with --target).")
        if self.error is not None:
            return f"**Model load failed:** {esc(self.error)}. The page still serves: you can replay a saved trace."
        return f"**Loading models…** {esc(self.stage)} ({time.monotonic() - self.started:.0f} s)"

    def costs(self, block_size: int):
        """This machine's cost table for the loaded pair on the exact engine at `block_size` (speedup.py's cache,
        filled by `bench --costs` or `analyze`), or None: the budget panel's speed-up axis."""
        if self.pair is None:
            return None
        from ..engine.costs import pair_key
        from ..speedup import cached_costs

        return cached_costs(pair_key(self.pair, self.exact_engine, block_size))

    def costs_command(self, block_size: int, budget: int | None = None) -> str:
        """The command that measures this machine's cost table for the loaded pair at `block_size` (what costs()
        reads), at powers of two up to `budget` and `budget` itself: what the speed-up panel says where no table is
        measured yet (issue #65 item 6). On a CPU the table's key names the torch threads (engine/costs.py:
        device_name), so the command runs with this process's count: `bench` on its own takes every core, and its
        table would never be the one the page looks up."""
        target, draft, dtype, device = self.args
        models = "".join(f" --{flag} {shlex.quote(str(value))}" for flag, value in (("target", target), ("draft", draft))
                         if value is not None)
        from ..engine.costs import on_threads

        threads = f"OMP_NUM_THREADS={_threads()} " if self.pair is not None and on_threads(self.pair) else ""
        return (f"{threads}python -m ddtree_viz bench --costs{models} --dtype {dtype} --device {device} --engine "
                f"{self.exact_engine} --block-size {block_size}" + (f" --budget {budget}" if budget else ""))

    @property
    def exact_engine(self) -> str:
        """The engine exact rounds run on (the named one, or auto's choice for the loaded target, found once per
        pair: the choice walks the target's modules, ~1,000 at 64 layers, and every Step's views ask for it)."""
        if self.engine != AUTO or self.pair is None:
            return self.engine
        if self._exact is None or self._exact[0] is not self.pair:
            self._exact = (self.pair, default_engine(self.pair.target))
        return self._exact[1]

    def _engine_why(self) -> str:
        if self.engine != AUTO:
            return " (chosen with --engine)"
        return " (auto: the fastest exact engine for this target)"

    @property
    def has_chat_template(self) -> bool:
        return self.pair is not None and has_chat_template(self.pair.tokenizer)

    @property
    def takes_thinking(self) -> bool:
        return self.pair is not None and takes_thinking(self.pair.tokenizer)

    def chat_note(self) -> str:
        """What the page says about the tokenizer's chat template (the 'Chat template' switch follows it)."""
        if self.pair is None:
            return ""
        if not self.has_chat_template:
            return ("its tokenizer has no chat template: prompts go in as raw text (the embedded pair has none; a "
                    "target that ships one, e.g. Qwen3.6-27B, switches 'Chat template' on)")
        return "chat template: yes" + (", with a thinking switch" if self.takes_thinking else ", no thinking switch")

    def max_prompt_chars(self) -> int | None:
        """The most characters a prompt on the page may have: more cannot fit the target's positions (no token
        spells more characters than the vocabulary's longest entry), and at most MAX_PAGE_PROMPT_CHARS. Checked
        before the model lock, so a huge prompt is refused at once, not tokenized while other tabs wait. None
        before the models load."""
        if self.pair is None:
            return None
        from ..engine.prompts import max_prompt_chars

        return min(max_prompt_chars(self.pair) or MAX_PAGE_PROMPT_CHARS, MAX_PAGE_PROMPT_CHARS)

    def layout_html(self) -> str:
        """The per-layer cache layout measured at load (before the first step), as the page's compact table."""
        if self.layout and self._layout_html is None:
            self._layout_html = cache_table_html(self.layout)
        return self._layout_html or ""

    def require(self) -> ModelPair:
        if self.pair is None:
            if self.replay_only:
                raise ModelLoadError("replay mode (no model): Step and Run need a model; replay a trace instead, or "
                                     "start the app without --replay")
            raise ModelLoadError(self.error or "the models are still loading; try again in a moment")
        return self.pair

    def pair_for(self, dtype: str | None, drafter: str | None = None) -> ModelPair:
        """The loaded pair (dtype and drafter None: the host's), or (compare mode) the same models in another dtype,
        or the embedded target with its drafter of another family (`drafter`: 'dflash' or 'dflash2', the names
        `--draft` takes beside the embedded target), loaded once on first use (before the model lock is taken:
        actions._load; other tabs' work goes on meanwhile)."""
        pair = self.require()
        target, own_draft, own_dtype, device = self.args
        dtype = own_dtype if dtype in (None, "") else dtype
        if drafter is not None and target is not None:
            raise InputError("B's drafter: the embedded drafters go with the embedded target only (this page runs "
                             f"{pair.target_name}); start another app with --draft for another drafter")
        draft = own_draft if drafter is None else drafter
        if dtype == own_dtype and embedded_draft(draft) == embedded_draft(own_draft):  # the same drafter by any name
            return pair
        if dtype not in DTYPES:
            raise InputError(f"dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
        key = f"{dtype}/{draft}"
        with self._loading:
            if key not in self._pairs:
                self._pairs[key] = load_pair(target, draft, dtype=dtype, device=device,
                                             **self.quantized)
                settle_heap()
            return self._pairs[key]


def settle_heap() -> None:
    """Everything loaded so far (the models' modules, torch's and transformers' own objects: ~390,000 on the page's
    64-layer bench target) put out of the garbage collector's reach (gc.freeze). Otherwise a full collection scans
    them all in the middle of some Step: 218 ms once in 40 Steps of that target on the development machine, none
    after (docs/lab/NOTEBOOK.md section 8)."""
    gc.collect()
    gc.freeze()


def _threads() -> int:
    import torch

    return torch.get_num_threads()
