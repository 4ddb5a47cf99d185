"""StaticRunner: the runner's parts composed (the package docstring says what each is), and what its engine calls:
prefill, forward over a tree (staged by the host, or written by the device), commit of a path (or the walk and the
commit on the device), the verify graph launched ahead, the state's records."""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from typing import Mapping

import torch

from ...errors import ModelLoadError
from ..backends import sdpa_backends
from ..cache import layer_types, prefill_cache
from ..fused import Pieces, compiler_failure
from ..launch import LaunchAhead, device_word
from ..tree import DraftTree
from ..verify import decoder_layers, gdn_modules
from . import autotune
from .autotune import Forms, Tuner
from .buffers import Slot, State
from .capture import capture, capture_staging, replay, walk_commit
from .layers import StaticModel
from .options import RunnerForms

# a prefill's tokens a forward: transformers' forward over a long prompt in chunks, its cache carried from one to
# the next (the GDN layers start from the carried conv window and recurrent state), so a prefill's transients (a
# layer's activations, the MLP's intermediate, the reference conv's copies) are a chunk's, not the prompt's: a 16k
# prompt on a 4-bit 27B asked 322 MB more past a 24 GB card's cap in one forward (docs/lab/NOTEBOOK.md section 39)
PREFILL_CHUNK = 4096


def context_features_shape(config, feature_layer_ids, n: int) -> tuple[int, int]:
    """The drafter's context features of an n-token prefill, as StaticRunner.prefill returns them: [n, hidden size x
    the feature layers named] (the memory plan sizes them too)."""
    return n, config.get_text_config().hidden_size * len(feature_layer_ids)


class StaticRunner:
    """A Qwen3.5 hybrid target on one device over static state: its buffers (buffers.State, a Slot per tree size
    and length bucket), its layers (layers.StaticModel), their graphs (capture.py) and what it settles for itself
    (autotune.py). The state's tensors are also reachable here by name (keys_all, values_all, conv_all, rec_all,
    committed_t): never rebound, the graphs hold their addresses. `forms`: parts forced to a form by name (options.py
    PARTS; a benchmark's or a test's), every other part at its default for the device; `self.forms` says what runs."""

    def __init__(self, target, *, max_len: int, sizes=(1,), feature_layer_ids=None, max_path: int = 16,
                 graphs: bool | None = None, forms: Mapping[str, object] | None = None):
        self.target = target
        self.layers = decoder_layers(target)
        self.types = layer_types(target.config)
        if any(getattr(m, "_hf_hook", None) is not None for m in target.modules()):
            raise ModelLoadError("the static runner needs the whole target on one device (no device_map hooks)")
        gdn = gdn_modules(target)
        if not gdn:
            raise ModelLoadError("the static runner is written for Qwen3.5 hybrid targets (Gated DeltaNet layers)")
        weight = target.get_input_embeddings().weight
        self.device, self.dtype = weight.device, weight.dtype
        self.graphs = (self.device.type == "cuda") if graphs is None else graphs
        # each part's form (options.py PARTS: a part `forms` names forced to that form, else its default here)
        resolved = RunnerForms.of(forms, self.device)
        # the kernel forms, once (why a Triton one was refused here, kernel_error; the torch one runs in its place)
        kernels = Forms.choose(resolved, self.device, next(iter(gdn.values())), self.dtype, weight.shape[-1])
        self.forms = kernels.held(resolved)
        self.rule, self.kernel_error = kernels.rule, kernels.error
        self._commit_kernel, self._norm_kernel = kernels.commit, kernels.norm
        self.kernel = next(iter(gdn.values())).conv_kernel_size
        self.max_len, self.max_path = int(max_len), int(max_path)
        self.feature_layer_ids = list(feature_layer_ids or [])
        self._model_key = autotune.model_key(target, self.device, self.dtype)
        self.buffers = State(target.config, self.types, gdn, self.kernel, self.max_len, self.dtype, self.device)
        b = self.buffers
        self.keys_all, self.values_all, self.conv_all, self.rec_all = b.keys_all, b.values_all, b.conv_all, b.rec_all
        self.committed_t = b.committed_t
        self.model = StaticModel(target, self.layers, gdn, b, kernels, fused=self.forms.fused,
                                 attention=self.forms.attention, pdl_on=self.forms.pdl == "on",
                                 pieces=Pieces(self.forms.compile), feature_layer_ids=self.feature_layer_ids,
                                 gate_up_form=autotune.fixed_gate_up(self.forms.gate_up), max_path=self.max_path,
                                 max_len=self.max_len)
        self._fused = self.model.fused  # (layer, mixer | mlp) -> its fused projections (None where not fusable)
        self.tuner = Tuner(self.model, self._model_key, self.device)
        # per tree size: the GEMMs' library its graphs use and, where "auto" measured it, each one's replay ms; per
        # (tree size, library) that "auto" measured: each gate+up form's µs a call
        self.blas, self.gate_up_forms = self.tuner.blas, self.tuner.gate_up_forms
        self._start(sizes)
        self.compile_error: str | None = None  # why the compiled pieces were refused here (they run uncompiled)
        self.compile_s = 0.0  # seconds this construction spent compiling and warming them up
        if self.forms.compile:
            self._compile_setup(gdn)

    def _start(self, sizes) -> None:
        """The host's counters and the slots' table, empty."""
        self.committed = 0
        self.host_ms: list[float] = []  # per forward + commit: host work (inputs, path), GPU waits excluded
        self._host = 0.0
        self._pool = torch.cuda.graph_pool_handle() if self.graphs else None
        self._ahead: LaunchAhead | None = None  # launch_ahead's, made at its first call on a GPU
        self.launch_error: str | None = None  # why verify graphs cannot be launched ahead here
        self.passes_launched_ahead = 0  # forwards that took a launch made ahead
        # attention length buckets: a pass attends over the smallest bucket holding the committed rows and the
        # tree, so its cost follows the sequence, not max_len (one graph per tree size and bucket, made on first use)
        self.buckets = sorted({min(self.max_len, 2 ** k) for k in range(8, max(9, self.max_len.bit_length() + 1))})
        self.sizes = sorted(set(int(s) for s in sizes))
        self._slots: dict[tuple[int, int], Slot] = {}

    @property
    def _gate_up_form(self) -> str:
        """The MLP's gate+up form the layers compute now (a capture's, or the forms' fixed one)."""
        return self.model.gate_up_form

    def _compile_setup(self, gdn) -> None:
        """The compiled pieces warmed up at construction (autotune.warm_compiled: a pass and commit at T = 1 and one
        over a tree, `compile_s`). A GDN layer of a kind the compiled pieces are not made for, or a compiler that
        fails here, leaves the pieces running uncompiled, with `compile_error` saying why."""
        start = time.perf_counter()
        why = autotune.uncovered(gdn)
        if why is None:
            key = (*self._model_key, self.max_path, self.forms)
            try:
                autotune.warm_compiled(key, self.model, self.buffers, self._warm_slots(), self.device)
            except Exception as exc:  # a compiler that cannot run here must not stop the runner
                if not compiler_failure(exc):  # out of memory, a CUDA error: the runner's own, raised
                    raise
                why = f"{type(exc).__name__}: {str(exc)[:500]}"
        if why is not None:
            self.compile_error = why
            self.forms = replace(self.forms, compile=False)
            self.model.pieces = Pieces(False)
        self.compile_s = time.perf_counter() - start

    def _warm_slots(self):
        """The warm-up's slots, each made as it is run: T = 1 and the largest tree size (at least 2), each in the
        smallest length bucket that holds it."""
        for size in (1, max(2, *self.sizes)):
            fits = [b for b in self.buckets if b >= max(size, self.max_path)]
            if fits:
                yield self._new_slot(size, fits[0])

    # -- slots and their graphs -----------------------------------------------------------------------------------

    def _new_slot(self, size: int, cols: int) -> Slot:
        return Slot.new(size, cols, self.kernel, self.max_path, self.device)

    @torch.no_grad()
    def _add_slot(self, size: int, cols: int) -> Slot:
        slot = self._new_slot(size, cols)
        if self.graphs:
            saved = self.buffers.copy()  # capture runs mutate the state; it is restored (and prefill overwrites it)
            slot.graph, slot.commit_graph, slot.walk_graph, slot.out = self.tuner.capture(
                slot, self.forms, lambda: capture(slot, self.model, self._pool))
            State.restore(saved)
        self._slots[(size, cols)] = slot
        return slot

    def slot_for(self, n: int, ahead: bool = False) -> Slot:
        """The slot for a tree of n nodes at the current length (made, and captured, on first use); `ahead`: a walk
        queued and not read yet may move the length on by up to max_path first (its key bucket holds that too)."""
        fits = [s for s in self.sizes if s >= n]
        if not fits:
            self.sizes.append(n)
            fits = [n]
        size = min(fits)
        need = self.committed + max(size, self.max_path) + (self.max_path if ahead else 0)
        fitting = [b for b in self.buckets if b >= need]
        if not fitting:
            raise ValueError(f"the runner's max_len {self.max_len} is full")
        key = (size, fitting[0])
        return self._slots[key] if key in self._slots else self._add_slot(*key)

    # -- public API ---------------------------------------------------------------------------------------------

    @torch.no_grad()
    def prefill(self, prompt_ids: list[int]):
        """transformers' own forward over the prompt in chunks, its attention rows written into the runner's
        buffers as it goes (cache.prefill_cache: no second copy) and its GDN states copied in. Returns (logits
        [vocab] fp32 of the last position, context features [n, F] or None)."""
        if len(prompt_ids) + 2 * self.max_path + max(self.sizes) > self.max_len:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens leaves no room in max_len {self.max_len}")
        self.release_ahead()
        cache = prefill_cache(self.target, self.buffers.keys, self.buffers.values)  # attention rows written in place
        ids = torch.tensor([prompt_ids], device=self.device)
        with sdpa_backends(self.device), self._features_kept(len(prompt_ids)) as feats:
            for start in range(0, ids.shape[1], PREFILL_CHUNK):  # the cache carried from chunk to chunk
                out = self.target(input_ids=ids[:, start:start + PREFILL_CHUNK], cache=cache, use_cache=True,
                                  logits_to_keep=1)
        n = len(prompt_ids)
        self.buffers.load_states(cache)
        self.committed = n
        self.committed_t.fill_(n)
        return out.logits[0, -1].float(), feats

    @contextmanager
    def _features_kept(self, n: int):
        """The drafter's context features of an n-token prefill, [n, F] (None without feature layers), written by
        hooks as the forward makes them, chunk by chunk, into their columns: layer i's output (the last layer's
        through the final norm, as transformers' hidden_states[L] is), what output_hidden_states=True gives at
        [i + 1]. Not every layer's hidden state (65 x 42 MB at 4,096 tokens of a 27B model), and no chunk kept to
        be joined after (twice the features at the prefill's end: 1.7 GB at 16k tokens)."""
        ids = self.feature_layer_ids
        if not ids:
            yield None
            return
        width = self.target.config.get_text_config().hidden_size
        feats = torch.empty(context_features_shape(self.target.config, ids, n), dtype=self.dtype, device=self.device)
        done = dict.fromkeys(ids, 0)  # rows written so far, per layer
        last = len(self.layers) - 1

        def keep(i, module, args, out):
            rows = (out[0] if isinstance(out, tuple) else out)[0]
            for j in (j for j, layer in enumerate(ids) if layer == i):  # a layer named twice fills both
                feats[done[i]:done[i] + rows.shape[0], j * width:(j + 1) * width].copy_(rows)
            done[i] += rows.shape[0]

        hooks = [(self.target.model.norm if i == last else self.layers[i]).register_forward_hook(partial(keep, i))
                 for i in done]  # a layer named twice (a toy drafter's ids) hooked once
        try:
            yield feats
        finally:
            for h in hooks:
                h.remove()

    def launch_ahead(self, n: int) -> bool:
        """Queue the verify graph for a tree of up to n nodes now, before the tree is known (launch.py): it starts
        once the next forward has staged its inputs, and the host's replay() is off the round's critical path.
        False where it cannot be (no CUDA graphs, the driver's stream memory operations missing: `launch_error`),
        or while a launch is pending. A launch no forward takes must be released (release_ahead)."""
        if not self.graphs or self.launch_error is not None or (self._ahead and self._ahead.pending):
            return False
        slot = self.slot_for(n)  # captured here on first use, before anything waits
        if slot.graph is None:
            return False
        if self._ahead is None:
            word, self.launch_error = device_word(self.device)
            if word is None:
                return False
            self._ahead = LaunchAhead(word, self.device)
        self._ahead.launch(slot)
        return True

    def release_ahead(self) -> None:
        """Let a pending launch run over the inputs it has (its outputs dropped), the main stream behind it."""
        if self._ahead is not None:
            self._ahead.release(self._ahead.take())

    @torch.no_grad()
    def forward(self, tree: DraftTree) -> tuple[torch.Tensor, torch.Tensor | None, Slot]:
        """One pass over the tree: (logits [T, vocab] fp32, features [T, F] or None, slot for the commit). After
        launch_ahead, the launched graph's slot where the tree fits it: its inputs staged, then the launch let go."""
        start = time.perf_counter()
        self._host = 0.0
        n = len(tree)
        launched = self._ahead.take() if self._ahead is not None else None
        if launched is not None and n > launched.slot.size:  # let go before slot_for, which may capture (and wait)
            self._ahead.release(launched)
            launched = None
        try:
            slot = launched.slot if launched is not None else self.slot_for(n)
            slot.stage_tree(tree, self.committed)
            slot.upload_tree()
        finally:
            if launched is not None:
                self._ahead.release(launched)
        self._host += time.perf_counter() - start
        return self._run(slot, n, launched=launched is not None)

    @torch.no_grad()
    def forward_tensors(self, token_ids: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor,
                        static: bool = False, ahead: bool = False) -> tuple[torch.Tensor, torch.Tensor | None, Slot]:
        """forward over a tree held as tensors where the runner is (tree.tree_on_device's nodes: [n] each, root
        first, shallower than max_path): the slot's inputs written by the device (Slot.stage_tensors), the same
        values Slot.stage_tree writes from the host (tests/test_runner.py), nothing staged or copied up. `static`:
        the three tensors are rewritten in place for every tree (DeviceTreeBuilder's graph outputs), so where the
        slot has graphs the writing is captured once as a graph of its own (`tree_graph`, for these tensors'
        storage) and replayed: one launch where it is a few dozen ops. `ahead`: queued behind a walk not read yet
        (slot_for's; the positions are the device's committed length's, so the pass reads the state that walk's
        commit leaves)."""
        self.release_ahead()
        start = time.perf_counter()
        self._host = 0.0
        slot = self.slot_for(token_ids.shape[0], ahead)
        stage = partial(slot.stage_tensors, token_ids, parents, depths, self.committed_t, self.max_path)
        if static and slot.graph is not None:
            key = tuple((t.data_ptr(), t.shape[0]) for t in (token_ids, parents, depths))
            if slot.tree_key != key:
                slot.tree_graph, slot.tree_key = capture_staging(stage), key
            slot.tree_graph.replay()
        else:
            stage()
        slot.depth = self.max_path - 1  # a bound (the walk's check): the tree is not read back
        self._host += time.perf_counter() - start
        return self._run(slot, token_ids.shape[0])

    def _run(self, slot: Slot, n: int, launched: bool = False) -> tuple[torch.Tensor, torch.Tensor | None, Slot]:
        """The slot's pass (its graph replayed, or its function run where there is none; `launched`: its graph
        already queued by launch_ahead) and the outputs for the tree's n nodes."""
        if launched:
            self.passes_launched_ahead += 1
        elif slot.graph is not None:
            slot.graph.replay()
        else:
            slot.out = self.model.forward(slot)
        logits, feats, _ = slot.out
        return logits[:n], (feats[:n] if feats is not None else None), slot

    @torch.no_grad()
    def commit(self, slot: Slot, accepted: list[int]) -> None:
        """Keep the accepted path (tree positions, root first) and advance every layer's state along it."""
        start = time.perf_counter()
        L = len(accepted)
        if not 1 <= L <= self.max_path:
            raise ValueError(f"accepted path of {L} nodes; the runner keeps 1..{self.max_path}")
        slot.stage_path(accepted)
        self._host += time.perf_counter() - start
        self.host_ms.append(self._host * 1e3)
        replay(slot.commit_graph, self.model.commit, slot)
        self.committed += L

    @torch.no_grad()
    def commit_walk(self, slot: Slot, choice: torch.Tensor) -> tuple[list[int], int]:
        """The acceptance walk and the commit on the device, from the target's choices at the forward's positions
        (choice [n]: argmax or samples, where the logits are): queue_walk, then read_walk. Returns (accepted path,
        bonus token), treeops.follow's (tests/test_runner.py)."""
        self.queue_walk(slot, choice)
        return self.read_walk(slot)

    @torch.no_grad()
    def queue_walk(self, slot: Slot, choice: torch.Tensor) -> None:
        """The walk, its result's copy to the host and the commit queued (capture.walk_commit: one graph's launch);
        nothing waited for. Until read_walk, the result is the device's alone: `walk_out` (the accepted length at
        [max_path + 1], the bonus token at [max_path + 2]), the path (`slot.path`, padded with its last node) and
        committed_t, advanced."""
        start = time.perf_counter()
        if slot.depth >= self.max_path:
            raise ValueError(f"tree of depth {slot.depth}; the runner keeps paths of 1..{self.max_path} nodes")
        slot.choice[:choice.shape[0]].copy_(choice)
        replay(slot.walk_graph, partial(walk_commit, self.model), slot)
        self._host += time.perf_counter() - start
        self.host_ms.append(self._host * 1e3)

    def read_walk(self, slot: Slot) -> tuple[list[int], int]:
        """The queued walk's result on the host (a wait for its copy alone, the commit may still run): (accepted
        path, bonus token); `committed` moves past the path."""
        if slot.walked is not None:
            slot.walked.synchronize()
        walk = (slot.walk_host if slot.walked is not None else slot.walk_out).tolist()
        P = self.max_path
        length = walk[P + 1]
        self.committed += length
        return walk[:length], walk[P + 2]

    def snapshot(self, types: list[str], pending: int = 0):
        """Per-layer LayerCache records in the shapes transformers' cache would hold (batch of one); `pending`
        tree rows written by a forward and not yet committed count as held, as in transformers' cache."""
        return self.buffers.snapshot(types, self.committed + pending)

    def state(self) -> dict:
        """Views of the committed state per layer (attention rows up to `committed`)."""
        return self.buffers.views(len(self.types), self.committed)
