"""DecodeSession: prefill a prompt, then one DDTree (or DFlash chain) round per step(), each yielding a StepRecord.

The session holds a prompt's state and puts its parts together, each behind its own interface:

    round.py       play_round: one round, plainly (draft, tree, verify, walk, commit, record)
    scheduler.py   Scheduler: where the tree is built and what of the next round is queued ahead (one typed plan)
    proposers.py   Proposer: who drafts (DFlashProposer, DFlash2Proposer; oracle.OracleProposer)
    shapes.py      Shape: what a round verifies (DDTree's tree by either scoring, DFlash's chain, DFlash2's chain)
    engines.py     TargetEngine: the target's state and passes, with its declared capabilities
    recorder.py    Recorder: what a round keeps (PageRecorder: what the page shows), and the token texts
    check.py       ReferenceCheck: the output against the target's own decoding, and the verdict

A session is made from typed options, each checked once where it enters: options.DecodeSettings (what to decode:
plain data the CLI, the page and the benchmarks share), SessionParts (objects the caller made), recorder.Recording
(what each round keeps) and scheduler.Overlap (what the caller asks of the overlaps). `DecodeSession.of` takes the
same options by name.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import InputError
from ..words import plural
from ..options import DecodeSettings, check_int
from ..trace import StepRecord, Trace
from .check import TRANSFORMERS_REFERENCE, DivergenceCheck, ReferenceCheck
from .engines import TargetEngine, capabilities_of, make_engine
from .models import ModelPair
from .prompts import PromptSpec, check_prompt_text, encode
from .proposers import Proposer, make_proposer
from .recorder import Recording, TokenNames, recorder_for
from .reference import GreedyReference, GreedyResult
from .round import play_round
from .sampling import Sampler
from .scheduler import Facts, Overlap, Scheduler, plan
from .shapes import check_shape, shape_for
from .timing import Timing, single_cuda_device
from .verify import device_sync, input_device


@dataclass(frozen=True)
class SessionParts:
    """What only the caller has, checked here as it enters (None: the session makes it from its settings):
    `proposer` (proposers.Proposer; default the pair's drafter's, make_proposer), `engine` (a TargetEngine made by
    the caller: a page reuses its engines from prompt to prompt; default made by name, engines.make_engine),
    `reference_engine` (the engine an engine reference decodes on), `sampler` (default the settings' temperature,
    top-k, top-p and seed), `reference_gdn` (the transformers engine verifies with the reference GDN)."""

    proposer: Proposer | None = None
    engine: TargetEngine | None = None
    reference_engine: TargetEngine | None = None
    sampler: Sampler | None = None
    reference_gdn: bool = False

    def __post_init__(self):
        if self.sampler is not None and not isinstance(self.sampler, Sampler):
            raise InputError(f"sampler must be a Sampler, not {type(self.sampler).__name__}")
        if self.proposer is not None and not isinstance(self.proposer, Proposer):
            raise TypeError(f"{type(self.proposer).__name__} is no proposer: a proposer is a proposers.Proposer "
                            "(what it drafts and what it declares)")
        for engine in (self.engine, self.reference_engine):
            if engine is not None:
                capabilities_of(engine)


# DecodeSession.of: each option's group, by its name (DecodeSettings' fields are the settings')
GROUPS = (SessionParts, Recording, Overlap)


class DecodeSession:
    """Rounds of DDTree (or the DFlash chain) on one prompt through a target engine (engines.py).

    `settings` (options.DecodeSettings): budget, max new tokens, block size (None: the drafter's), method, verify
    mode, engine ("auto": engines.default_engine, the fastest exact engine that applies; or a name), reference
    ("engine": on a second engine of the session's kind; "transformers": transformers' own forward, the
    independent check, docs/EXACTNESS.md "The reference"), the sampler's temperature, top-k, top-p and seed, and the
    tree scoring (marginal, or a DFlash2 drafter's selector). `parts`, `recording`, `overlap`: module docstring.
    The reference (`greedy()`) decodes with the session's sampler, so the two match token for token."""

    def __init__(self, pair: ModelPair, settings: DecodeSettings = DecodeSettings(), *,
                 parts: SessionParts = SessionParts(), recording: Recording = Recording(),
                 overlap: Overlap = Overlap()):
        self.pair, self.target, self.tokenizer = pair, pair.target, pair.tokenizer
        self.proposer = proposer = parts.proposer if parts.proposer is not None else _pair_proposer(pair)
        s = self.decode_settings = settings
        self.budget, self.max_new_tokens = s.budget, s.max_new_tokens
        self.verify, self.method, self.tree_scoring = s.verify, s.method, s.tree_scoring
        self.shape = shape_for(s.method, s.tree_scoring)
        check_shape(self.shape, proposer)
        self.sampler = parts.sampler if parts.sampler is not None else Sampler(s.temperature, s.top_k, s.top_p, s.seed)
        block = proposer.block_size if s.block_size is None else s.block_size
        self.block_size = check_int("block size", block, 2, proposer.block_size)
        self.reference_gdn = parts.reference_gdn
        self.tree_size = self.shape.size(self.budget, self.block_size)  # positions of a round's pass, at most
        self.target_engine = parts.engine if parts.engine is not None else make_engine(
            s.engine, self.target, proposer.feature_layer_ids, verify=s.verify, reference_gdn=parts.reference_gdn,
            tree_size=self.tree_size, block_size=self.block_size, max_new_tokens=self.max_new_tokens)
        self.engine = self.target_engine.name
        # what the reference runs on: a second engine of this kind, or transformers' own forward
        self.reference = (self.engine if s.reference == "engine" and self.engine != TRANSFORMERS_REFERENCE
                          else TRANSFORMERS_REFERENCE)
        self.eos_ids = pair.eos_token_ids
        self._assemble(recording, overlap, parts.reference_engine)
        self.reset()

    def _assemble(self, recording: Recording, overlap: Overlap, reference_engine: TargetEngine | None) -> None:
        """The session's rooms: its timing, token names, recorder, reference check and scheduler."""
        models = (self.target, self.proposer.drafter)
        cuda = single_cuda_device(*models)  # one GPU: phases timed with CUDA events; else the wall clock after a wait
        on = recording.record if recording.time_phases is None else recording.time_phases
        self.timing = Timing(on, device_sync(*models), cuda)
        self.names = TokenNames(self.tokenizer)
        self.recorder = recorder_for(recording, self.sampler, self.shape, cuda, self.names)
        self.check = ReferenceCheck(reference_engine)
        refusal = ("tree_on_device builds DDTree's marginal tree for the runner engine only, not method "
                   f"{self.method!r} with {self.tree_scoring!r} scoring on the {self.engine} engine")
        facts = Facts(self.shape, capabilities_of(self.target_engine), self.proposer.drafter is not None and cuda is not None,
                      cuda is not None, recording.record, refusal)
        self.scheduler = Scheduler(self.target_engine, self.proposer, self.shape, plan(overlap, facts), self.timing,
                                   tree_size=self.tree_size, budget=self.budget, target_device=input_device(self.target))

    @classmethod
    def of(cls, pair: ModelPair, settings: DecodeSettings | None = None, **options) -> "DecodeSession":
        """A session from `settings` (default DecodeSettings()) and options by name, each sorted to its group: a
        DecodeSettings field replaces the settings' own (`engine` as a name; an engine object goes to SessionParts),
        SessionParts', Recording's and Overlap's fields to theirs (a TypeError for a name none has). The tests' and
        scripts' spelling; the CLI, the page and the prompt-set loop hand over whole option objects."""
        engine = options.pop("engine", None)  # a name (the settings'), or an engine object (the parts')
        groups = (DecodeSettings, *GROUPS)
        given = [{k: options.pop(k) for k in list(options) if k in {f.name for f in dataclasses.fields(g)}}
                 for g in groups]
        if options:
            raise TypeError(f"DecodeSession.of: no option named {', '.join(sorted(options))}")
        if engine is not None:
            given[0 if isinstance(engine, str) else 1]["engine"] = engine
        settings = settings or DecodeSettings()
        if given[0]:
            settings = settings.replace(**given[0])
        parts, recording, overlap = (g(**kw) for g, kw in zip(GROUPS, given[1:]))
        return cls(pair, settings, parts=parts, recording=recording, overlap=overlap)

    # -- state ---------------------------------------------------------------------------------------------

    def reset(self) -> None:
        self.prompt: str = ""
        self.prompt_ids: list[int] = []
        self.prompt_spec: PromptSpec | None = None  # how the prompt was given (chat template, thinking), if known
        self.generated: list[int] = []
        self.history: list[StepRecord] = []
        self.started = False
        self.committed_len = 0
        self.done = False
        self.features: torch.Tensor | None = None  # the drafter's next context: the accepted positions' features
        self.scheduler.reset()
        self.check.reset()
        self.names.reset()
        self.prefill_cache: tuple = ()
        self.prefill_ms = 0.0
        self.nonfinite_round: int | None = None  # the first round whose verify logits held NaN or inf

    @property
    def record(self) -> bool:
        """Whether each round keeps what the page shows (recorder.PageRecorder), or only what decoding needs."""
        return self.recorder.full

    @record.setter
    def record(self, full: bool) -> None:
        self.recorder = self.recorder.switched(bool(full))

    @property
    def time_phases(self) -> bool:
        """Whether each round's phases are timed (timing.PhaseClock); without, a round waits only for its walk."""
        return self.timing.on

    @time_phases.setter
    def time_phases(self, on: bool) -> None:
        self.timing.on = bool(on)

    @property
    def cache(self):
        """The engine's committed state: transformers' DynamicCache, or the static runner."""
        return self.target_engine.cache

    @property
    def settings(self) -> dict:
        """The session's settings as its trace records them."""
        family = self.proposer.family
        return dict(
            budget=self.budget, block_size=self.block_size, verify=self.verify, dtype=str(self.pair.dtype).removeprefix("torch."),
            max_new_tokens=self.max_new_tokens, method=self.method, device=self.pair.device, engine=self.engine,
            reference=self.reference, target_precision=self.pair.target_precision,
            draft_precision=self.pair.draft_precision, **self.sampler.settings, tree_scoring=self.tree_scoring,
            **({"drafter_family": family} if family is not None else {}),
        )

    def token_text(self, token_id: int) -> str:
        """One token's text (decoded once per id)."""
        return self.names.text(token_id)

    @property
    def output_text(self) -> str:
        return self.tokenizer.decode(self.generated, clean_up_tokenization_spaces=False)

    # -- prefill and rounds ------------------------------------------------------------------------------------

    @torch.no_grad()
    def prefill(self, prompt: str | None = None, prompt_ids: list[int] | None = None, *,
                spec: PromptSpec | None = None) -> int:
        """Run the prompt through the target; its choice (argmax or sample) becomes the first generated token
        (the first root). `spec` (prompts.py): the prompt as text or messages, through the chat template or not;
        it is encoded here and recorded in the trace."""
        if spec is not None:
            encoded = encode(self.tokenizer, spec)
            prompt, prompt_ids = encoded.text, list(encoded.ids)
        prompt_ids = self._prompt_ids(prompt, prompt_ids)
        self.reset()
        self.prompt = prompt if prompt is not None else self.tokenizer.decode(prompt_ids)
        self.prompt_spec = spec
        self.prompt_ids = [int(t) for t in prompt_ids]
        self.proposer.reset()  # and its state sized once for this prompt (a static drafter's)
        self.proposer.reserve(len(self.prompt_ids) + self.max_new_tokens + 2 * self.block_size)
        start = time.perf_counter()
        logits, self.features = self.target_engine.prefill(self.prompt_ids)
        self.timing.sync()
        self.prefill_ms = (time.perf_counter() - start) * 1e3
        self.started = True
        self.prefill_cache = self.target_engine.snapshot()
        self.committed_len = len(self.prompt_ids)
        first = int(self.sampler.choose(logits[None], [self.committed_len])[0])
        self.generated = [first]
        self.check.start(self, self.target_engine, logits)  # an engine reference starts from this state
        self.done = first in self.eos_ids or self.max_new_tokens <= 1
        return first

    def _prompt_ids(self, prompt: str | None, prompt_ids: list[int] | None) -> list[int]:
        """The prompt's ids (the text encoded), checked: not empty, and room for it in the target's positions
        beside the new tokens and a round's tree (a setting too large for any prompt named as such)."""
        if prompt_ids is None:
            if not isinstance(prompt, str) or prompt == "":
                raise InputError("the prompt is empty: type some text to continue")
            check_prompt_text(prompt)
            prompt_ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        if len(prompt_ids) == 0:
            raise InputError("the prompt encodes to no tokens")
        positions = self.pair.max_positions
        room = positions - self.budget - self.block_size  # positions a round's tree may need past the output
        limit = room - self.max_new_tokens
        if limit < 1:  # no prompt can fit: say which setting is too large, not that the prompt is too long
            if room - 1 < 1:
                raise InputError(f"budget {self.budget} and block size {self.block_size} leave no room in the target's "
                                 f"{plural(positions, 'position')}: lower the budget")
            raise InputError(f"max new tokens {self.max_new_tokens} is too many for this target: it has "
                             f"{plural(positions, 'position')}, and with budget {self.budget} and block size "
                             f"{self.block_size} at most {plural(room - 1, 'new token')} "
                             f"{'fits' if room - 1 == 1 else 'fit'} (after a one-token prompt)")
        if len(prompt_ids) > limit:
            raise InputError(
                f"the prompt is {plural(len(prompt_ids), 'token')}; with max new tokens {self.max_new_tokens} and "
                f"budget {self.budget} it must be at most {plural(max(limit, 0), 'token')} (the target has "
                f"{plural(positions, 'position')})")
        return prompt_ids

    def step(self) -> StepRecord:
        """One round (round.play_round): draft, tree, verify, walk and commit, then its record. Where the scheduler
        queues the next round's work, it goes in as soon as this round's tokens are known (scheduler.py)."""
        if not self.started:
            raise InputError("nothing to step: prefill a prompt first")
        if self.done:
            raise InputError("this session has finished (end of text or max new tokens); reset to start again")
        return play_round(self)

    def extend(self, tokens: list[int]) -> list[int]:
        """Append a round's tokens to the output, stopping at end of text or max new tokens."""
        added = []
        for token in tokens:
            if len(self.generated) >= self.max_new_tokens:
                break
            self.generated.append(int(token))
            added.append(int(token))
            if token in self.eos_ids:
                break
        if len(self.generated) >= self.max_new_tokens or (self.generated and self.generated[-1] in self.eos_ids):
            self.done = True
        return added

    def run(self, max_steps: int | None = None) -> list[StepRecord]:
        records = []
        while not self.done and (max_steps is None or len(records) < max_steps):
            records.append(self.step())
        return records

    @property
    def mean_acceptance(self) -> float:
        return float(np.mean([r.kept for r in self.history])) if self.history else 0.0

    # -- the reference (check.ReferenceCheck) ---------------------------------------------------------------------

    @property
    def reference_engine(self) -> TargetEngine | None:
        """The engine the reference decodes on (None: transformers' own forward)."""
        return self.check.engine if self.reference != TRANSFORMERS_REFERENCE else None

    def greedy(self, upto: int | None = None, most: int | None = None) -> GreedyResult:
        """The reference: the target's own tokens for this prompt, greedy or sampled with this session's sampler
        (same seed, same position-keyed noise): the first `upto` (default: all max_new_tokens); `most`: at most this
        many more decoded by this call."""
        return self.check.greedy(self, upto, most)

    def check_reference(self, independent: bool = False) -> GreedyReference | None:
        """The reference a check extends, as far as it has gone (None: not made yet): the session's (greedy()), or
        with `independent` transformers' own forward (check_transformers())."""
        return self.check.current(self, independent)

    def reference_target(self) -> int:
        """How far divergence_check extends the reference (check.ReferenceCheck.target)."""
        return self.check.target(self)

    @property
    def reference_shares_prefill(self) -> bool:
        return self.check.shares_prefill

    @property
    def greedy_seconds(self) -> float:
        return self.check.seconds

    def check_transformers(self, upto: int | None = None, most: int | None = None) -> tuple[GreedyResult, float]:
        """The independent check on transformers' own forward: its tokens, and the seconds it has spent."""
        return self.check.transformers(self, upto, most)

    def divergence(self) -> tuple[int | None, float | None]:
        """(index of the first generated token that differs from the reference, the reference's decision margin
        there). While running, only the tokens generated so far are compared."""
        check = self.divergence_check()
        return check.index, check.margin

    def divergence_check(self, extend: bool = True) -> DivergenceCheck:
        """The first divergence from the reference and the verdict on it (check.ReferenceCheck.divergence)."""
        return self.check.divergence(self, extend)

    def to_trace(self, with_greedy: bool = True, extend: bool = True) -> Trace:
        """The session as a Trace. extend=False: the reference only as far as it has decoded (a page shows the
        round at once and checks it next; reference_pending says the comparison is not complete yet)."""
        greedy_ids, div, margin, check = None, None, None, None
        if with_greedy and self.started:
            check = self.divergence_check(extend)
            greedy_ids, div, margin = check.result.ids, check.index, check.margin
        extra = {} if check is None else dict(
            numerical_noise=check.noise, noise_positions=check.noise_positions, tree_drift=check.drift,
            drift_positions=check.drift_positions, divergence_verdict=check.verdict, reference_pending=check.pending,
            reference_ms=self.greedy_seconds * 1e3, invalid=check.invalid)
        return Trace(
            target=self.pair.target_name, draft=self.pair.draft_name, prompt=self.prompt, prompt_ids=tuple(self.prompt_ids),
            output_ids=tuple(self.generated), greedy_ids=greedy_ids, first_divergence=div, settings=self.settings,
            steps=tuple(self.history), divergence_margin=margin, output_text=self.output_text,
            token_texts=self.names.texts(self.prompt_ids, self.generated, greedy_ids), prefill_ms=self.prefill_ms,
            prefill_cache=self.prefill_cache, **extra, **self._prompt_fields(),
        )

    def _prompt_fields(self) -> dict:
        """The trace's record of how the prompt was given: the raw messages (system prompt first), the chat
        template switch and the thinking flag (None: the template's default, or no chat template)."""
        spec = self.prompt_spec
        if spec is None or not spec.chat:
            return {}
        return dict(messages=tuple(spec.conversation()), chat_template=True, thinking=spec.thinking)


def _pair_proposer(pair: ModelPair) -> Proposer:
    """The pair's drafter's proposer (InputError where the pair has none)."""
    if pair.drafter is None:
        raise InputError("no drafter loaded")
    return make_proposer(pair.drafter, pair.target)


WARM_PROMPT = "def add(a, b):\n    return a + b\n\nprint(add(2, 3))"


def warm_rounds(pair: ModelPair, settings: DecodeSettings, rounds: int = 2) -> float:
    """A short session of `settings` run and dropped (its prefill, `rounds` rounds and their check against the
    reference), so that what a process makes at its first round of a tree size is made now: the Triton kernels of
    the tree rule and the tree at budget + 1 positions, the drafter's compiled pieces and graphs' shapes, the GEMM
    libraries' choices at these row counts. The page calls it at load (page/host.py) with its default settings, so a
    user's first Step costs a round and the graphs' capture, not the compiler. Returns the seconds it took."""
    start = time.perf_counter()
    block = settings.block_size or pair.drafter.block_size
    session = DecodeSession(pair, settings.replace(max_new_tokens=max(settings.max_new_tokens, (rounds + 1) * block)))
    session.prefill(prompt=WARM_PROMPT)
    for _ in range(rounds):
        if session.done:
            break
        session.step()
    session.divergence_check()
    return time.perf_counter() - start
