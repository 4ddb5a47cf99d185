"""One target pass over the tree, and the commit of the accepted path.

exact: attention layers see the committed prefix plus each position's ancestors (4-D mask, positions =
    committed_len + depth); every Gated DeltaNet layer is swapped, for this pass only, for its tree-exact
    form (gdn_tree.py), which reads the committed conv/recurrent state and leaves the cache untouched. The
    commit then compacts KV rows and writes the GDN state of the accepted path.
naive: what DDTree's reference code does once patched to `DynamicCache(config=...)`: the same pass through
    transformers' own layers. The GDN layers get no mask, so they run the flattened tree as one sequence:
    siblings leak into each other's conv window and state, and the state they leave behind (after the
    last tree position, rejected branches included) stays committed. KNOWN-WRONG, kept to show the bug.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from ..errors import ModelLoadError
from .backends import sdpa_backends
from .cache import commit_gdn, compact_kv
from ..registry import EXACT, NAIVE
from .gdn_tree import GDNTreeStash, TreeIndex, tree_gdn_forward, tree_gdn_forward_reference
from .tree import DraftTree, verify_inputs

SUPPORTED_GDN = {"Qwen3_5GatedDeltaNet", "Qwen3_5MoeGatedDeltaNet"}


def decoder_layers(target) -> nn.ModuleList:
    model = target.get_decoder() if hasattr(target, "get_decoder") else target.model
    layers = getattr(model, "layers", None)
    if layers is None:
        raise ModelLoadError(f"{type(target).__name__}: cannot find its decoder layers")
    return layers


def gdn_modules(target) -> dict[int, nn.Module]:
    """Layer index -> Gated DeltaNet module, for hybrid targets. Unknown recurrent mixers are refused."""
    found = {}
    for idx, layer in enumerate(decoder_layers(target)):
        mixer = getattr(layer, "linear_attn", None)
        if mixer is None:
            continue
        if type(mixer).__name__ not in SUPPORTED_GDN:
            raise ModelLoadError(
                f"layer {idx}: {type(mixer).__name__} is not a supported Gated DeltaNet "
                f"(supported: {', '.join(sorted(SUPPORTED_GDN))})"
            )
        found[idx] = mixer
    return found


@dataclass
class TreePass:
    """Per-pass state the swapped-in GDN layers read (tree index per device) and write (their stash)."""

    tree: DraftTree
    kernel: int
    reference: bool = False
    index: dict = field(default_factory=dict)  # torch.device -> TreeIndex
    stash: dict[int, GDNTreeStash] = field(default_factory=dict)

    def index_on(self, device: torch.device) -> TreeIndex:
        if device not in self.index:
            self.index[device] = TreeIndex.build(self.tree.parents, self.kernel, device)
        return self.index[device]


class _TreeGDN(nn.Module):
    """Stands in for one GDN module during an exact verify pass (same call signature)."""

    def __init__(self, gdn: nn.Module, layer_idx: int, tree_pass: TreePass):
        super().__init__()
        object.__setattr__(self, "gdn", gdn)  # not registered: the stand-in owns no parameters
        self.layer_idx = layer_idx
        object.__setattr__(self, "tree_pass", tree_pass)

    def forward(self, hidden_states, cache=None, attention_mask=None, **kwargs):
        layer_cache = cache.layers[self.layer_idx]
        conv, rec = layer_cache.conv_states[0], layer_cache.recurrent_states[0]
        tp = self.tree_pass
        index = tp.index_on(hidden_states.device)
        with _weights_present(self.gdn, self.gdn.conv1d):
            if tp.reference:
                out, stash = tree_gdn_forward_reference(self.gdn, hidden_states, conv, rec, tp.tree.parents)
            else:
                out, stash = tree_gdn_forward(self.gdn, hidden_states, conv, rec, index)
        tp.stash[self.layer_idx] = stash
        return out


@contextmanager
def _weights_present(*modules):
    """Fire accelerate's hooks of modules whose weights we read directly (the GDN's own A_log / dt_bias, its
    conv1d): with offloading they only reach the execution device when the module itself is called."""
    hooks = [(m, getattr(m, "_hf_hook", None)) for m in modules]
    for module, hook in hooks:
        if hook is not None:
            hook.pre_forward(module)
    try:
        yield
    finally:
        for module, hook in reversed(hooks):
            if hook is not None:
                hook.post_forward(module, None)


@contextmanager
def tree_exact_gdn(target, tree_pass: TreePass):
    """Swap every GDN module for its tree-exact stand-in for the duration of one pass."""
    layers = decoder_layers(target)
    swapped = []
    try:
        for idx, gdn in gdn_modules(target).items():
            layers[idx].linear_attn = _TreeGDN(gdn, idx, tree_pass)
            swapped.append((idx, gdn))
        yield
    finally:
        for idx, gdn in swapped:
            layers[idx].linear_attn = gdn


@dataclass
class VerifyResult:
    logits: torch.Tensor  # [T, vocab] fp32
    hidden_states: tuple | None  # per layer [1, T, hidden] (for the drafter's context features)
    tree_pass: TreePass | None  # exact mode: GDN stash + tree index for the commit


def input_device(target) -> torch.device:
    return target.get_input_embeddings().weight.device


def device_sync(*models):
    """A function that waits for every CUDA device the models' weights live on (a target split over GPUs by
    device_map runs on several; torch.cuda.synchronize() alone waits for the current one only)."""
    devices = sorted({p.device.index or 0 for m in models if m is not None for p in m.parameters() if p.device.type == "cuda"})
    if not devices:
        return lambda: None

    def sync():
        for d in devices:
            torch.cuda.synchronize(d)

    return sync


def verify_tree(
    target, cache, tree: DraftTree, committed_len: int, mode: str = EXACT, *, want_hidden: bool = True,
    reference_gdn: bool = False,
) -> VerifyResult:
    """One target forward over [root, nodes...] against the committed cache."""
    device = input_device(target)
    dtype = target.get_input_embeddings().weight.dtype
    input_ids, position_ids, mask = verify_inputs(tree, committed_len, dtype, device)
    kwargs = dict(
        input_ids=input_ids, position_ids=position_ids, attention_mask=mask, cache=cache, use_cache=True,
        output_hidden_states=want_hidden,
    )
    tree_pass = None
    if mode == EXACT:
        gdn = gdn_modules(target)
        kernel = next(iter(gdn.values())).conv_kernel_size if gdn else 1
        tree_pass = TreePass(tree, kernel, reference=reference_gdn)
        with tree_exact_gdn(target, tree_pass), sdpa_backends(device):
            out = target(**kwargs)
    elif mode == NAIVE:
        with sdpa_backends(device):
            out = target(**kwargs)
    else:
        raise ValueError(f"unknown verify mode {mode!r}")
    return VerifyResult(out.logits[0].float(), out.hidden_states if want_hidden else None, tree_pass)


def commit(cache, tree: DraftTree, accepted: list[int], result: VerifyResult) -> None:
    """Keep the committed prefix + accepted path in every layer; drop the rest."""
    compact_kv(cache, len(tree), accepted)
    if result.tree_pass is not None:  # exact: GDN layers get the accepted path's state
        commit_gdn(cache, result.tree_pass.stash, result.tree_pass.index, accepted)
    # naive: GDN layers keep whatever the flattened pass left (the known bug)
