"""The bf16 target at Qwen3.6-27B shapes (random weights): transformers' forward (speed: the bound, prefill, greedy
step, drafter, each budget's exact and naive verify and commit, the DFlash chain, whole rounds) and with --fast the
static runner (fast_speed: the same figures on preallocated state and CUDA graphs, its parts, rounds and variants,
against their targets); then the quantized targets after the bf16 one is freed (quantized.py)."""

from __future__ import annotations

import copy
import functools
import json
import statistics
import traceback
from dataclasses import asdict

import torch

from .config import BenchConfig
from .dflash2 import dflash2_speed
from .drafter import drafter_pass
from ..harness import clock, phase_medians, progress, timed_call, timer
from .memory import peak_memory_gib
from .models import DFLASH2_CONFIG, build_drafter, layer_devices, measured_models, pair_of
from .quantized import quantize_drafter_int4, quantized_phase
from .rounds import runner_rounds
from .runner import (bench_runner, best_first_warps, gate_up_forms, graph_launch, greedy_step_chained, greedy_stepper,
                     prefill_kernels, runner_prefill, runner_variants, tree_build)
from .targets import fast_targets, round_targets
from .tree_forms import tree_forms


@torch.no_grad()
def speed(bench: BenchConfig, layers: int, dtype: torch.dtype, budgets: list[int], prompt_len: int = 512,
          saved=lambda part: None) -> dict:
    """transformers' forward at these shapes: the bound, prefill, greedy step, the drafter, each budget's exact and
    naive verify, the DFlash chain, whole rounds; with --fast the static runner too (`fast_speed`). `saved` gets
    the figures so far after the bf16 phase and after each quantized one (a run cut by a time limit keeps them)."""
    from ...engine.cache import new_cache
    from ...engine.drafter import extract_context_features
    from ...engine.proposers import DFlashProposer
    from ...engine.tree import DraftTree
    from ...engine.verify import EXACT, verify_tree

    target, drafter, sync, out = measured_models(bench, layers, dtype)
    timed, bound_ms = timer(sync), out["weight_read_bound_ms"]
    if bench.split:
        out["layer_devices"] = layer_devices(target)
    first = target.get_input_embeddings().weight.device
    prompt = torch.randint(0, target.config.vocab_size, (1, prompt_len), device=first)
    base = new_cache(target)
    prefill, out["prefill_ms"] = timed_call(lambda: target(input_ids=prompt, cache=base, use_cache=True,
                                                           output_hidden_states=True, logits_to_keep=1), sync)
    out["prefill_kernels"] = prefill_kernels()

    # greedy decode step (transformers' own one-token forward)
    cache = copy.deepcopy(base)
    token = prefill.logits[:, -1:].argmax(-1)
    out["greedy_step_ms"] = timed(lambda: target(input_ids=token, cache=cache, use_cache=True, logits_to_keep=1))

    # drafter pass (block 16, context = the prompt's features): the dynamic drafter's first pass of a prompt
    proposer = DFlashProposer(drafter, target, static=False)
    feats = extract_context_features(prefill.hidden_states, proposer.feature_layer_ids)[0]

    def draft():
        proposer.reset()
        return proposer.propose(int(token), prompt_len, feats, drafter.block_size)

    out["draft_ms"] = timed(draft, repeats=5)
    logprobs = draft()
    del proposer
    # a round's pass, dynamic (eager) against static (CUDA graphs), side by side: issue #18's <= 3 ms
    out["drafter_pass"] = drafter_pass(target, drafter, feats, int(token), sync, repeats=4 if bench.smoke else 20)
    rows = [] if bench.fast_only else verify_rows(target, base, int(token), logprobs, budgets, prompt_len, sync)
    out["budgets"] = rows
    chain = DraftTree.chain_from_logprobs(int(token), logprobs)
    if not bench.fast_only:
        out["dflash_chain_verify_ms"] = timed(lambda: verify_tree(target, copy.deepcopy(base), chain, prompt_len, EXACT,
                                                                  want_hidden=True), repeats=5)
        out["rounds"] = session_rounds(bench, target, drafter, dtype, prompt[0].tolist())
    if bench.fast and not bench.split:
        dflash2 = None
        if bench.dflash2:  # the DFlash2 drafter beside DFlash 1: same target, prompt and runner
            drafter2 = build_drafter(bench, target, dtype, DFLASH2_CONFIG)
            dflash2 = (drafter2, extract_context_features(prefill.hidden_states, drafter2.target_layer_ids)[0])
        out["fast"] = fast_speed(bench, pair_of(bench, target, drafter, dtype), prompt[0].tolist(), budgets, logprobs,
                                 bound_ms, out["greedy_step_ms"], out["draft_ms"], sync, out["drafter_pass"], dflash2)
    out["peak_memory_GiB"] = peak_memory_gib(bench)
    for key in ("greedy_step_ms", "draft_ms", "dflash_chain_verify_ms", "prefill_ms"):
        if key in out:
            out[f"{key}_per_bound"] = out[key] / bound_ms
    for row in rows:
        row["verify_exact_per_bound"] = row["verify_exact_ms"] / bound_ms
        row["verify_exact_per_greedy_step"] = row["verify_exact_ms"] / out["greedy_step_ms"]
    if bench.quantized and "fast" in out:  # the quantized targets after the bf16 one is freed (one 27B at a time)
        print(json.dumps({"bf16_targets": out["fast"]["targets"]}), flush=True)  # kept in the log if a limit hits
        saved(out)
        del target, base, prefill, cache
        for weights in bench.quantized:
            if weights == "int4" and bench.int4_drafter:  # the last phase: its drafter 4-bit, as on a 24 GB card
                quantize_drafter_int4(drafter)
            quantized_phase(bench, out["fast"], weights, (layers, dtype, budgets, drafter, prompt[0].tolist(), logprobs,
                                                          out["copy_bandwidth_TBps"] * 1e12, out["fast"]),
                            lambda: saved(out))
    elif bench.cuda:  # the caller builds the next model; free this one's memory first
        del target, base, prefill
    if bench.cuda:
        del drafter
        torch.cuda.empty_cache()
    return out


def verify_rows(target, base, token: int, logprobs, budgets: list[int], prompt_len: int, sync) -> list[dict]:
    """Per budget: the best-first tree's build time, and transformers' verify and commit of it, exact and naive
    (medians of 5 after one), each on a fresh copy of the prompt's cache `base`."""
    from ...engine.tree import build_tree
    from ...engine.verify import EXACT, NAIVE

    timed = timer(sync)
    rows = []
    for budget in budgets:
        k = min(budget, logprobs.shape[-1])
        values, ids = torch.topk(logprobs, k, dim=-1)
        v_np, i_np = values.cpu().numpy(), ids.cpu().numpy()
        tree_ms = timed(lambda: build_tree(token, v_np, i_np, budget), repeats=20)
        tree = build_tree(token, v_np, i_np, budget)
        row = {"budget": budget, "positions": len(tree), "tree_build_ms": tree_ms}
        for mode in (EXACT, NAIVE):
            one = functools.partial(verify_commit_ms, target, base, tree, prompt_len, mode, sync)
            one()
            samples = [one() for _ in range(5)]
            row[f"verify_{mode}_ms"] = statistics.median(v for v, _ in samples)
            row[f"commit_{mode}_ms"] = statistics.median(c for _, c in samples)
        row["tree_exact_extra_ms"] = row["verify_exact_ms"] - row["verify_naive_ms"]
        rows.append(row)
    return rows


def verify_commit_ms(target, base, tree, prompt_len: int, mode: str, sync) -> tuple[float, float]:
    """(verify ms, commit ms) of transformers' pass over `tree` in `mode` and the commit of its deepest path, on a
    fresh copy of the prompt's cache `base`."""
    from ...engine.verify import commit, verify_tree

    c = copy.deepcopy(base)
    sync()
    r, verify_ms = timed_call(lambda: verify_tree(target, c, tree, prompt_len, mode, want_hidden=True), sync)
    accepted = tree.path_to(len(tree) - 1)
    return verify_ms, timed_call(lambda: commit(c, tree, accepted, r), sync)[1]


@torch.no_grad()
def session_rounds(bench: BenchConfig, target, drafter, dtype, prompt: list[int], budget: int = 64,
                   rounds: int = 12) -> dict:
    """Whole DDTree rounds as the tool runs them (DFlash draft, tree, exact verify, commit, records), median
    per phase. Random weights accept little, so this measures cost per round, not speed-up."""
    from ...engine.session import DecodeSession

    session = DecodeSession.of(pair_of(bench, target, drafter, dtype), budget=budget, max_new_tokens=2048,
                               engine="transformers")  # section 3 measures transformers' forward; the runner has its own
    session.prefill(prompt_ids=prompt)
    session.step()  # warm-up
    records = [session.step() for _ in range(rounds)]
    phases = phase_medians(records)
    return {"budget": budget, "rounds": rounds, "median_ms": phases, "round_ms": sum(phases.values()),
            "mean_acceptance": sum(r.kept for r in records) / rounds}


@torch.no_grad()
def fast_speed(bench: BenchConfig, pair, prompt: list[int], budgets: list[int], logprobs, bound_ms: float,
               hf_greedy_ms: float, draft_ms: float, sync, draft_pass: dict | None = None, dflash2=None) -> dict:
    """The static runner (engine/runner.py): the same measurements with preallocated state and CUDA graphs, its
    prefill at 512 and 2,048 tokens, the same passes with each of its options switched (``variants``) and every
    figure against issue #18's target (``targets``). ``sync`` waits for the models' devices
    (``engine.verify.device_sync``); ``draft_ms`` is the isolated drafter pass measured before (the dynamic
    drafter's first pass of the prompt), ``draft_pass`` the round's pass both ways (``drafter_pass``). ``dflash2``:
    (DFlash2 drafter, its context features of the prompt) to measure beside DFlash 1 on this runner (dflash2_speed)."""
    from ...engine.engines import RunnerEngine
    from ...engine.tree import DraftTree

    target, drafter = pair.target, pair.drafter
    timed = timer(sync)
    root = int(logprobs.argmax(-1)[0])
    sizes = sorted({1, drafter.block_size, *(b + 1 for b in budgets), *([dflash2[0].block_size] if dflash2 else [])})
    forms = bench.runner_forms()
    start = clock()
    runner, graphs_error = bench_runner(target, len(prompt) + 2048, sizes, drafter.target_layer_ids, forms)
    out: dict = {"options": asdict(runner.forms), "kernel_error": runner.kernel_error, "graphs": runner.graphs,
                 "graphs_error": graphs_error, "compile_s": runner.compile_s, "compile_error": runner.compile_error}
    out["prefill"] = runner_prefill(runner, prompt, sync, lengths=(len(prompt), 2048))
    logits, feats = runner.prefill(prompt)
    for size in sizes:  # capture every size at this length bucket now, not inside the timings
        runner.slot_for(size)
    out.update(capture_s=clock() - start, sizes=sizes, buckets=runner.buckets, blas=dict(runner.blas),
               gate_up_forms=gate_up_forms(runner))
    rounds_tokens = 16 * drafter.block_size  # room for the 14 whole rounds below, however much they accept
    engine = RunnerEngine(target, drafter.target_layer_ids, tree_size=max(sizes), block_size=drafter.block_size,
                          max_new_tokens=rounds_tokens, runner=runner)
    out["greedy_step_ms"] = timed(greedy_stepper(engine, int(logits.argmax())), repeats=30)
    out.update(greedy_step_chained(runner, timed, int(logits.argmax())))
    rows = []
    for budget in budgets:
        tree = DraftTree.from_logprobs(root, logprobs, budget)
        verify_ms = timed(lambda: runner.forward(tree), repeats=20)
        accepted = tree.path_to(len(tree) - 1)

        def forward_commit():
            _, _, slot = runner.forward(tree)
            runner.commit(slot, accepted)

        both_ms = timed(forward_commit, repeats=10)
        rows.append({"budget": budget, "positions": len(tree), "verify_ms": verify_ms, "commit_ms": both_ms - verify_ms,
                     "verify_per_bound": verify_ms / bound_ms, "verify_per_fast_greedy_step": verify_ms / out["greedy_step_ms"]})
    out["budgets"] = rows
    out["tree_build"] = tree_build(root, logprobs, sorted({*budgets, 128}), timed)
    out["best_first_warps"] = best_first_warps(bench, logprobs, sorted({*budgets, 128}), timed)
    chain = DraftTree.chain_from_logprobs(root, logprobs)
    out["dflash_chain_verify_ms"] = timed(lambda: runner.forward(chain), repeats=20)
    out.update(runner_rounds(pair, engine, runner, prompt, rounds_tokens))
    if dflash2 is not None:
        try:
            out["dflash2"] = dflash2_speed(bench, pair, dflash2, engine, runner, prompt, rounds_tokens, root, sync)
        except Exception as exc:  # report what broke (traceback on stderr); DFlash 1's figures and the rest come back
            traceback.print_exc()
            out["dflash2"] = {"error": f"{type(exc).__name__}: {exc}"}
    out["greedy_step_per_bound"] = out["greedy_step_ms"] / bound_ms
    out["greedy_step_chained_per_bound"] = out["greedy_step_chained_ms"] / bound_ms
    out["greedy_step_vs_transformers"] = out["greedy_step_ms"] / hf_greedy_ms
    out["graph_launch"] = graph_launch(runner, sizes, sync)
    # the figures so far, issue #31's targets on them, in the log before the long tail (variants, --tree-forms): a run
    # stopped by its time limit there keeps them (session 19's first run lost every figure that way)
    progress("fast_so_far", {**out, "issue_67": round_targets(out, bound_ms)})
    del engine, runner
    if bench.cuda:
        torch.cuda.empty_cache()
    out["variants"] = runner_variants(bench, target, prompt, root, logprobs, forms, sync, bound_ms)
    if bench.tree_forms:
        out["tree_forms"] = tree_forms(bench, target, sync)
    out["targets"] = fast_targets(out, bound_ms, draft_ms, draft_pass)
    return out
