"""The runner's static buffers: the committed state, sized once (State), and a slot's inputs and outputs per tree
size and attention length bucket (Slot), with the host's and the device's staging of a tree and a path into them.
Every tensor here is allocated once and only written in place: the CUDA graphs hold their addresses."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np
import torch

from ...treeops import conv_gather
from ..tree import DraftTree, tree_inputs_on_device


class State:
    """The committed state, one stacked tensor per kind (so the commit is a few batched kernels), a view per layer:

        keys / values  [La, kv_heads, max_len, head_dim] (rows past the committed length are scratch)
        conv           [Lg, C, kernel] (raw inputs, oldest first)
        recurrent      [Lg, H, K, V] fp32

    and the committed length on the device (`committed_t`; the host's count is the runner's)."""

    def __init__(self, config, types: list[str], gdn: dict, kernel: int, max_len: int, dtype, device):
        cfg = config.get_text_config()
        kvh, hd = cfg.num_key_value_heads, cfg.head_dim
        self.rep = cfg.num_attention_heads // kvh  # query heads per KV head
        self.gdn_ids = [i for i, kind in enumerate(types) if kind == "linear_attention"]
        self.attn_ids = [i for i, kind in enumerate(types) if kind != "linear_attention"]
        m, d = gdn[self.gdn_ids[0]], device
        self.conv_all = torch.zeros(len(self.gdn_ids), m.conv_dim, kernel, dtype=dtype, device=d)
        self.rec_all = torch.zeros(len(self.gdn_ids), m.num_v_heads, m.head_k_dim, m.head_v_dim, dtype=torch.float32,
                                   device=d)
        self.keys_all = torch.zeros(len(self.attn_ids), kvh, max_len, hd, dtype=dtype, device=d)
        self.values_all = torch.zeros_like(self.keys_all)
        self.conv = {i: self.conv_all[j] for j, i in enumerate(self.gdn_ids)}
        self.rec = {i: self.rec_all[j] for j, i in enumerate(self.gdn_ids)}
        self.keys = {i: self.keys_all[j][None] for j, i in enumerate(self.attn_ids)}
        self.values = {i: self.values_all[j][None] for j, i in enumerate(self.attn_ids)}
        self.committed_t = torch.zeros((), dtype=torch.long, device=d)
        self._fixed_records: dict = {}  # snapshot's GDN layer records: (layer, type) -> LayerCache

    def copy(self):
        """A copy of what a capture's or a warm-up's runs (forwards, commits) may change and a later round reads, for
        restore: the GDN layers' conv windows and recurrent states and the committed length. Not the attention
        rows: a forward writes its tree's rows at the committed length and on, a commit moves rows within them, so
        the committed rows are never written, and the rows past them are scratch that each forward writes before it
        reads them (its mask hides the rest). At a 16k prompt the keys and values are 2 x 528 MiB at the 27B's
        shapes: copying them was the transient a 24 GB card ran out on (docs/lab/NOTEBOOK.md section 55)."""
        return [(t, t.clone()) for t in (self.conv_all, self.rec_all, self.committed_t)]

    @staticmethod
    def restore(saved) -> None:
        for t, copy in saved:
            t.copy_(copy)

    def load_states(self, cache) -> None:
        """The GDN layers' conv windows and recurrent states of transformers' cache after a prefill copied in (its
        attention layers wrote into keys / values themselves: cache.prefill_cache)."""
        for i in self.conv:
            self.conv[i].copy_(cache.layers[i].conv_states[0][0])
            self.rec[i].copy_(cache.layers[i].recurrent_states[0][0])

    def snapshot(self, types: list[str], rows: int):
        """Per-layer LayerCache records in the shapes transformers' cache would hold (batch of one), attention
        layers holding `rows` rows."""
        from ...trace import LayerCache, TensorInfo

        def info(name, t, shape):
            return TensorInfo(name, tuple(int(x) for x in shape), str(t.dtype).removeprefix("torch."))

        def fixed(i, kind):  # a GDN layer's record never changes (its state's shapes): made once per runner
            conv, rec = self.conv[i], self.rec[i]
            infos = (info("conv_state", conv, (1, *conv.shape)), info("recurrent_state", rec, (1, *rec.shape)))
            nbytes = conv.numel() * conv.element_size() + rec.numel() * rec.element_size()
            return LayerCache(i, kind, "LinearAttentionLayer", infos, int(nbytes), None)

        out = []
        for i, kind in enumerate(types):
            if i in self.conv:
                key = (i, kind)
                if key not in self._fixed_records:
                    self._fixed_records[key] = fixed(i, kind)
                out.append(self._fixed_records[key])
            else:
                k = self.keys[i]
                shape = (1, k.shape[1], rows, k.shape[3])
                nbytes = 2 * k.shape[1] * rows * k.shape[3] * k.element_size()
                out.append(LayerCache(i, kind, "DynamicLayer", (info("keys", k, shape), info("values", k, shape)),
                                      nbytes, rows))
        return tuple(out)

    def views(self, layers: int, committed: int) -> dict:
        """Views of the committed state per layer (attention rows up to `committed`)."""
        out = {}
        for i in range(layers):
            if i in self.conv:
                out[i] = {"conv": self.conv[i], "recurrent": self.rec[i]}
            else:
                out[i] = {"keys": self.keys[i][:, :, : committed], "values": self.values[i][:, :, : committed]}
        return out


@dataclass
class Slot:
    """Static inputs and outputs of one tree size and one attention length bucket.

    The forward's integer inputs are views of one device tensor (`inputs`: ids [T], pos [T], parents [T] (-1 for
    the root and the padding: the walk's), gather [T, kernel]) and the commit's of another (`commit_in`: path
    [max_path], last [1], length []), each filled from a host staging buffer of its own (pinned on CUDA) by one copy;
    the ancestor mask has its own (bool). So a round queues three host-to-device copies and no fills. Or the walk
    on the device fills `commit_in` from the target's choices (`choice` [T]; `walk_out`: commit_in's layout and the
    bonus token, read back through `walk_host` after the commit is queued)."""

    size: int
    cols: int  # attention reads cache rows [0, cols): the smallest bucket that holds committed + size
    inputs: torch.Tensor
    anc: torch.Tensor
    commit_in: torch.Tensor
    stage: torch.Tensor  # host copies of inputs, anc and commit_in
    anc_stage: torch.Tensor
    commit_stage: torch.Tensor
    choice: torch.Tensor
    walk_out: torch.Tensor
    walk_host: torch.Tensor
    ids: torch.Tensor = None
    pos: torch.Tensor = None
    parents: torch.Tensor = None
    gather: torch.Tensor = None
    path: torch.Tensor = None
    last: torch.Tensor = None
    length: torch.Tensor = None
    copied: object = None  # CUDA event after the last copies from the staging buffers
    walked: object = None  # CUDA event after the walk's copy to walk_host (external: a node of the walk's graph)
    depth: int = 0  # the staged tree's depth (the walk needs it under max_path)
    out: tuple | None = None  # (logits, feats, stash) of the forward
    graph: object = None
    commit_graph: object = None
    walk_graph: object = None
    tree_graph: object = None  # forward_tensors' inputs written from a static tree's tensors (runner.forward_tensors)
    tree_key: tuple | None = None  # the storage (address, length) of the tensors tree_graph reads

    def __post_init__(self):
        T, P = self.size, self.commit_in.shape[0] - 2
        self.ids, self.pos, self.parents = self.inputs[:T], self.inputs[T:2 * T], self.inputs[2 * T:3 * T]
        self.gather = self.inputs[3 * T:].view(T, -1)
        self.path, self.last, self.length = self.commit_in[:P], self.commit_in[P:P + 1], self.commit_in[P + 1]

    @classmethod
    def new(cls, size: int, cols: int, kernel: int, max_path: int, device: torch.device) -> "Slot":
        """A slot's buffers, its inputs those of a one-node tree padded with children of the root."""
        d, cuda = device, device.type == "cuda"
        n_in = size * (3 + kernel)
        slot = cls(
            size, cols, inputs=torch.zeros(n_in, dtype=torch.long, device=d),
            anc=torch.eye(size, dtype=torch.bool, device=d),
            commit_in=torch.zeros(max_path + 2, dtype=torch.long, device=d),
            stage=torch.zeros(n_in, dtype=torch.long, pin_memory=cuda),
            anc_stage=torch.zeros(size, size, dtype=torch.bool, pin_memory=cuda),
            commit_stage=torch.zeros(max_path + 2, dtype=torch.long, pin_memory=cuda),
            choice=torch.zeros(size, dtype=torch.long, device=d),
            walk_out=torch.zeros(max_path + 3, dtype=torch.long, device=d),
            walk_host=torch.zeros(max_path + 3, dtype=torch.long, pin_memory=cuda),
            copied=torch.cuda.Event() if cuda else None,
            walked=torch.cuda.Event(external=True) if cuda else None,  # recorded inside the walk's graph
        )
        slot.gather.copy_(torch.as_tensor(conv_gather([-1] + [0] * (size - 1), [0] + [1] * (size - 1), kernel)))
        slot.anc[:, 0] = True
        return slot

    def staging(self) -> None:
        """Wait until the last copies out of the staging buffers are done (before writing them again)."""
        if self.copied is not None:
            self.copied.synchronize()

    def copied_now(self) -> None:
        if self.copied is not None:
            self.copied.record()

    def stage_tree(self, tree: DraftTree, committed: int) -> None:
        """The tree's inputs in the slot's host staging buffers, padded to the slot's size with inert nodes
        (children of the root): token ids (0 for padding), positions, conv windows, ancestor mask. The same
        arrays as treeops.conv_gather and treeops.ancestor_matrix of the padded tree (tests/test_runner.py), built
        a level of ancestry at a time for all nodes at once (the m-th step marks every node's m-th ancestor, the
        root its own past the top; the first kernel - 1 steps also fill the conv windows' columns): as many numpy
        steps as the tree is deep, not one per node."""
        T, n, k = self.size, len(tree), self.gather.shape[1]
        self.staging()
        stage, anc = self.stage.numpy(), self.anc_stage.numpy()  # views (made here: a deepcopy keeps no numpy view)
        ids, pos, parents, gather = stage[:T], stage[T:2 * T], stage[2 * T:3 * T], stage[3 * T:].reshape(T, k)
        ids[:n] = tree.token_ids
        ids[n:] = 0
        parents[:n] = tree.parents
        parents[n:] = -1  # the padding is no one's child for the walk (the forward sees it as the root's)
        self.depth = max(tree.depths)
        depth = pos  # the padded tree's depths, committed added below
        depth[:n] = tree.depths
        depth[n:] = 1
        up = np.zeros(T, dtype=np.int64)  # each node's parent, the padding's and the root's the root
        up[1:n] = tree.parents[1:]
        np.copyto(anc, _eye(T))
        rows = np.arange(T)
        gather[:, k - 1] = k + rows  # each node last in its own window
        ancestor = rows
        for m in range(1, max(self.depth, int(n < T), k - 1) + 1):
            ancestor = up[ancestor]
            anc[rows, ancestor] = True
            if m < k:  # past the root (ancestor 0) the window goes on into the committed inputs, newest last
                np.subtract(k + ancestor, np.maximum(m - depth, 0), out=gather[:, k - 1 - m])
        pos += committed

    def upload_tree(self) -> None:
        """The staged tree's two copies to the device, queued."""
        self.inputs.copy_(self.stage, non_blocking=True)
        self.anc.copy_(self.anc_stage, non_blocking=True)
        self.copied_now()

    def stage_tensors(self, token_ids: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor,
                      committed_t: torch.Tensor, max_path: int) -> None:
        """The slot's inputs from a tree held as tensors, by the device (tree.tree_inputs_on_device), padded to the
        slot's size with children of the root; positions from the committed length on the device (committed_t).
        A tree built elsewhere (a proposer's log-probs on the CPU) is moved here first."""
        token_ids, parents, depths = (t.to(self.ids.device) for t in (token_ids, parents, depths))
        pad = self.size - token_ids.shape[0]
        seen_parents = torch.cat([parents, parents.new_zeros(pad)])  # the padding: children of the root
        seen_depths = torch.cat([depths, depths.new_ones(pad)])
        anc, gather = tree_inputs_on_device(seen_parents, seen_depths, self.gather.shape[1], max_path - 1)
        self.ids.copy_(torch.cat([token_ids, token_ids.new_zeros(pad)]))
        self.pos.copy_(seen_depths + committed_t)
        self.parents.copy_(torch.cat([parents, parents.new_full((pad,), -1)]))  # the walk's: padding no one's child
        self.gather.copy_(gather)
        self.anc.copy_(anc)

    def stage_path(self, accepted: list[int]) -> None:
        """The accepted path (tree positions, root first) as the commit's inputs, padded with its last node (those
        steps are not valid: the length says so), and its copy to the device queued."""
        L, P = len(accepted), self.commit_in.shape[0] - 2
        self.staging()
        stage = self.commit_stage.numpy()
        stage[:L] = accepted
        stage[L:P] = accepted[-1]
        stage[P] = accepted[-1]
        stage[P + 1] = L
        self.commit_in.copy_(self.commit_stage, non_blocking=True)
        self.copied_now()


@cache
def _eye(n: int) -> np.ndarray:
    """An n x n boolean identity, made once a process and read only (every slot of that size copies it)."""
    eye = np.eye(n, dtype=np.bool_)
    eye.flags.writeable = False
    return eye
