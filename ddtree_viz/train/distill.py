"""Drafter training data and the DFlash block-diffusion objective.

1. ``greedy_generate``: prompts are windows of the *train* stream that start after a newline;
   the (frozen, bf16-rounded, float32-computed) target continues each greedily. Decoding does not
   stop at ``<|endoftext|>`` (the target then starts a new file, which is its own greedy behaviour).
2. ``train_drafter``: per sequence, the target's context features (``hidden_states[i + 1]`` for
   ``i`` in ``target_layer_ids``) are computed once; many anchors ``a`` are sampled in the
   generated part and each becomes one block ``[tok[a], MASK x (B-1)]`` at positions
   ``a .. a+B-1``. A block sees the context features at positions ``< a`` and its own B entries
   (non-causal), nothing of the other blocks: all blocks of a sequence go through the drafter in
   one pass under that attention mask. Block entry ``i >= 1`` is trained with cross-entropy
   against ``tok[a + i]`` (the target's own greedy token), weighted ``exp(-(i - 1) / gamma)``.
   The drafter embeds with the target's (frozen) input embeddings and projects with its lm_head.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from .data import log
from .optim import Optimiser, autocast, round_weights_


# ------------------------------------------------------------------------- greedy data
def sample_prompts(stream: np.ndarray, doc_offsets: np.ndarray, n: int, prompt_len: int, newline_ids: set[int],
                   seed: int, min_right: int = 0) -> np.ndarray:
    from .data import line_start_offsets

    cand = line_start_offsets(stream, doc_offsets, newline_ids, 0, prompt_len + min_right)
    rng = np.random.default_rng(seed)
    starts = np.sort(rng.choice(cand, size=n, replace=cand.size < n))
    return np.stack([stream[s:s + prompt_len].astype(np.int64) for s in starts])


def greedy_generate(model, prompts, new_tokens: int, batch: int = 1024):
    """Plain greedy decoding with transformers' hybrid ``DynamicCache`` (no early stop)."""
    import torch
    from transformers import DynamicCache

    outs = []
    device = next(model.parameters()).device
    with torch.no_grad():
        for i in range(0, prompts.shape[0], batch):
            x = prompts[i:i + batch].to(device)
            cache = DynamicCache(config=model.config)
            logits = model(input_ids=x, cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1]
            seq = [x]
            for _ in range(new_tokens):
                nxt = logits.argmax(-1, keepdim=True)
                seq.append(nxt)
                if len(seq) - 1 == new_tokens:
                    break
                logits = model(input_ids=nxt, cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1]
            outs.append(torch.cat(seq, dim=1).cpu())
    return torch.cat(outs)


def newline_token_ids(tok) -> set[int]:
    """Ids of tokens whose decoded text ends with a newline."""
    ids = set()
    for t, i in tok.get_vocab().items():
        if tok.decode([i]).endswith("\n"):
            ids.add(i)
    return ids


# ------------------------------------------------------------------------- drafter
def drafter_config(target_cfg, *, num_layers: int = 3, block_size: int = 16, mask_token_id: int = 1,
                   target_layer_ids=(1, 3, 5, 6), intermediate_size: int = 704, num_heads: int = 4,
                   num_kv_heads: int = 2, head_dim: int = 64, rope_theta: float = 10000.0,
                   dflash2: dict | None = None):
    """The drafter's config: DFlash, or with `dflash2` (its dflash_config fields: conv_group_size, conv_kernel_size,
    selector_rank, selector_top_k) a DFlash2 drafter's."""
    from ddtree_viz.engine.dflash2 import DFlash2Config
    from ddtree_viz.engine.drafter import DFlashConfig

    return (DFlashConfig if dflash2 is None else DFlash2Config).from_dict({
        "hidden_size": target_cfg.hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "head_dim": head_dim,
        "vocab_size": target_cfg.vocab_size,
        "rms_norm_eps": target_cfg.rms_norm_eps,
        "rope_theta": rope_theta,
        "max_position_embeddings": target_cfg.max_position_embeddings,
        "attention_bias": False,
        "hidden_act": "silu",
        "layer_types": ["full_attention"] * num_layers,
        "sliding_window": None,
        "num_target_layers": target_cfg.num_hidden_layers,
        "block_size": block_size,
        "dflash_config": {"block_size": block_size, "mask_token_id": mask_token_id,
                          "target_layer_ids": list(target_layer_ids), **(dflash2 or {})},
    })


def init_drafter_(drafter, std: float = 0.02) -> None:
    """Matrices normal(0, std), norms 1, the rest 0; a DFlash2 drafter's convolutions start as the identity (base tap
    1 at offset 0, 0 elsewhere; the dynamic taps near 0), so it starts as the DFlash drafter it extends."""
    import torch

    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if name.endswith("base_kernel"):
                p.zero_()
                p[:, 0] = 1.0
            elif p.dim() >= 2:
                p.normal_(0.0, std)
            elif "norm" in name:
                p.fill_(1.0)
            else:
                p.zero_()


def target_features(target, ids, layer_ids):
    """Context features [B, T, n*H] (float32) of the frozen target over ``ids`` [B, T]."""
    import torch
    from ddtree_viz.engine.drafter import extract_context_features

    with torch.no_grad():
        out = target.model(input_ids=ids, use_cache=False, output_hidden_states=True)
    return extract_context_features(out.hidden_states, layer_ids)


def block_batch(ids, anchors, block_size: int, mask_token_id: int):
    """Block inputs, labels, positions and the attention mask for ``anchors`` [S, K] into ``ids`` [S, T].

    Returns block_ids [S, K*B], labels [S, K*B] (-100 at block entry 0), position_ids [S, T+K*B],
    mask [S, 1, K*B, T+K*B] (bool, True = visible).
    """
    import torch

    S, T = ids.shape
    K = anchors.shape[1]
    B = block_size
    dev = ids.device
    offs = torch.arange(B, device=dev)
    pos = anchors[:, :, None] + offs[None, None]                     # [S, K, B]
    block_ids = torch.full((S, K, B), mask_token_id, dtype=ids.dtype, device=dev)
    block_ids[:, :, 0] = torch.gather(ids, 1, anchors)
    labels = torch.gather(ids, 1, pos.clamp(max=T - 1).reshape(S, -1)).reshape(S, K, B).clone()
    labels[:, :, 0] = -100
    labels[pos >= T] = -100
    ctx_pos = torch.arange(T, device=dev)
    position_ids = torch.cat([ctx_pos[None].expand(S, T), pos.reshape(S, K * B)], dim=1)
    ctx_visible = ctx_pos[None, None, :] < anchors[:, :, None]        # [S, K, T]
    ctx_visible = ctx_visible[:, :, None, :].expand(S, K, B, T).reshape(S, K * B, T)
    blk = torch.arange(K, device=dev).repeat_interleave(B)
    blk_visible = (blk[:, None] == blk[None, :])[None].expand(S, K * B, K * B)
    mask = torch.cat([ctx_visible, blk_visible], dim=-1)[:, None]
    return block_ids.reshape(S, K * B), labels.reshape(S, K * B), position_ids, mask


def drafter_logits(drafter, target, feats, block_ids, position_ids, mask):
    return drafter_outputs(drafter, target, feats, block_ids, position_ids, mask)[0]


def drafter_outputs(drafter, target, feats, block_ids, position_ids, mask):
    """The drafter's logits (compute_logits: output_multiplier and soft-capping where its config sets them) and its
    normed hidden states, over packed blocks."""
    noise = target.get_input_embeddings()(block_ids)
    out = drafter(noise, feats.to(noise.dtype), position_ids, attention_mask=mask)
    return drafter.compute_logits(target.get_output_embeddings()(out)), out


def selector_loss(drafter, hidden, logits, block_ids, labels, block_size: int):
    """A DFlash2 drafter's candidate selector, trained teacher-forced: at each block position whose true token is
    among the drafter's top-K, cross-entropy over the K candidates of S_t(true previous token, b) (the previous token
    is the root at depth 1). The unary scores are detached: the block-diffusion loss trains the logits. Returns
    (loss, positions counted)."""
    import torch
    import torch.nn.functional as F

    sel = drafter.candidate_selector
    S, L = labels.shape
    true = labels.clone()
    entry0 = torch.arange(L, device=labels.device) % block_size == 0
    true[:, entry0] = block_ids[:, entry0]
    prev = torch.full_like(true, -100)
    prev[:, 1:] = true[:, :-1]
    unary, ids = torch.topk(logits.float().detach(), drafter.config.selector_top_k, dim=-1)  # [S, L, K]
    query = sel.predecessor_codebook[prev.clamp(min=0)] * sel.hidden_projection(hidden)  # [S, L, R]
    pair = unary + torch.einsum("slr,slkr->slk", query.float(), sel.successor_codebook[ids].float())
    hit = ids == labels[..., None]
    valid = hit.any(-1) & (labels != -100) & (prev >= 0) & ~entry0[None]
    if not bool(valid.any()):
        return pair.sum() * 0.0, 0
    return F.cross_entropy(pair[valid], hit[valid].float().argmax(-1)), int(valid.sum())


def position_weights(block_size: int, gamma: float, device):
    import torch

    i = torch.arange(block_size, device=device, dtype=torch.float32)
    w = torch.exp(-(i - 1).clamp(min=0) / gamma)
    w[0] = 0.0
    return w


def chain_acceptance(pred, labels, block_size: int):
    """Teacher-forced DFlash chain acceptance per block: leading matches + 1 (the bonus)."""
    import torch

    S, KB = labels.shape
    p = pred.reshape(S, -1, block_size)[:, :, 1:]
    y = labels.reshape(S, -1, block_size)[:, :, 1:]
    ok = (p == y) & (y != -100)
    lead = torch.cumprod(ok.long(), dim=-1).sum(-1)
    valid = (y[:, :, 0] != -100)
    return (lead.float() + 1)[valid]


def sample_anchors(prompt_lens: np.ndarray, last: int, count: int, gen: np.random.Generator) -> np.ndarray:
    """``count`` distinct anchors per row, sorted, from the row's first generated token (its prompt length) to
    ``last`` (the last position that still has a full block after it). Returns [rows, count] int64."""
    return np.sort(np.stack([gen.choice(last - p + 1, size=count, replace=False) + p for p in prompt_lens]), axis=1)


def train_drafter(target, greedy, prompt_lens, out_dir: str | Path, device, *, seed: int = 0,
                  num_layers: int = 3, block_size: int = 16, mask_token_id: int = 1,
                  target_layer_ids=(1, 3, 5, 6), batch: int = 32, anchors: int = 32, lr: float = 2e-3,
                  weight_decay: float = 0.01, warmup: int = 30, gamma: float = 7.0, steps: int | None = None,
                  time_budget_s: float | None = None, val_frac: float = 0.02, store_dtype: str = "bfloat16",
                  precompute_features: bool = False, deadline: float | None = None,
                  init_from: str | Path | None = None, dflash2: dict | None = None) -> dict:
    """Train a DFlash drafter on the target's greedy sequences ``greedy`` [N, T], whose first
    ``prompt_lens[i]`` tokens are the prompt. ``dflash2`` (its dflash_config fields): a DFlash2 drafter, its
    selector trained beside the block-diffusion objective (selector_loss)."""
    import torch

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    cfg = drafter_config(target.config, num_layers=num_layers, block_size=block_size,
                         mask_token_id=mask_token_id, target_layer_ids=target_layer_ids, dflash2=dflash2)
    drafter = _new_drafter(cfg, device, init_from)
    drafter.train()
    for p in target.parameters():
        p.requires_grad_(False)
    n_params = sum(p.numel() for p in drafter.parameters())
    log(f"drafter: {n_params:,} parameters, {num_layers} layers, block {block_size}, "
        f"target_layer_ids {list(target_layer_ids)}")
    optim = Optimiser(drafter.parameters(), device, lr=lr, weight_decay=weight_decay, warmup=warmup)
    greedy = greedy.to(device)
    N, T = greedy.shape
    n_val = max(batch, int(N * val_frac))
    perm = torch.from_numpy(rng.permutation(N)).to(device)
    val_idx, train_idx = perm[:n_val], perm[n_val:]
    prompt_lens = torch.as_tensor(prompt_lens).cpu().numpy()
    blocks = _Blocks(drafter, target, greedy, prompt_lens, device, block_size=block_size, mask_token_id=mask_token_id,
                     anchors=anchors, layer_ids=target_layer_ids)
    if precompute_features:
        blocks.precompute_features()
    if time_budget_s is not None and deadline is not None:
        time_budget_s = max(60.0, min(time_budget_s, deadline - time.time()))
        log(f"drafter: time budget {time_budget_s:.0f}s")
    optim.start_budget(steps, time_budget_s)
    step, history, wall = _train_steps(blocks, optim, train_idx, val_idx, batch=batch, gamma=gamma, seed=seed)
    round_weights_(drafter, store_dtype)
    final = blocks.evaluate(val_idx, batch, seed)
    log(f"drafter trained: {step} steps in {wall:.0f}s; val chain acceptance after {store_dtype} rounding "
        f"{final['chain_acceptance']:.3f}")
    out_dir = Path(out_dir)
    drafter.to(getattr(torch, store_dtype)).save_pretrained(out_dir)
    summary = {"params": n_params, "steps": step, "init_from": str(init_from) if init_from else None, "batch": batch, "anchors_per_seq": anchors, "lr": lr,
               "weight_decay": weight_decay, "warmup": warmup, "gamma": gamma, "seed": seed, "wall_s": wall,
               "sequences": N, "seq_len": T, "prompt_lens": sorted({int(p) for p in prompt_lens}), "val_sequences": n_val,
               "history": history, "final": final, "store_dtype": store_dtype}
    drafter.float()
    return summary


def _new_drafter(cfg, device, init_from: str | Path | None):
    """A drafter of config ``cfg``: freshly initialised, or continued from ``init_from``'s weights (same config)."""
    import torch
    from ddtree_viz.engine.dflash2 import DFlash2Config, DFlash2Drafter
    from ddtree_viz.engine.drafter import DFlashDrafter
    from ddtree_viz.engine.models import drafter_class

    family = DFlash2Drafter if isinstance(cfg, DFlash2Config) else DFlashDrafter
    if init_from and family is DFlash2Drafter and drafter_class(Path(init_from)) is DFlashDrafter:
        return pack_blocks(warm_start_dflash2(cfg, init_from, device), cfg.block_size)
    if init_from:
        drafter = family.from_pretrained(init_from, dtype=torch.float32, device=device)
        if drafter.config != cfg:
            raise ValueError(f"--init-draft {init_from} has another config: {drafter.config} != {cfg}")
        log(f"drafter: continuing from {init_from}")
        return pack_blocks(drafter, cfg.block_size)
    drafter = family(cfg).to(device)
    init_drafter_(drafter)
    return pack_blocks(drafter, cfg.block_size)


def warm_start_dflash2(cfg, dflash_dir: str | Path, device):
    """A DFlash2 drafter of config ``cfg`` that starts as the DFlash drafter in ``dflash_dir``: every weight the two
    share (fc, hidden_norm, norm, and the first ``cfg.num_hidden_layers`` layers' attention, MLP and norms) copied,
    the convolutions as the identity and the candidate selector fresh (init_drafter_). A weight the DFlash drafter
    has in another shape is refused by name; its layers past the DFlash2 drafter's are left out (logged)."""
    import torch
    from ddtree_viz.engine.dflash2 import DFlash2Drafter
    from ddtree_viz.engine.drafter import DFlashDrafter

    source = DFlashDrafter.from_pretrained(dflash_dir, dtype=torch.float32, device=device).state_dict()
    drafter = DFlash2Drafter(cfg).to(device)
    init_drafter_(drafter)
    own = drafter.state_dict()
    shared = {k: v for k, v in source.items() if k in own}
    wrong = [f"{k} {tuple(v.shape)} vs {tuple(own[k].shape)}" for k, v in shared.items() if v.shape != own[k].shape]
    if wrong:
        raise ValueError(f"--init-draft {dflash_dir}: weights of another shape: {', '.join(wrong)}")
    drafter.load_state_dict(shared, strict=False)
    fresh = sorted({k.split(".")[2] if k.startswith("layers.") else k.split(".")[0] for k in own if k not in shared})
    log(f"drafter: DFlash2 warm-started from the DFlash drafter {dflash_dir}: {len(shared)} of {len(own)} tensors "
        f"copied, fresh: {', '.join(fresh)}; left out: {len(set(source) - set(own))} tensors of its later layers")
    return drafter


def pack_blocks(drafter, block_size: int):
    """A DFlash2 drafter's convolutions see one block of `block_size` at a time in rows of packed blocks
    (block_batch's; dflash2.py: segment). Nothing to do for a DFlash drafter."""
    for module in drafter.modules():
        if hasattr(module, "segment"):
            module.segment = block_size
    return drafter


class _Blocks:
    """The drafter's batches: blocks at anchors drawn in the generated part of the greedy sequences [N, T], the
    target's context features for them (computed per batch, or once for all: precompute_features), the drafter's
    logits under autocast, and its validation figures."""

    def __init__(self, drafter, target, greedy, prompt_lens: np.ndarray, device, *, block_size: int,
                 mask_token_id: int, anchors: int, layer_ids):
        self.drafter, self.target, self.greedy, self.device = drafter, target, greedy, device
        self.prompt_lens, self.anchors, self.layer_ids = prompt_lens, anchors, layer_ids
        self.block_size, self.mask_token_id = block_size, mask_token_id
        self.hi = greedy.shape[1] - block_size  # anchors: first generated token .. last full block
        self.amp = autocast(device)
        self.feats = None  # [N, T, n*H] bf16 when precomputed

    def precompute_features(self) -> None:
        """Context features of every sequence, once (bf16: the drafter runs under bf16 autocast)."""
        import torch

        t_feat = time.time()
        N, T = self.greedy.shape
        n_feat = len(self.layer_ids) * self.target.config.hidden_size
        self.feats = torch.empty(N, T, n_feat, dtype=torch.bfloat16, device=self.device)
        for i in range(0, N, 64):
            features = target_features(self.target, self.greedy[i:i + 64], self.layer_ids)
            self.feats[i:i + 64] = features.to(torch.bfloat16)
        log(f"drafter: context features of {N} sequences precomputed in {time.time() - t_feat:.0f}s "
            f"({self.feats.numel() * 2 / 2**30:.1f} GiB)")

    def forward(self, rows, gen):
        """Drafter logits, labels, hidden states and block ids of the sequences ``rows``, at anchors drawn with
        ``gen``."""
        import torch

        ids = self.greedy[rows]
        a = torch.from_numpy(sample_anchors(self.prompt_lens[rows.cpu().numpy()], self.hi, self.anchors, gen))
        a = a.to(self.device)
        feats = self.feats[rows] if self.feats is not None else target_features(self.target, ids, self.layer_ids)
        bi, lab, pos, mask = block_batch(ids, a, self.block_size, self.mask_token_id)
        with self.amp:
            logits, hidden = drafter_outputs(self.drafter, self.target, feats, bi, pos, mask)
        return logits, lab, hidden, bi

    def evaluate(self, val_idx, batch: int, seed: int) -> dict:
        """Chain acceptance and cross-entropy on the validation sequences (anchors drawn with seed + 1)."""
        import torch
        import torch.nn.functional as F

        self.drafter.eval()
        gen = np.random.default_rng(seed + 1)
        accs, losses = [], []
        with torch.no_grad():
            for i in range(0, len(val_idx), batch):
                logits, lab, _, _ = self.forward(val_idx[i:i + batch], gen)
                accs.append(chain_acceptance(logits.argmax(-1), lab, self.block_size))
                ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), lab.reshape(-1),
                                     ignore_index=-100)
                losses.append(ce.item())
        self.drafter.train()
        acc = torch.cat(accs)
        return {"chain_acceptance": acc.mean().item(), "ce": float(np.mean(losses)),
                "accept_hist": torch.bincount(acc.long(), minlength=self.block_size + 1).tolist()}


def _train_steps(blocks: _Blocks, optim, train_idx, val_idx, *, batch: int, gamma: float, seed: int):
    """The optimisation steps (batches drawn with seed + 2), validated every 500 steps and at the end. Returns
    (steps taken, the validation history, wall seconds)."""
    import torch
    import torch.nn.functional as F

    block_size, device = blocks.block_size, blocks.device
    w = position_weights(block_size, gamma, device)
    history = []
    t0 = time.time()
    step = 0
    gen = np.random.default_rng(seed + 2)
    while step < optim.total:
        optim.set_lr(step)
        rows = train_idx[torch.from_numpy(gen.integers(0, train_idx.numel(), size=batch)).to(device)]
        logits, lab, hidden, block_ids = blocks.forward(rows, gen)
        ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), lab.reshape(-1),
                             ignore_index=-100, reduction="none").reshape(lab.shape[0], -1, block_size)
        wt = w[None, None, :] * (lab.reshape(ce.shape) != -100)
        loss = (ce * wt).sum() / wt.sum()
        if hasattr(blocks.drafter, "candidate_selector"):  # DFlash2: its selector beside the block objective
            with blocks.amp:
                loss = loss + selector_loss(blocks.drafter, hidden, logits, block_ids, lab, block_size)[0]
        gnorm = optim.step(step, loss)
        if step % 50 == 0:
            acc = chain_acceptance(logits.detach().argmax(-1), lab, block_size).mean().item()
            log(f"drafter step {step:5d}/{optim.total} loss {loss.item():.4f} "
                f"train-chain-accept {acc:.2f} gnorm {gnorm.item():.2f} lr {optim.lr:.2e}")
        if (step + 1) % 500 == 0 or step + 1 == optim.total:
            ev = blocks.evaluate(val_idx, batch, seed)
            ev.update(step=step + 1, elapsed_s=time.time() - t0)
            history.append(ev)
            log(f"drafter step {step + 1}: val chain acceptance {ev['chain_acceptance']:.3f} ce {ev['ce']:.3f}")
        step += 1
    return step, history, time.time() - t0
