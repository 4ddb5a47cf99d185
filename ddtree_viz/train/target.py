"""The embedded target: a small ``qwen3_5_text`` model (transformers ``Qwen3_5ForCausalLM``).

Shape follows Qwen3.6-27B's text config in miniature: 8 layers = 2 x (3 Gated DeltaNet
"linear_attention" + 1 gated "full_attention"), grouped value heads in the DeltaNet layers
(2 key heads : 6 value heads, as 16 : 48), partial rotary (25 % of head_dim 64 = 16 dims) with
interleaved M-RoPE (mrope_section [3, 3, 2] sums to 16 / 2), tied embeddings.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from .data import log
from .optim import Optimiser, autocast, round_weights_

TARGET_SHAPE = dict(
    hidden_size=256,
    intermediate_size=704,
    num_hidden_layers=8,
    full_attention_interval=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    linear_num_key_heads=2,
    linear_num_value_heads=6,
    linear_key_head_dim=64,
    linear_value_head_dim=64,
    linear_conv_kernel_dim=4,
    hidden_act="silu",
    rms_norm_eps=1e-6,
    max_position_embeddings=2048,
    tie_word_embeddings=True,
    rope_parameters={
        "rope_type": "default",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [3, 3, 2],
        "mrope_interleaved": True,
    },
)


def target_config(vocab_size: int, eos_token_id: int = 0, **overrides):
    from transformers import Qwen3_5TextConfig

    kw = {**TARGET_SHAPE, **overrides}
    interval = kw.pop("full_attention_interval")
    n = kw["num_hidden_layers"]
    kw["layer_types"] = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)]
    cfg = Qwen3_5TextConfig(vocab_size=vocab_size, eos_token_id=eos_token_id, bos_token_id=None,
                            pad_token_id=None, **kw)
    cfg.architectures = ["Qwen3_5ForCausalLM"]
    return cfg


def save_target(model, out_dir: str | Path, dtype: str = "bfloat16") -> None:
    """config.json (dtype float32: the default load is float32), generation_config.json and
    model.safetensors with the weights rounded to ``dtype`` (tied lm_head not stored)."""
    import torch
    from safetensors.torch import save_file
    from transformers import GenerationConfig

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = model.config
    cfg.dtype = "float32"
    cfg.architectures = ["Qwen3_5ForCausalLM"]
    cfg.save_pretrained(out_dir)
    GenerationConfig(eos_token_id=cfg.eos_token_id, pad_token_id=cfg.eos_token_id, do_sample=False,
                     max_new_tokens=64).save_pretrained(out_dir)
    sd = model.state_dict()
    if cfg.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    tensors = {k: v.detach().to(getattr(torch, dtype)).contiguous().cpu() for k, v in sd.items()}
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})


def load_target(path: str | Path, device="cpu", dtype=None):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype or torch.float32)
    return model.to(device).eval()


def held_out_loss(model, stream: np.ndarray, seq_len: int, n_windows: int, batch: int, device) -> float:
    """Mean next-token cross-entropy (nats) over fixed, evenly spaced windows of the held-out stream."""
    import torch
    import torch.nn.functional as F

    starts = np.linspace(0, stream.size - seq_len - 1, n_windows).astype(np.int64)
    total, count = 0.0, 0
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for i in range(0, len(starts), batch):
            x = torch.from_numpy(np.stack([stream[s:s + seq_len + 1].astype(np.int64) for s in starts[i:i + batch]]))
            x = x.to(device)
            with autocast(device):
                logits = model(input_ids=x[:, :-1], use_cache=False).logits
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1),
                                   reduction="sum")
            total += loss.item()
            count += x[:, 1:].numel()
    model.train(was_training)
    return total / count


def train_target(tokens: dict, vocab_size: int, out_dir: str | Path, device, *, seed: int = 0,
                 seq_len: int = 1024, batch: int = 32, lr: float = 2e-3, weight_decay: float = 0.1,
                 warmup: int = 30, steps: int | None = None, time_budget_s: float | None = None,
                 eval_every: int = 200, eval_windows: int = 64, store_dtype: str = "bfloat16",
                 max_steps: int = 100_000, doc_start_frac: float = 0.0) -> dict:
    """Next-token training on windows of the train stream: a ``doc_start_frac`` share of each batch starts
    at the beginning of a file (so that the model sees how files begin, as a short prompt does), the rest
    anywhere. Returns a summary dict."""
    import torch
    import torch.nn.functional as F
    from transformers import Qwen3_5ForCausalLM

    torch.manual_seed(seed)
    gen = np.random.default_rng(seed)
    cfg = target_config(vocab_size)
    model = Qwen3_5ForCausalLM(cfg).to(device)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    log(f"target: {n_params:,} parameters, layer_types={cfg.layer_types}")
    optim = Optimiser(model.parameters(), device, lr=lr, weight_decay=weight_decay, warmup=warmup)
    train = torch.from_numpy(tokens["train"].astype(np.int64)).to(device)
    doc_starts = tokens["train_doc_offsets"]
    doc_starts = doc_starts[doc_starts < train.numel() - seq_len - 1]
    n_doc = int(round(batch * doc_start_frac))
    optim.start_budget(steps, time_budget_s, max_steps=max_steps)
    history = []
    t0 = time.time()
    step = 0
    ema = None
    while step < optim.total:
        optim.set_lr(step)
        starts = np.concatenate([gen.choice(doc_starts, size=n_doc),
                                 gen.integers(0, train.numel() - seq_len - 1, size=batch - n_doc)])
        starts = torch.from_numpy(starts).to(device)
        idx = starts[:, None] + torch.arange(seq_len + 1, device=device)[None]
        x = train[idx]
        with autocast(device):
            logits = model(input_ids=x[:, :-1], use_cache=False).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        gnorm = optim.step(step, loss)
        if step % 25 == 0 or step + 1 == optim.total:
            lv = loss.item()
            ema = lv if ema is None else 0.9 * ema + 0.1 * lv
            log(f"target step {step:5d}/{optim.total} loss {lv:.4f} gnorm {gnorm.item():.2f} lr {optim.lr:.2e}")
        if (step + 1) % eval_every == 0 or step + 1 == optim.total:
            ev = held_out_loss(model, tokens["eval"], seq_len, eval_windows, batch, device)
            history.append({"step": step + 1, "train_loss": loss.item(), "eval_loss": ev,
                            "elapsed_s": time.time() - t0})
            log(f"target step {step + 1}: held-out loss {ev:.4f} nats/token")
        step += 1
    wall = time.time() - t0
    round_weights_(model, store_dtype)
    ev_rounded = held_out_loss(model, tokens["eval"], seq_len, eval_windows, batch, device)
    log(f"target trained: {step} steps in {wall:.0f}s; held-out loss after {store_dtype} rounding {ev_rounded:.4f}")
    save_target(model, out_dir, store_dtype)
    summary = {"params": n_params, "steps": step, "seq_len": seq_len, "batch": batch, "lr": lr,
               "weight_decay": weight_decay, "warmup": warmup, "seed": seed, "wall_s": wall,
               "doc_start_frac": doc_start_frac,
               "tokens_seen": step * batch * seq_len, "history": history,
               "eval_loss_rounded": ev_rounded, "store_dtype": store_dtype}
    return summary


SHARD_BYTES = 6 * 2**20  # keeps every committed weight file well under 8 MiB


def write_sharded(src: Path, out_dir: Path, max_bytes: int = SHARD_BYTES) -> list[str]:
    """Rewrite one safetensors file as transformers' sharded layout (model-0000k-of-0000n.safetensors +
    model.safetensors.index.json), tensors in sorted order, unchanged. Returns the file names written."""
    import json

    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    with safe_open(str(src), "pt") as f:
        metadata = f.metadata() or {"format": "pt"}
    tensors = load_file(str(src))
    shards, current, size = [], {}, 0
    for key in sorted(tensors):
        n = tensors[key].numel() * tensors[key].element_size()
        if current and size + n > max_bytes:
            shards.append(current)
            current, size = {}, 0
        current[key] = tensors[key]
        size += n
    shards.append(current)
    names, weight_map = [], {}
    for i, shard in enumerate(shards, 1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out_dir / name), metadata=metadata)
        names.append(name)
        weight_map.update({k: name for k in shard})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return names + ["model.safetensors.index.json"]
