"""Held-out evaluation: target loss, greedy samples, and simulated DDTree / DFlash acceptance.

The acceptance figures are computed offline, without the engine, from quantities that exact
DDTree reproduces by construction: in exact mode the target's argmax along the true path is its
greedy continuation, and the drafter's context is the target's hidden features of the committed
tokens. So, per round with anchor ``a`` (the last committed token, initially the first generated
one), the drafter sees features of positions ``< a`` and the block ``[tok[a], MASK...]``; DDTree
builds the best-first tree of ``budget`` nodes over its per-depth log-probabilities (as
``ddtree.py``: a node's score is the sum of log-softmax values along its rank path; popping a node
pushes its next sibling and its first child) and the round gains ``1 + m`` tokens, ``m`` the
deepest depth whose greedy prefix is a path of the tree. The chain (DFlash) keeps only the rank-0
path. The next anchor is ``a + m + 1``. Each budget follows its own trajectory.
"""

from __future__ import annotations

import heapq
import json
from pathlib import Path

import numpy as np

from .data import log

BUDGETS = (4, 8, 16, 32, 64, 128)


def best_first_rank_paths(logprobs: np.ndarray, budget: int) -> set[tuple[int, ...]]:
    """The nodes of the engine's best-first DDTree under ``budget``, simulated in rank space: each node is the
    tuple of its per-depth ranks (``(0, 2)``: the top token at depth 1, then the third at depth 2), the same
    selection as ``ddtree_viz.engine.tree.build_tree`` makes over the same sorted log-probabilities.
    ``logprobs`` [depth, k] sorted descending per depth.

    Not the engine's function: that one builds a ``DraftTree`` of token ids (parents, positions, masks) to
    verify; this one only needs which rank paths are in the tree, so that the acceptance of every anchor and
    budget over held-out sequences can be estimated offline, fast, without the target's verify pass.
    """
    depth, k = logprobs.shape
    tree: set[tuple[int, ...]] = set()
    heap = [(-float(logprobs[0, 0]), (0,))]
    while heap and len(tree) < budget:
        neg, path = heapq.heappop(heap)
        tree.add(path)
        d, r = len(path) - 1, path[-1]
        score = -neg
        if r + 1 < k:
            heapq.heappush(heap, (-(score - logprobs[d, r] + logprobs[d, r + 1]), path[:-1] + (r + 1,)))
        if d + 1 < depth:
            heapq.heappush(heap, (-(score + logprobs[d + 1, 0]), path + (0,)))
    return tree


def accepted_depth(tree: set[tuple[int, ...]], ranks: list[int]) -> int:
    m = 0
    for d in range(len(ranks)):
        if tuple(ranks[:d + 1]) in tree:
            m = d + 1
        else:
            break
    return m


def simulate(block_logprobs, greedy_tokens, prompt_len: int, block_size: int, budgets=BUDGETS, kmax: int = 128):
    """Per budget (and 'chain'): (tokens gained, rounds) over one sequence.

    ``block_logprobs[a]`` [B-1, V] are the drafter's log-probs for the block anchored at ``a``.
    """
    import torch

    T = len(greedy_tokens)
    last = T - block_size  # anchors with a full block of ground truth
    # per anchor: sorted top-k log-probs and the rank of the true token at each depth
    cache = {}

    def info(a):
        if a not in cache:
            lp = block_logprobs[a]
            top = torch.topk(lp, min(kmax, lp.shape[-1]), dim=-1)
            truth = torch.as_tensor(greedy_tokens[a + 1:a + block_size])
            rank = (lp > lp.gather(-1, truth[:, None])).sum(-1)  # strict: ties favour the truth
            cache[a] = (top.values.numpy(), rank.tolist())
        return cache[a]

    results = {}
    for name in ("chain",) + tuple(budgets):
        a, gained, rounds = prompt_len, 0, 0
        while a <= last:
            top, ranks = info(a)
            if name == "chain":
                m = 0
                while m < len(ranks) and ranks[m] == 0:
                    m += 1
            else:
                m = accepted_depth(best_first_rank_paths(top[:, :name], name), ranks)
            gained += m + 1
            rounds += 1
            a += m + 1
        results[name] = (gained, rounds)
    return results


def all_anchor_logprobs(drafter, target, ids, prompt_len: int, block_size: int, mask_token_id: int,
                        chunk: int = 64):
    """Drafter log-probs for every anchor ``prompt_len .. T-block_size`` of one sequence ``ids`` [T]."""
    import torch

    from .distill import block_batch, drafter_logits, pack_blocks, target_features

    pack_blocks(drafter, block_size)
    T = ids.shape[0]
    feats = target_features(target, ids[None], drafter.target_layer_ids)
    out = {}
    anchors = list(range(prompt_len, T - block_size + 1))
    with torch.no_grad():
        for i in range(0, len(anchors), chunk):
            a = torch.tensor(anchors[i:i + chunk], device=ids.device)[None]
            bi, lab, pos, mask = block_batch(ids[None], a, block_size, mask_token_id)
            logits = drafter_logits(drafter, target, feats, bi, pos, mask).float()
            lp = torch.log_softmax(logits, -1).reshape(a.shape[1], block_size, -1)[:, 1:].cpu()
            for j, anc in enumerate(anchors[i:i + chunk]):
                out[anc] = lp[j]
    return out


def repetition_stats(tokens: list[int]) -> dict:
    longest, run = 1, 1
    for x, y in zip(tokens, tokens[1:]):
        run = run + 1 if x == y else 1
        longest = max(longest, run)
    return {"distinct_frac": len(set(tokens)) / max(1, len(tokens)), "longest_single_token_run": longest}


def evaluate_pair(target, drafter, tok, tokens: dict, *, n_prompts: int = 32, prompt_len: int = 64,
                  new_tokens: int = 256, seed: int = 1234, budgets=BUDGETS, n_samples: int = 3,
                  out_json: str | Path | None = None, short_horizon: int = 64) -> dict:
    """Simulated DDTree acceptance on held-out prompts (eval split), plus target samples."""
    import torch

    from .distill import greedy_generate, newline_token_ids, sample_prompts
    from .target import held_out_loss

    device = next(target.parameters()).device
    nl = newline_token_ids(tok)
    prompts = torch.from_numpy(sample_prompts(tokens["eval"], tokens["eval_doc_offsets"], n_prompts, prompt_len,
                                              nl, seed))
    greedy = greedy_generate(target, prompts, new_tokens, batch=n_prompts).to(device)
    B = drafter.block_size
    totals = {k: [0, 0] for k in ("chain",) + tuple(budgets)}
    short = {k: [0, 0] for k in ("chain",) + tuple(budgets)}
    per_prompt = []
    for i in range(n_prompts):
        lps = all_anchor_logprobs(drafter, target, greedy[i], prompt_len, B, drafter.mask_token_id)
        res = simulate(lps, greedy[i].tolist(), prompt_len, B, budgets)
        per_prompt.append({k: v[0] / v[1] for k, v in res.items()})
        for k, (g, r) in res.items():
            totals[k][0] += g
            totals[k][1] += r
        # the first `short_horizon` generated tokens only (rounds anchored before that point)
        res = simulate(lps, greedy[i, :prompt_len + short_horizon + B - 1].tolist(), prompt_len, B, budgets)
        for k, (g, r) in res.items():
            short[k][0] += g
            short[k][1] += r
    acceptance = {str(k): g / r for k, (g, r) in totals.items()}
    acceptance_short = {str(k): g / r for k, (g, r) in short.items()}
    samples, reps = [], []
    for i in range(n_prompts):
        cont = greedy[i, prompt_len:].tolist()
        reps.append(repetition_stats(cont))
        if i < n_samples:
            samples.append({"prompt": tok.decode(greedy[i, :prompt_len].tolist()), "continuation": tok.decode(cont)})
    result = {
        "n_prompts": n_prompts, "prompt_len": prompt_len, "new_tokens": new_tokens, "seed": seed,
        "acceptance_tokens_per_round": acceptance,
        "acceptance_per_prompt_mean": {str(k): float(np.mean([p[k] for p in per_prompt])) for k in per_prompt[0]},
        f"acceptance_first_{short_horizon}_tokens": acceptance_short,
        "held_out_loss_nats": held_out_loss(target, tokens["eval"], 512, 64, 16, device),
        "continuation_distinct_token_frac_mean": float(np.mean([r["distinct_frac"] for r in reps])),
        "continuation_longest_single_token_run_max": int(max(r["longest_single_token_run"] for r in reps)),
        "samples": samples,
    }
    log("acceptance (tokens per target forward, bonus included): "
        + ", ".join(f"{k}={v:.2f}" for k, v in acceptance.items()))
    log(f"acceptance over the first {short_horizon} new tokens: "
        + ", ".join(f"{k}={v:.2f}" for k, v in acceptance_short.items()))
    if out_json:
        Path(out_json).write_text(json.dumps(result, indent=2) + "\n")
    return result


def engine_acceptance(tokens: dict, tok, *, budgets=(32,), new_tokens: int = 256, n_prompts: int = 32,
                      prompt_len: int = 64, seed: int = 1234, target: str | None = None, draft: str | None = None,
                      with_chain: bool = True) -> dict:
    """The same held-out prompts through the project's engine (``DecodeSession``, exact verification).

    Acceptance is pooled over rounds (sum of ``StepRecord.acceptance`` / rounds); every session is
    also checked against the target's greedy tokens (``divergences`` lists the prompts that differ). Keys: "chain"
    (the per-depth argmax chain), each budget (DDTree over the drafter's marginals); with a DFlash2 drafter also
    "dflash2-chain" (the selector's chain) and "selector-B" (DDTree under the selector's pair scores).
    """
    import time

    from ddtree_viz.engine.models import load_pair
    from ddtree_viz.engine.session import DecodeSession

    from .distill import newline_token_ids, sample_prompts

    pair = load_pair(target, draft)
    prompts = sample_prompts(tokens["eval"], tokens["eval_doc_offsets"], n_prompts, prompt_len,
                             newline_token_ids(tok), seed)
    dflash2 = getattr(pair.drafter, "family", "dflash") == "dflash2"
    # (key, method, budget, tree scoring): a DFlash2 drafter adds its selector's chain and the selector tree
    runs = [("chain", "dflash", None, "marginal")] if with_chain else []
    runs += [("dflash2-chain", "dflash2", None, "marginal")] if with_chain and dflash2 else []
    runs += [(str(b), "ddtree", b, "marginal") for b in budgets]
    runs += [(f"selector-{b}", "ddtree", b, "selector") for b in budgets] if dflash2 else []
    out = {}
    for key, method, budget, scoring in runs:
        gained = rounds = 0
        divergences, round_ms = [], []
        t0 = time.time()
        for i, p in enumerate(prompts):
            s = DecodeSession.of(pair, budget=budget or 1, max_new_tokens=new_tokens, method=method,
                                 tree_scoring=scoring)
            s.prefill(prompt_ids=p.tolist())
            for r in s.run():
                gained += r.acceptance
                rounds += 1
                round_ms.append(sum(r.timings_ms.values()))
            if s.divergence()[0] is not None:
                divergences.append(i)
        out[key] = {"acceptance": gained / rounds, "rounds": rounds, "divergences": divergences,
                    "median_round_ms": float(np.median(round_ms)), "wall_s": time.time() - t0}
        log(f"engine {key} ({method}, budget {budget}, {scoring}): acceptance {gained / rounds:.2f} over {rounds} rounds, "
            f"median round {out[key]['median_round_ms']:.1f} ms, divergent prompts {divergences}")
    return out
