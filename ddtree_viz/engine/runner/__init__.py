"""A static-shape runner for a Qwen3.5 hybrid target on one device: the engine's fast GPU path.

transformers' forward grows its cache with torch.cat and launches a few thousand small kernels per token from
Python; on a 27B model that is ~11x the time the GPU needs to read the weights once. The runner keeps the same
arithmetic (the target's own projections and MLPs, the tree-exact GDN of gdn_tree.py and kernels/) but over
preallocated state, one stacked tensor per kind so that the commit is a few batched kernels:

    keys / values  [attn_layers, kv_heads, max_len, head_dim] (rows past `committed` are scratch)
    conv           [gdn_layers, C, kernel] (raw inputs, oldest first)
    recurrent      [gdn_layers, H, K, V] fp32

and two shape-static functions, captured as CUDA graphs per tree size and attention length bucket:

    forward(T):  tokens [T], positions [T], ancestor mask [T, T], conv windows [T, kernel]
                 -> logits [T, vocab] (fp32) and the drafter's context features [T, F].
                 Attention rows of the tree are written at committed .. committed+T-1 and each row sees the
                 committed prefix plus its ancestors, over the smallest power-of-two bucket of rows that holds
                 them; GDN layers run the tree delta rule's form (gdn_forms.py: the one-step recurrence
                 when T = 1) and leave the state untouched (their per-node k, g, delta and raw conv inputs are kept
                 for the commit).
    commit(T):   accepted path [P] (padded), its length -> attention rows moved into place, every GDN layer's
                 recurrent state advanced along the path at once (closed form of kernels/gdn_tree/parallel.state_after)
                 and its conv window taken at the path's last node; committed += length.
    walk(T):     the target's choices [T] -> the accepted path, its length and the bonus token (tree.follow_on_device
                 over the staged tree), written into the commit's inputs on the device: `commit_walk` replays it,
                 then the commit, and reads the path back once both are queued.

Each layer kind is written once, from engine/fused.py's pure pieces, which run as they are or through
torch.compile (`Pieces`: gpt-fast's habit, one function either way). Greedy decoding is the one-node tree (T = 1,
path [0]), so greedy and DDTree run the same code. The runner is driven through engines.RunnerEngine
(DecodeSession, EngineGreedy), which also sizes it. The prefill runs transformers' own forward once and copies its
cache in. The tree size T is padded up to the nearest captured size with inert nodes (children of the root that
nothing descends from).

The parts, one module each (a lower one never imports a higher):

    options.py   PARTS: the runner's parts (a Part each: its choices, its default, what a value means on a
                 device); RunnerForms: the forms a runner computes with, each part's default or a forced form
    buffers.py   State: the committed state, sized once; Slot: a tree size's and bucket's static inputs and
                 outputs, the host's and the device's staging of a tree and a path into them
    layers.py    StaticModel: forward, commit and walk of a slot, each layer kind once (what a graph captures)
    capture.py   a slot's CUDA graphs captured and replayed; a static tree's staging as a graph; a replay timed
    autotune.py  Forms: the kernel forms chosen at construction; Tuner: the GEMM library and the MLP's gate+up
                 form per tree size, measured once a process; the compiled pieces' warm-up
    core.py      StaticRunner: the parts composed, and what the engine calls (prefill, forward, commit, the walk,
                 the launch ahead, the state's records)
"""

from .autotune import BLAS_LIBRARIES, COMPILED_GATED_NORM, GATE_UP_GAIN, blas_library, pick_gate_up
from .core import PREFILL_CHUNK, StaticRunner
from .layers import NORM_KINDS, gate_up
from .options import ATTENTION_KINDS, BLAS_CHOICES, GATE_UP_CHOICES, GATE_UP_FORMS, PARTS, Part, RunnerForms

__all__ = [
    "ATTENTION_KINDS", "BLAS_CHOICES", "BLAS_LIBRARIES", "COMPILED_GATED_NORM", "GATE_UP_CHOICES", "GATE_UP_FORMS",
    "GATE_UP_GAIN", "NORM_KINDS", "PARTS", "PREFILL_CHUNK", "Part", "RunnerForms", "StaticRunner", "blas_library",
    "gate_up", "pick_gate_up",
]
