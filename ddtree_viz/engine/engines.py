"""One interface to the target, two engines behind it.

A target engine owns the target's committed state (its cache) and does four things a round needs:

    prefill(prompt_ids)      -> (logits [vocab] fp32 of the last prompt position, context features [n, F] or None)
    forward(tree)            -> TreePass: logits [T, vocab] fp32 of every tree position + what the commit needs
    commit(tree_pass, path)  -> context features [P, F] of the accepted path (or None); the state moves past it
    accept(tree_pass, choice)-> (path, bonus, features): the acceptance walk over the target's choices [T] (argmax or
                                samples, where the logits are) and the commit; the runner on a GPU walks on the
                                device and reads the path back once, after the commit is queued
    accept_queued(pass, choice) (the runner with the walk on the device) -> QueuedWalk: the same walk and commit
                                queued, their result still on the device until QueuedWalk.result() reads it
    snapshot(pending)        -> per-layer LayerCache records of what the cache holds now

plus `sync()` (wait for the devices it runs on), `state_error(tree, path)` (naive mode's per-layer distance
from the exact state; None elsewhere), `discard(tree_pass)` (forget an exact pass, commit nothing: the state is
as before it) and `load_state(other)` (take a copy of another engine's committed state: same target, same kind).
What an engine can do beyond these it declares in `capabilities` (EngineCapabilities: a tree as tensors, a verify
launched ahead, a walk queued and read later); the session's scheduler reads the declaration and never probes.
DecodeSession drives rounds through it with no engine branches; `EngineGreedy` decodes greedily through it
(one-node trees), and the session's reference runs on a second engine of the session's kind that starts from a
copy of the session's state after the prefill (no second prefill).

- TransformersEngine: the target's own forward over a DynamicCache. verify="exact" swaps the tree-exact GDN in
  for the pass; verify="naive" is the known-wrong flattened tree through transformers' own layers (the bug of
  DDTree's reference code on hybrid caches), kept to show it. Naive mode exists on this engine only.
- RunnerEngine: the static runner (runner/): preallocated state, CUDA graphs on a GPU; exact only, one device,
  Qwen3.5 hybrid targets. Sized here, in one place, from the session's prompt, budget and block.

`default_engine(target, verify)` is the one rule for the engine that runs when none is named ("auto"): the runner
where it applies (exact rounds, Qwen3.5 hybrid, one device), transformers' forward (the reference path) elsewhere.

F = concatenated hidden size of the drafter's feature layers, T = tree positions, P = accepted path length.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Protocol

import torch

from ..errors import InputError, ModelLoadError
from ..trace import LayerCache
from .backends import sdpa_backends
from .cache import compact_kv, layer_types, new_cache, snapshot, state_distance
from .drafter import extract_context_features
from .tree import DeviceTree, DraftTree, follow_tree
from ..registry import AUTO, BY_NAME, ENGINE_CHOICES, ENGINES, ENTRIES, EXACT, NAIVE, engine_for_verify
from .verify import commit, device_sync, input_device, verify_tree


@dataclass(frozen=True)
class EngineCapabilities:
    """What an engine can do beyond the TargetEngine interface, declared by the engine (the session's scheduler
    reads it to choose its overlaps, engine/scheduler.py; nothing probes an engine for methods):

    tree_tensors  forward_tensors(DeviceTree, ahead) -> TreePass: a tree held as tensors where the engine runs
    launch_ahead  launch_ahead(n) / release_ahead(): the next verify graph queued before its tree exists
    queued_walk   accept_queued(tree_pass, choice) -> QueuedWalk: the walk and commit queued, read later"""

    tree_tensors: bool = False
    launch_ahead: bool = False
    queued_walk: bool = False


def capabilities_of(engine) -> EngineCapabilities:
    """The capabilities `engine` declares, or a TypeError saying that it declares none (an object made outside the
    registry that is no TargetEngine): checked once, where an engine enters a session."""
    caps = getattr(engine, "capabilities", None)
    if not isinstance(caps, EngineCapabilities):
        raise TypeError(f"{type(engine).__name__} is no target engine: it declares no `capabilities` "
                        "(engines.EngineCapabilities: what it can do beyond the TargetEngine interface); "
                        "an engine declares them, it is not probed")
    return caps


@dataclass
class TreePass:
    """One verify pass: the target's logits at every tree position and the engine's handle for the commit."""

    tree: DraftTree | DeviceTree  # DeviceTree: the runner engine's forward_tensors
    logits: torch.Tensor  # [T, vocab] fp32
    handle: object


@dataclass
class QueuedWalk:
    """A walk and commit queued on the device and not yet read (RunnerEngine.accept_queued): what the device holds
    of the result, for work queued behind it before the host knows it (the next round's draft, the record's
    reads), and `result()`, the host's read. The tensors are the slot's and the runner's own: what reads them is
    queued before the next pass over the slot rewrites them."""

    length: torch.Tensor  # [] int64: the accepted path's nodes, the root included
    bonus: torch.Tensor  # [] int64: the target's choice after the path
    committed: torch.Tensor  # [] int64: the committed length after the commit (the runner's own, advanced)
    features: torch.Tensor | None  # [max_path, F]: the path's context features, padded with its last node's
    read: object  # () -> (path, bonus) on the host

    def result(self) -> tuple[list[int], int, torch.Tensor | None]:
        """(path, bonus, features of the path [P, F] or None): accept's, once the walk's copy has landed."""
        path, bonus = self.read()
        return path, bonus, self.features[:len(path)] if self.features is not None else None


class TargetEngine(Protocol):
    name: str
    verify: str
    committed: int  # tokens in the committed state
    capabilities: EngineCapabilities  # what it can do beyond this interface (the scheduler's overlaps)

    def prefill(self, prompt_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor | None]: ...

    def forward(self, tree: DraftTree) -> TreePass: ...

    def commit(self, tree_pass: TreePass, accepted: list[int]) -> torch.Tensor | None: ...

    def accept(self, tree_pass: TreePass, choice: torch.Tensor) -> tuple[list[int], int, torch.Tensor | None]: ...

    def snapshot(self, pending: int = 0) -> tuple[LayerCache, ...]: ...

    def state_error(self, tree: DraftTree, accepted: list[int]) -> tuple[float | None, ...] | None: ...

    def discard(self, tree_pass: TreePass) -> None: ...

    def load_state(self, other: "TargetEngine") -> None: ...

    def sync(self) -> None: ...


class TransformersEngine:
    """The target's own forward over transformers' DynamicCache; the tree-exact GDN is swapped in per pass."""

    name = "transformers"
    verify_modes = (EXACT, NAIVE)
    capabilities = EngineCapabilities()  # the reference path: every tree from the host, read at once

    def __init__(self, target, feature_layer_ids: list[int] | None, *, verify: str = EXACT, reference_gdn: bool = False):
        self.target, self.feature_layer_ids = target, feature_layer_ids
        self.verify, self.reference_gdn = verify, reference_gdn
        self.types = layer_types(target.config)
        self.sync = device_sync(target)
        self.cache = None
        self.committed = 0
        self._prompt_ids: list[int] = []
        self._shadow = None  # naive mode: an exact cache fed the same committed tokens, for comparison

    @classmethod
    def blocker(cls, target, verify: str = EXACT, reference_gdn: bool = False) -> str | None:
        """The reference path runs every target and every verify mode."""
        return None

    @classmethod
    def create(cls, target, feature_layer_ids, *, verify: str = EXACT, reference_gdn: bool = False, **_sizes):
        return cls(target, feature_layer_ids, verify=verify, reference_gdn=reference_gdn)

    @torch.no_grad()
    def prefill(self, prompt_ids):
        self.cache = new_cache(self.target)
        self._shadow, self._prompt_ids = None, list(prompt_ids)
        ids = torch.tensor([self._prompt_ids], device=input_device(self.target))
        with sdpa_backends(ids.device):
            out = self.target(input_ids=ids, cache=self.cache, use_cache=True, logits_to_keep=1,
                              output_hidden_states=self.feature_layer_ids is not None)
        self.committed = len(self._prompt_ids)
        return out.logits[0, -1].float(), self._features(out.hidden_states, None)

    @torch.no_grad()
    def forward(self, tree):
        result = verify_tree(self.target, self.cache, tree, self.committed, self.verify,
                             want_hidden=self.feature_layer_ids is not None, reference_gdn=self.reference_gdn)
        return TreePass(tree, result.logits, result)

    @torch.no_grad()
    def commit(self, tree_pass, accepted):
        commit(self.cache, tree_pass.tree, accepted, tree_pass.handle)
        self.committed += len(accepted)
        return self._features(tree_pass.handle.hidden_states, accepted)

    def accept(self, tree_pass, choice):
        return accept_on_host(self, tree_pass, choice)

    @torch.no_grad()
    def discard(self, tree_pass):
        """Drop an exact pass's tree rows from the attention layers (its GDN layers never touched the cache)."""
        if self.verify != EXACT:
            raise ValueError("only an exact pass can be discarded: a naive pass has already moved the GDN state")
        compact_kv(self.cache, len(tree_pass.tree), [])

    def load_state(self, other):
        """This engine's committed state becomes a copy of `other`'s (a TransformersEngine on the same target)."""
        self.cache = copy.deepcopy(other.cache)
        self.committed, self._prompt_ids, self._shadow = other.committed, list(other._prompt_ids), None

    def snapshot(self, pending: int = 0):
        """The cache holds a pass's tree rows itself until the commit, so `pending` needs no adding here."""
        return snapshot(self.cache, self.types)

    @torch.no_grad()
    def state_error(self, tree, accepted):
        """Naive mode: feed the committed tokens to an exact cache (transformers' own one-token steps, the prompt
        first) and compare recurrent states per layer. None in exact mode."""
        if self.verify != NAIVE:
            return None
        device = input_device(self.target)
        if self._shadow is None:
            self._shadow = new_cache(self.target)
            self.target(input_ids=torch.tensor([self._prompt_ids], device=device), cache=self._shadow, use_cache=True,
                        logits_to_keep=1)
        for pos in accepted:
            self.target(input_ids=torch.tensor([[tree.token_ids[pos]]], device=device), cache=self._shadow, use_cache=True)
        return tuple(state_distance(self.cache, self._shadow))

    def _features(self, hidden_states, positions: list[int] | None) -> torch.Tensor | None:
        if self.feature_layer_ids is None:
            return None
        feats = extract_context_features(hidden_states, self.feature_layer_ids)[0]
        if positions is not None:
            feats = feats.index_select(0, torch.tensor(positions, device=feats.device))
        return feats


class RunnerEngine:
    """The static runner behind the engine interface. It is (re)built at prefill when the prompt needs more room:
    max_len = prompt + max new tokens + two blocks + the tree + 64, rounded up to 256."""

    name = "runner"
    verify_modes = (EXACT,)
    verify = EXACT

    def __init__(self, target, feature_layer_ids: list[int] | None, *, tree_size: int, block_size: int,
                 max_new_tokens: int, graphs: bool | None = None, runner=None):
        """`runner`: a StaticRunner made elsewhere (a test's, a benchmark's) to use while it has room."""
        self.target, self.feature_layer_ids = target, feature_layer_ids
        self.tree_size, self.block_size, self.max_new_tokens = int(tree_size), int(block_size), int(max_new_tokens)
        self.graphs = graphs
        self.types = layer_types(target.config)
        self.sync = device_sync(target)
        self.runner = runner
        # where `accept` walks: on a GPU the device (no synchronisation before the commit), on a CPU the host
        # (follow_tree: 8 us a round against the tensor ops' 250 us, with nothing to overlap); the bench sets both
        self.walk = "device" if input_device(target).type == "cuda" else "host"

    @classmethod
    def blocker(cls, target, verify: str = EXACT, reference_gdn: bool = False) -> str | None:
        if verify != EXACT or reference_gdn:
            return ("the runner engine verifies exactly with the fast tree GDN; naive mode and the reference GDN run "
                    "on the transformers engine")
        return runner_blocker(target)

    @classmethod
    def create(cls, target, feature_layer_ids, *, verify: str = EXACT, reference_gdn: bool = False,
               tree_size: int = 1, block_size: int = 16, max_new_tokens: int = 64):
        if verify != EXACT or reference_gdn:
            raise InputError(cls.blocker(target, verify, reference_gdn))
        return cls(target, feature_layer_ids, tree_size=tree_size, block_size=block_size,
                   max_new_tokens=max_new_tokens)

    @property
    def capabilities(self) -> EngineCapabilities:
        """A tree as tensors and a verify launched ahead (CUDA graphs: launch_ahead says whether it was), and the
        walk queued where it walks on the device (`walk`)."""
        return EngineCapabilities(tree_tensors=True, launch_ahead=True, queued_walk=self.walk == "device")

    @property
    def cache(self):
        return self.runner

    @property
    def committed(self) -> int:
        return self.runner.committed if self.runner is not None else 0

    def room(self, prompt_len: int) -> int:
        need = prompt_len + self.max_new_tokens + 2 * self.block_size + self.tree_size + 64
        return -(-need // 256) * 256

    @torch.no_grad()
    def prefill(self, prompt_ids):
        from .runner import StaticRunner

        self.release_ahead()  # a launch still pending (none after a session's round) goes before a new runner
        need = self.room(len(prompt_ids))
        if self.runner is None or self.runner.max_len < need:
            self.runner = StaticRunner(self.target, max_len=need, sizes=(1, self.tree_size),
                                       feature_layer_ids=self.feature_layer_ids, max_path=self.block_size,
                                       graphs=self.graphs)
        return self.runner.prefill(list(prompt_ids))

    @torch.no_grad()
    def forward(self, tree):
        logits, feats, slot = self.runner.forward(tree)
        return TreePass(tree, logits, (feats, slot))

    def launch_ahead(self, n: int) -> bool:
        """The next forward's graph (a tree of up to n nodes) queued before the tree is known (StaticRunner's):
        whether it was. The next forward takes it; release_ahead lets it go where no forward follows."""
        return self.runner is not None and self.runner.launch_ahead(n)

    def release_ahead(self) -> None:
        if self.runner is not None:
            self.runner.release_ahead()

    @torch.no_grad()
    def commit(self, tree_pass, accepted):
        feats, slot = tree_pass.handle
        self.runner.commit(slot, accepted)
        return self._path_features(feats, slot, len(accepted))

    @torch.no_grad()
    def forward_tensors(self, tree: DeviceTree, ahead: bool = False) -> TreePass:
        """forward over a tree held as tensors where the runner is (tree.DeviceTree): inputs written by the device
        (a graph of their own where the tree is a graph's outputs, `static`); `ahead`: queued behind a walk the host
        has not read (StaticRunner.slot_for's)."""
        logits, feats, slot = self.runner.forward_tensors(tree.token_ids, tree.parents, tree.depths, tree.static,
                                                          ahead)
        return TreePass(tree, logits, (feats, slot))

    def accept(self, tree_pass, choice):
        """The walk and the commit on the device, queued and read at once (accept_queued), or on the host where `walk`
        says so."""
        if self.walk == "host":
            return accept_on_host(self, tree_pass, choice)
        return self.accept_queued(tree_pass, choice).result()

    def accept_queued(self, tree_pass, choice) -> QueuedWalk:
        """accept's walk and commit on the device, queued (Runner.queue_walk), their result left on the device until
        the QueuedWalk's result() reads it."""
        feats, slot = tree_pass.handle
        self.runner.queue_walk(slot, choice)
        P = self.runner.max_path
        features = feats.index_select(0, slot.path) if feats is not None else None
        return QueuedWalk(slot.walk_out[P + 1], slot.walk_out[P + 2], self.runner.committed_t, features,
                          lambda: self.runner.read_walk(slot))

    @staticmethod
    def _path_features(feats, slot, length: int):
        """The graph's output buffers are reused by the next pass: the path's features gathered now, by the path the
        commit put on the device."""
        return feats.index_select(0, slot.path[:length]) if feats is not None else None

    def snapshot(self, pending: int = 0):
        """The runner writes a pass's tree rows past `committed`: `pending` of them count as held until the commit."""
        return self.runner.snapshot(self.types, pending)

    def state_error(self, tree, accepted):
        return None

    def discard(self, tree_pass):
        """Nothing to undo: a pass writes attention rows past `committed` only (scratch until a commit) and leaves
        the GDN state alone."""

    @torch.no_grad()
    def load_state(self, other):
        """This engine's committed state becomes a copy of `other`'s (a RunnerEngine on the same target): a few
        device copies, where a prefill of its own would run transformers' forward over the whole prompt again."""
        from .runner import StaticRunner

        src = other.runner
        n = src.committed
        need = self.room(n)
        if self.runner is None or self.runner.max_len < need:
            self.runner = StaticRunner(self.target, max_len=need, sizes=(1, self.tree_size),
                                       feature_layer_ids=self.feature_layer_ids, max_path=self.block_size,
                                       graphs=self.graphs)
        dst = self.runner
        dst.keys_all[:, :, :n].copy_(src.keys_all[:, :, :n])
        dst.values_all[:, :, :n].copy_(src.values_all[:, :, :n])
        dst.conv_all.copy_(src.conv_all)
        dst.rec_all.copy_(src.rec_all)
        dst.committed = n
        dst.committed_t.fill_(n)


def accept_on_host(engine: TargetEngine, tree_pass: TreePass, choice: torch.Tensor):
    """The walk on the host (follow_tree over the choices read back), then the engine's commit."""
    tree = tree_pass.tree if isinstance(tree_pass.tree, DraftTree) else tree_pass.tree.to_host()
    accepted, bonus = follow_tree(tree, choice.tolist())
    return accepted, bonus, engine.commit(tree_pass, accepted)


def runner_blocker(target) -> str | None:
    """Why the static runner cannot run this target (None when it can): it is written for Qwen3.5 hybrid targets
    (Gated DeltaNet + attention layers) held whole on one device."""
    from .verify import gdn_modules

    split = getattr(target, "hf_device_map", None)
    if (split and len(split) > 1) or any(getattr(m, "_hf_hook", None) is not None for m in target.modules()):
        return "the target is split or offloaded by a device_map (the runner needs it whole on one device)"
    try:
        gdn = gdn_modules(target)
    except ModelLoadError as exc:
        return str(exc)
    if not gdn:
        return "the target has no Gated DeltaNet layers (the runner is written for Qwen3.5 hybrid targets)"
    return None


def default_engine(target, verify: str = EXACT, reference_gdn: bool = False) -> str:
    """THE rule for which engine runs when none is named (`auto`: the CLI's run and bench, the page, DecodeSession):
    the first engine in the registry's order of preference that can run this target and mode. That is the static
    runner (same rounds, same records, faster on a CPU too: docs/lab/NOTEBOOK.md section 1) for exact rounds on a
    Qwen3.5 hybrid target on one device; transformers' own forward (the reference path) everywhere else: naive
    rounds, the reference GDN, pure-attention targets, targets split by a device_map."""
    for entry in ENTRIES:
        if entry.load().blocker(target, verify, reference_gdn) is None:
            return entry.name
    raise ModelLoadError("no target engine can run this target")  # the reference path runs every target


def engine_for(preferred: str, verify: str, target=None, reference_gdn: bool = False) -> str:
    """The engine that runs `verify` rounds: `auto` is default_engine(target, verify); a named engine runs where it
    can, else transformers' forward (the only engine with the naive mode)."""
    if preferred == AUTO:
        if target is None:
            raise ValueError("engine 'auto' needs the target to choose for")
        return default_engine(target, verify, reference_gdn)
    if preferred not in BY_NAME:
        raise InputError(f"engine must be one of {', '.join(ENGINE_CHOICES)}, not {preferred!r}")
    return engine_for_verify(preferred, verify)


def warm_runner(target) -> float:
    """Build and drop a small static runner for this target when its construction compiles (the runner's part
    "compile", by default on CUDA), so that the process pays the compile now (once: later runners reuse dynamo's
    graphs) and not in a user's first Step. Returns the seconds it took (0.0 where nothing compiles or the runner
    does not apply)."""
    if runner_blocker(target) is not None:
        return 0.0
    from .runner import RunnerForms, StaticRunner

    device = next(target.parameters()).device
    if not RunnerForms.of(None, device).compile:
        return 0.0
    start = time.perf_counter()
    runner = StaticRunner(target, max_len=64, sizes=(1, 2))
    del runner
    return time.perf_counter() - start


def make_engine(name: str, target, feature_layer_ids, *, verify: str = EXACT, reference_gdn: bool = False,
                tree_size: int = 1, block_size: int = 16, max_new_tokens: int = 64) -> TargetEngine:
    """Build the engine `name` (or `auto`'s choice) through its registry entry (registry.py)."""
    if name == AUTO:
        name = default_engine(target, verify, reference_gdn)
    if name not in BY_NAME:
        raise InputError(f"engine must be one of {', '.join(ENGINE_CHOICES)}, not {name!r}")
    return BY_NAME[name].load().create(target, feature_layer_ids, verify=verify, reference_gdn=reference_gdn,
                                       tree_size=tree_size, block_size=block_size, max_new_tokens=max_new_tokens)
