"""What a round keeps: its StepRecord, and the token texts a trace names.

Two recorders behind one interface (`Recorder`), chosen by `Recording.record`:

    Recorder      what decoding needs: the tree's shape, the walk, the target's choices and whether its logits were
                  finite (a benchmark of the method itself: `record=False`, `run --record light`)
    PageRecorder  and what the page shows: node texts, the target's margins and top tokens at every tree position,
                  the drafter's grid and its rank of the bonus, the caches before and after the commit, the budget
                  curve, a candidate selector's scores

    reads(...)          the record's tensors where they are computed, their copies to the host queued without a wait
    wait(reads)         those copies once landed, as Python values
    before_commit(...)  the cache after the verify, before the commit
    record(played, engine) -> StepRecord

`TokenNames` keeps token texts as ids appear (to_trace decodes only the ids named since the last).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import analysis
from ..options import DRAFT_TOP_K, MAX_TOP_K, TARGET_TOP_K, check_int
from ..trace import StepRecord, TreeNode
from .dflash2 import SelectorScores
from .sampling import Sampler
from .shapes import Shape
from .tree import DraftTree


@dataclass(frozen=True)
class Recording:
    """What each round keeps, and how it is timed; checked once, here. `record`: PageRecorder's records (else
    Recorder's); `time_phases` (None: as `record`) times each phase (timing.PhaseClock); `target_top_k` the target's
    top tokens kept at every tree position, `draft_top_k` the cap on the drafter's candidates kept per depth (0:
    none)."""

    record: bool = True
    time_phases: bool | None = None
    target_top_k: int = TARGET_TOP_K
    draft_top_k: int = DRAFT_TOP_K

    def __post_init__(self):
        object.__setattr__(self, "target_top_k", check_int("target top-k", self.target_top_k, 0, MAX_TOP_K))
        object.__setattr__(self, "draft_top_k", check_int("drafter top-k", self.draft_top_k, 0, MAX_TOP_K))


@dataclass(frozen=True)
class Played:
    """One round as it was played (round.py), what its record is made of."""

    index: int
    committed_len: int
    root: int
    tree: DraftTree
    scores: SelectorScores | None  # the selector's, where the tree came from them
    accepted: list[int]
    bonus: int
    new_tokens: tuple[int, ...]
    timings: dict[str, float]
    host: dict  # Recorder.wait's values
    before: tuple  # the cache before the commit (before_commit)
    state_error: tuple | None  # naive mode's, per layer
    own: int  # the round's own budget (the budget curve's last key)
    method: str
    verify: str


Reads = tuple[dict[str, torch.Tensor], "torch.cuda.Event | None"]


class Recorder:
    """What decoding needs of a round (the interface: module docstring); PageRecorder keeps the rest."""

    full = False

    def __init__(self, recording: Recording, sampler: Sampler, shape: Shape, cuda_device, names: TokenNames):
        self.recording, self.sampler, self.shape = recording, sampler, shape
        self.cuda_device, self.names = cuda_device, names

    def switched(self, full: bool) -> Recorder:
        """This recorder, or its other kind (a session's `record` switched on or off)."""
        if full == self.full:
            return self
        return (PageRecorder if full else Recorder)(self.recording, self.sampler, self.shape, self.cuda_device,
                                                    self.names)

    def reads(self, logits, argmax, chosen, logprobs, depth, bonus, budget: int) -> Reads:
        """The round's record as tensors where they are computed, their copies to the host queued without a wait
        (`wait` waits), and on a GPU the event after the copies. Queued before the next round's draft, so on a GPU
        the copies do not wait behind it. `depth` accepted nodes, `bonus` the target's choice after them: ints, or
        [] tensors on the device (a walk not read yet)."""
        reads = self._tensors(logits, argmax, chosen, logprobs, depth, bonus, budget)
        if self.cuda_device is None:  # a CPU, or several devices: plain copies (each waits for its tensor)
            return {name: t.cpu() for name, t in reads.items()}, None
        copies = {name: t.to("cpu", non_blocking=True) for name, t in reads.items()}  # into pinned memory
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(self.cuda_device))
        return copies, ready

    def _tensors(self, logits, argmax, chosen, logprobs, depth, bonus, budget: int) -> dict[str, torch.Tensor]:
        """The target's choices: its argmax, whether its logits are finite (one reduction: invalid_reason), and
        when sampling its samples."""
        reads = {"argmax": argmax, "finite": torch.isfinite(logits).all()}
        if not self.sampler.greedy:
            reads["chosen"] = chosen
        return reads

    @staticmethod
    def wait(reads: Reads) -> dict:
        """`reads`' copies once they have landed, as Python values."""
        copies, ready = reads
        if ready is not None:
            ready.synchronize()
        host = {name: t.item() if t.dim() == 0 else t.tolist() for name, t in copies.items()}
        if not host.pop("bonus_drafted", True):  # the walk went past the drafter's last depth (bonus_reads)
            del host["bonus_logprob"], host["bonus_rank"]
        return host

    def before_commit(self, engine, pending: int) -> tuple:
        return ()

    def record(self, p: Played, engine) -> StepRecord:
        """The round's StepRecord."""
        host = p.host
        return StepRecord(
            index=p.index, committed_len=p.committed_len, root_token_id=p.root, nodes=self._nodes(p.tree),
            target_argmax=tuple(host["argmax"]), accepted=tuple(p.accepted),
            target_choice=() if self.sampler.greedy else tuple(host["chosen"]),
            target_prob=tuple(host.get("probs", ())), bonus_token_id=p.bonus, timings_ms=p.timings,
            cache=self._after_commit(engine), cache_before_commit=p.before, new_token_ids=p.new_tokens,
            method=p.method, verify=p.verify, bonus_draft_rank=host.get("bonus_rank"),
            bonus_draft_logprob=host.get("bonus_logprob"),
            naive_state_error=p.state_error if p.state_error is not None else (),
            budget_curve=self._curve(p.accepted, p.own), **record_fields(host), **self._selector(p.tree, p.scores),
        )

    def _nodes(self, tree: DraftTree) -> tuple[TreeNode, ...]:
        return ()

    def _after_commit(self, engine) -> tuple:
        return ()

    def _curve(self, accepted: list[int], own: int) -> dict[str, int]:
        return {}

    def _selector(self, tree: DraftTree, scores: SelectorScores | None) -> dict:
        return {}


class PageRecorder(Recorder):
    """What the page shows of a round, beside what decoding needs (module docstring)."""

    full = True

    def _tensors(self, logits, argmax, chosen, logprobs, depth, bonus, budget: int) -> dict[str, torch.Tensor]:
        """Recorder's, and the target's margins and top tokens (under the distribution it chooses from), the
        drafter's top candidates per depth (what the tree was built from: the shape's count) and its rank and
        log-prob of the target's choice at the depth the walk stopped."""
        reads = super()._tensors(logits, argmax, chosen, logprobs, depth, bonus, budget)
        greedy = self.sampler.greedy
        if not greedy:
            reads["probs"] = self.sampler.probs(logits, chosen)
        k = min(self.recording.target_top_k, logits.shape[-1])
        top2 = None
        if k:  # the distribution the target chooses from: softmax of the logits, or of the filtered tempered ones
            z = logits.float() if greedy else self.sampler.tempered(logits)
            top = torch.topk(z, k, dim=-1)
            reads["target_top_ids"] = top.indices
            reads["target_top_probs"] = torch.exp(top.values - torch.logsumexp(z, dim=-1, keepdim=True))
            if z is logits and k >= 2:  # float32 logits, greedy: their top two are these (one top-k, not two)
                top2 = top.values[:, :2]
        if top2 is None:
            top2 = torch.topk(logits, 2, dim=-1).values
        reads["margins"] = top2[:, 0] - top2[:, 1]
        k = min(self.shape.draft_top_k(budget, self.recording.draft_top_k), logprobs.shape[-1])
        if k:  # what the tree was built from (k = min(budget, cap); the chain: the cap)
            top = torch.topk(logprobs, k, dim=-1)
            reads["draft_top_ids"], reads["draft_top_logprobs"] = top.indices, top.values.float().clamp(min=-999.0)
        reads.update(bonus_reads(logprobs, depth, bonus))
        return reads

    def before_commit(self, engine, pending: int) -> tuple:
        return engine.snapshot(pending=pending)

    def _nodes(self, tree: DraftTree) -> tuple[TreeNode, ...]:
        text = self.names.text
        return tuple(TreeNode(i, tree.parents[i], tree.depths[i], tree.token_ids[i], text(tree.token_ids[i]),
                              float(tree.logprobs[i]), tree.ranks[i]) for i in range(len(tree)))

    def _after_commit(self, engine) -> tuple:
        return engine.snapshot()

    def _curve(self, accepted: list[int], own: int) -> dict[str, int]:
        return {str(b): v for b, v in analysis.budget_curve_of(accepted, own).items()}

    def _selector(self, tree: DraftTree, scores: SelectorScores | None) -> dict:
        return selector_fields(tree, scores) if scores is not None else {}


def recorder_for(recording: Recording, *parts) -> Recorder:
    """PageRecorder where the rounds are recorded (`recording.record`), Recorder otherwise (`parts`: Recorder's
    arguments after the recording)."""
    return (PageRecorder if recording.record else Recorder)(recording, *parts)


def bonus_reads(logprobs: torch.Tensor, depth, bonus) -> dict[str, torch.Tensor]:
    """The drafter's log-prob and rank of the bonus token at the depth the walk stopped (`depth` accepted nodes,
    the root included: the drafter's row depth - 1), where it drafted that deep. `depth` and `bonus` are ints,
    or [] tensors on the device (a walk not read yet): then the row is gathered there, clamped, and whether the
    drafter drafted that deep goes with the reads (`Recorder.wait` drops the two where it did not)."""
    rows = logprobs.shape[0]
    if isinstance(depth, int):
        if depth > rows:
            return {}
        row = logprobs[depth - 1]
        return {"bonus_logprob": row[bonus], "bonus_rank": (row > row[bonus]).sum()}
    row = logprobs.index_select(0, (depth - 1).clamp(max=rows - 1).view(1))[0]
    value = row.index_select(0, bonus.view(1))[0]
    return {"bonus_logprob": value, "bonus_rank": (row > value).sum(), "bonus_drafted": depth <= rows}


def record_fields(host: dict) -> dict:
    """The record's margins, the target's top tokens (filtered-out ones left out) and the drafter's top
    candidates (log-probs rounded to 3 decimals, floored at -999: JSON has no infinity), from `wait`'s values."""
    fields = {}
    if "margins" in host:
        fields["target_margin"] = tuple(host["margins"])
    if "target_top_ids" in host:
        ids, probs = host["target_top_ids"], host["target_top_probs"]
        keep = [[j for j, p in enumerate(row) if p > 0] for row in probs]
        fields["target_top_ids"] = tuple(tuple(ids[i][j] for j in kj) for i, kj in enumerate(keep))
        fields["target_top_probs"] = tuple(tuple(round(probs[i][j], 4) for j in kj) for i, kj in enumerate(keep))
    if "draft_top_ids" in host:
        fields["draft_top_ids"] = tuple(tuple(r) for r in host["draft_top_ids"])
        fields["draft_top_logprobs"] = tuple(tuple(round(v, 3) for v in r) for r in host["draft_top_logprobs"])
    return fields


def selector_fields(tree: DraftTree, scores: SelectorScores) -> dict:
    """Per tree position (the root 0): the node's unary score U_t(b) and pair score S_t(parent's token, b), rounded
    to 3 decimals; a node's rank is its candidate's index at its depth (tree.build_selector_tree)."""
    unary, pair = [0.0], [0.0]
    for pos in range(1, len(tree)):
        d, j, parent = tree.depths[pos], tree.ranks[pos], tree.parents[pos]
        unary.append(round(float(scores.unary[d - 1, j]), 3))
        pair.append(round(float(scores.root[j] if d == 1 else scores.pair[d - 2, tree.ranks[parent], j]), 3))
    return dict(selector_unary=tuple(unary), selector_pair=tuple(pair))


class TokenNames:
    """Token texts as a trace names them (str(id) -> text), kept as ids appear: each `texts` call decodes only the
    ids named since the last and copies the dict, so a Step's to_trace does not decode, sort or gather every id of
    the session again (at 27B shapes with random weights the records name ~31,000 ids by round 100, which cost the
    page's Step 20 ms: docs/lab/NOTEBOOK.md section 22). `reset` at a new prompt; one id's text is decoded once
    per session (`text`)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._seen: dict[int, str] = {}
        self.reset()

    def reset(self) -> None:
        # every id named so far, the ids named since (decoded at the next `texts`), and how far the prompt, the
        # output and the reference have been named
        self._texts: dict[str, str] = {}
        self._unnamed: set[int] = set()
        self._named: dict[str, int] = {"prompt": 0, "output": 0, "reference": 0}

    def text(self, token_id: int) -> str:
        """One token's text (decoded once per id: every round names each of its tree nodes)."""
        text = self._seen.get(token_id)
        if text is None:
            text = self._seen[token_id] = self.tokenizer.decode([token_id], clean_up_tokenization_spaces=False)
        return text

    def note(self, step: StepRecord) -> None:
        """The ids a round's record names."""
        self._unnamed.update(step.target_argmax, step.target_choice, (n.token_id for n in step.nodes),
                             (t for row in step.target_top_ids for t in row),
                             (t for row in step.draft_top_ids for t in row))

    def texts(self, prompt_ids, generated, greedy_ids) -> dict[str, str]:
        """Text of every id the trace names (prompt, output, reference, records), by str(id)."""
        for source, ids in (("prompt", prompt_ids), ("output", generated), ("reference", greedy_ids or ())):
            self._name_new(source, ids)
        texts, unnamed = self._texts, self._unnamed
        for i in unnamed:
            key = str(i)
            if key not in texts:
                texts[key] = self.text(i)
        unnamed.clear()
        return dict(texts)

    def _name_new(self, source: str, ids) -> None:
        """Queue the ids of a list that only grows while a prompt lasts (the prompt's, the output's, the
        reference's) past those queued before (`reset` starts every count again). A shorter view of it (a trace
        without the reference, or the reference cut to the output) queues nothing and forgets nothing."""
        count = self._named[source]
        self._unnamed.update(ids[count:])
        self._named[source] = max(count, len(ids))
