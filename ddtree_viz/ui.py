"""What the web page shows, as plain functions over one browser tab's state. No gradio here, no maths.

`ModelHost` loads the models once (in the background, so the page can show progress) and serialises model
work; `TabState` is one browser tab's session and the round it looks at; `render_views` turns records into
everything the page shows. ddtree_viz/web.py (the page app.py serves) wires these to widgets.
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass

from .engine.cache import cache_layout
from .engine.models import ModelPair, load_pair
from .engine.prompts import PromptSpec, check_spec, has_chat_template, takes_thinking
from .engine.sampling import MAX_SEED, Sampler
from .engine.session import DecodeSession, _check_int
from .engine.engines import engine_for
from .errors import DDTreeVizError, InputError, ModelLoadError
from .render.cache_view import cache_figure, cache_layout_table, cache_table
from .render.diff_view import output_vs_greedy_html
from .render.divergence_view import divergence_html, divergence_rows
from .render.layout import PHASES, tree_layout
from .render.mask_plot import mask_figure
from .render.prompt_view import prompt_html
from .render.stats_view import acceptance_figure, stats_markdown, stats_summary
from .render.text import esc
from .render.tree_plot import tree_figure
from .trace import Trace, is_sampled, sampling_flags, sampling_label

VERIFY_CHOICES = {"exact": "exact", "naive (known-wrong: flattened tree)": "naive"}


class ModelHost:
    """Loads the target + drafter once, shared by every tab; one lock so model work never interleaves."""

    def __init__(self, target: str | None, draft: str | None, dtype: str, device: str, engine: str = "transformers"):
        self.args = (target, draft, dtype, device)
        self.engine = engine  # exact sessions run on it; naive sessions always on transformers' forward
        self.pair: ModelPair | None = None
        self.layout: list[dict] = []
        self.error: str | None = None
        self.stage = "waiting to load"
        self.started = time.monotonic()
        self.lock = threading.Lock()
        self._thread: threading.Thread | None = None

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
            pair = load_pair(target, draft, dtype=dtype, device=device)
            self.stage = "measuring the cache layout"
            self.layout = cache_layout_table(cache_layout(pair.target, pair.layer_types))
            self.pair = pair
            self.stage = "ready"
        except DDTreeVizError as exc:
            self.error, self.stage = str(exc), "failed"
        except Exception as exc:  # noqa: BLE001 - the page must say what happened and keep serving
            self.error, self.stage = f"{type(exc).__name__}: {exc}", "failed"

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
            return (f"**Model:** {esc(p.describe())} — {esc(p.parameters_line())}; {len(p.layer_types)} layers: {n_gdn} Gated DeltaNet, "
                    f"{len(p.layer_types) - n_gdn} attention; drafter block size {p.drafter.block_size}; "
                    f"exact rounds on the {esc(self.engine)} engine; {esc(self.chat_note())}")
        if self.error is not None:
            return f"**Model load failed:** {esc(self.error)}. The page still serves: you can replay a saved trace."
        return f"**Loading models…** {esc(self.stage)} ({time.monotonic() - self.started:.0f} s)"

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

    def require(self) -> ModelPair:
        if self.pair is None:
            raise ModelLoadError(self.error or "the models are still loading; try again in a moment")
        return self.pair


@dataclass
class Settings:
    prompt: PromptSpec  # the prompt box (the user's message with the chat template on), system prompt, thinking
    budget: int
    block_size: int
    max_new_tokens: int
    verify: str
    method: str
    sampler: Sampler


@dataclass
class TabState:
    """One browser tab: its live session (or a replayed trace) and the round it shows."""

    session: DecodeSession | None = None
    settings: Settings | None = None
    trace: Trace | None = None  # the records on screen (a live session's snapshot, or a replayed file)
    view: int = -1  # round index shown
    replay: bool = False
    greedy_s: float = 0.0


def prompt_spec(host: ModelHost, prompt, chat=False, system="", thinking=True) -> PromptSpec:
    """The page's prompt controls as a PromptSpec. With the chat template off the system box is not used; the
    thinking switch is passed only to a template that has one (else the template's default, None)."""
    if not isinstance(prompt, str):
        raise InputError("the prompt must be text")
    if not chat:
        return check_spec(PromptSpec(text=prompt))
    if host.pair is not None and not host.has_chat_template:
        raise InputError("this target's tokenizer has no chat template: switch 'Chat template' off")
    system = system if isinstance(system, str) and system.strip() else None
    return check_spec(PromptSpec(text=prompt, chat=True, system=system,
                                 thinking=bool(thinking) if host.takes_thinking else None))


def _settings(host, prompt, budget, block_size, max_new_tokens, verify, method, temperature=0.0, top_p=1.0, top_k=0,
              seed=0, chat=False, system="", thinking=True) -> Settings:
    if verify not in VERIFY_CHOICES:
        raise InputError(f"unknown verification mode {verify!r}")
    sampler = Sampler(temperature, _check_int("top-k", top_k, 0, 2**31 - 1), top_p, _check_int("seed", seed, 0, MAX_SEED))
    return Settings(prompt_spec(host, prompt, chat, system, thinking), budget, block_size, max_new_tokens,
                    VERIFY_CHOICES[verify], method, sampler)


def new_seed() -> int:
    """A fresh seed for the page's 'New seed' button."""
    return secrets.randbelow(MAX_SEED + 1)


def _ensure_session(host: ModelHost, tab: TabState, s: Settings) -> None:
    """Keep the tab's live session, or start a new one for a new prompt / changed settings / after a replay."""
    if tab.session is not None and not tab.replay and tab.settings == s:
        return
    pair = host.require()
    engine = engine_for(host.engine, s.verify)
    session = DecodeSession(pair, budget=s.budget, max_new_tokens=s.max_new_tokens, verify=s.verify,
                            method=s.method, block_size=s.block_size, engine=engine, sampler=s.sampler)
    session.prefill(spec=s.prompt)
    tab.session, tab.settings, tab.replay, tab.view = session, s, False, -1


def _refresh(tab: TabState) -> None:
    """Re-read the live session's records (greedy reference extended to the tokens generated so far)."""
    tab.trace = tab.session.to_trace()
    tab.greedy_s = tab.session.greedy_seconds


def step(host: ModelHost, tab: TabState, prompt, budget, block_size, max_new_tokens, verify, method, temperature=0.0,
         top_p=1.0, top_k=0, seed=0, chat=False, system="", thinking=True) -> TabState:
    """One round. A new prompt or changed settings (a new seed, the chat template, system prompt or thinking
    switch included) start a new session first."""
    s = _settings(host, prompt, budget, block_size, max_new_tokens, verify, method, temperature, top_p, top_k, seed,
                  chat, system, thinking)
    with host.lock:
        _ensure_session(host, tab, s)
        if tab.session.done:
            raise InputError("this session has finished (end of text or max new tokens): press Reset or change the prompt")
        tab.session.step()
        _refresh(tab)
    tab.view = len(tab.trace.steps) - 1
    return tab


def run_rounds(host: ModelHost, tab: TabState, prompt, budget, block_size, max_new_tokens, verify, method,
               temperature=0.0, top_p=1.0, top_k=0, seed=0, chat=False, system="", thinking=True):
    """Run to the end, yielding the tab after every round (the page updates live)."""
    s = _settings(host, prompt, budget, block_size, max_new_tokens, verify, method, temperature, top_p, top_k, seed,
                  chat, system, thinking)
    with host.lock:
        _ensure_session(host, tab, s)
    while not tab.session.done:
        with host.lock:
            tab.session.step()
            _refresh(tab)
        tab.view = len(tab.trace.steps) - 1
        yield tab


def reset(tab: TabState) -> TabState:
    return TabState()


def load_replay(tab: TabState, path: str) -> TabState:
    trace = Trace.load(path)
    return TabState(trace=trace, view=len(trace.steps) - 1, replay=True)


def move(tab: TabState, delta: int | None = None, to: int | None = None) -> TabState:
    if tab.trace is None or not tab.trace.steps:
        return tab
    last = len(tab.trace.steps) - 1
    tab.view = max(0, min(last, (tab.view + delta) if delta is not None else int(to)))
    return tab


# ------------------------------------------------------------------------------------------------------------
# Views
# ------------------------------------------------------------------------------------------------------------


@dataclass
class Views:
    status: str
    tree: object
    mask: object
    cache_rows: list[dict]
    cache_chart: object
    diff_html: str
    acceptance: object
    stats: str
    divergence: str
    rounds: int
    view: int
    prompt: str = ""  # the prompt as prefilled (templated, special tokens marked), escaped HTML


def _token_text(tab: TabState):
    if tab.session is not None and not tab.replay:
        return tab.session.token_text
    texts = tab.trace.token_texts if tab.trace is not None else {}
    return lambda i: texts.get(str(i), f"⟨{i}⟩")


def render_views(host: ModelHost, tab: TabState, phase: str = "verified") -> Views:
    if tab.trace is None or not tab.trace.steps:
        status = "Type a prompt and press **Step** (one round) or **Run** (to the end). Keys: s = step, ← / → = back / forward."
        return Views(status, None, None, host.layout, None, "", None, "", "", 0, 0)
    trace, k = tab.trace, max(0, min(tab.view, len(tab.trace.steps) - 1))
    step = trace.steps[k]
    text = _token_text(tab)
    layout = tree_layout(step, phase=phase, token_text=text)
    lo = min(n.logprob for s in trace.steps for n in s.nodes[1:]) if any(len(s.nodes) > 1 for s in trace.steps) else -1.0
    tree = tree_figure(layout, phase=phase, token_text=text, cmin=lo, cmax=0.0)
    greedy_tok_s = ddtree_tok_s = None
    if tab.session is not None and not tab.replay and tab.greedy_s > 0:
        greedy_tok_s = len(trace.greedy_ids or ()) / tab.greedy_s
        round_s = sum(sum(s.timings_ms.values()) for s in trace.steps) / 1e3 + trace.prefill_ms / 1e3
        ddtree_tok_s = len(trace.output_ids) / round_s if round_s > 0 else None
    summary = stats_summary(trace, greedy_tok_s=greedy_tok_s, ddtree_tok_s=ddtree_tok_s)
    mode = "replay of a saved trace (no model)" if tab.replay else "live"
    naive = " — **naive verification: the known-wrong flattened-tree behaviour**" if step.verify == "naive" else ""
    status = (f"Round {k + 1} of {len(trace.steps)} ({mode}){naive}: accepted {step.acceptance - 1} drafted tokens "
              f"+ bonus, {len(step.nodes)} tree positions, committed length {step.committed_len}.")
    if is_sampled(trace.settings):
        status += (f" Target's choice: {esc(sampling_label(trace.settings))}, noise "
                   f"{esc(trace.settings.get('noise'))} (reproduce: `run {esc(sampling_flags(trace.settings))}`).")
    if tab.session is not None and not tab.replay and tab.session.done:
        status += " Finished."
    return Views(
        status=status, tree=tree, mask=mask_figure(step), cache_rows=cache_table(step), cache_chart=cache_figure(step),
        diff_html=output_vs_greedy_html(trace, text, upto_step=k), acceptance=acceptance_figure(trace.steps[: k + 1]),
        stats=stats_markdown(summary), divergence=divergence_html(divergence_rows(trace.steps[: k + 1], text)),
        rounds=len(trace.steps), view=k, prompt=prompt_html(trace),
    )
