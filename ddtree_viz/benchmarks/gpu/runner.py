"""The static runner's parts measured one by one (engine/runner.py): its construction (bench_runner), prefill,
greedy step (read back, or chained on the device: greedy_step_chained), a verify graph's launch, the MLP's gate+up
forms, the tree phase built each way (tree_build) and the best-first kernel's warps, and the runner with each of its
parts switched (runner_variants, forms_table)."""

from __future__ import annotations

import statistics
from dataclasses import asdict

import torch

from .config import BenchConfig
from ..harness import clock, host_loop_us, progress, samples_ms, timer
from .harness import per_call_us
from .profiler import activity_kinds, profiled_spans, timeline_gaps


def bench_runner(target, max_len: int, sizes: list[int], feature_layer_ids, forms):
    """(runner, graphs_error): the static runner with its parts forced to `forms` (BenchConfig.runner_forms), with
    its CUDA graphs, or without them where its construction failed (graphs_error says why)."""
    from ...engine.runner import StaticRunner

    try:
        return StaticRunner(target, max_len=max_len, sizes=sizes, feature_layer_ids=feature_layer_ids,
                            forms=forms), None
    except Exception as exc:  # report what broke, measure without graphs
        return StaticRunner(target, max_len=max_len, sizes=sizes, feature_layer_ids=feature_layer_ids, graphs=False,
                            forms=forms), f"{type(exc).__name__}: {exc}"


def greedy_stepper(engine, token: int):
    """A greedy step on `engine` from `token` (each call decodes the next token: the one-node tree, its commit)."""
    from ...engine.tree import one_node

    def greedy_step():
        nonlocal token
        tree_pass = engine.forward(one_node(token))
        token = int(tree_pass.logits[0].argmax())
        engine.commit(tree_pass, [0])

    return greedy_step


def chained_greedy_stepper(runner, token: int, keep: bool = True):
    """Greedy steps that read nothing back: each step's one-node tree is the last step's choice where it is (the
    runner's forward_tensors over a token tensor the device rewrites; the walk and the commit queued, queue_walk),
    so the host launches a step while the device still runs the one before. A step accepts its root alone, so the
    committed length moves by one without a read. Returns (step, tokens): tokens() reads the tokens decoded so far
    (with `keep`, each step's token copied on the device, all read at once; without, the timed steps copy nothing)."""
    ids = torch.tensor([token], device=runner.device)
    parents = torch.tensor([-1], device=runner.device)
    depths = torch.zeros(1, dtype=torch.long, device=runner.device)
    made = []

    def step():
        logits, _, slot = runner.forward_tensors(ids, parents, depths, static=True)
        runner.queue_walk(slot, logits.argmax(-1))
        runner.committed += 1
        ids.copy_(slot.walk_out[runner.max_path + 2:])  # the bonus: the next step's token, on the device
        if keep:
            made.append(ids.clone())

    return step, lambda: torch.cat(made).tolist()


def greedy_step_chained(runner, timed, token: int, steps: int = 8) -> dict:
    """The greedy step with the host out of the device's way (chained_greedy_stepper), ms a step over runs of `steps`
    waited for once, beside greedy_step_ms (each step's token read back before the next is launched, as a decode
    that must see its tokens does): how much of the step is the host's wait, not the device's work. And
    `greedy_step_timeline`: the same steps' device activities by kind and their gaps (where the step's time goes
    beside the weight reads: what fusing would take away)."""
    step, _ = chained_greedy_stepper(runner, token, keep=False)
    out = {"greedy_step_chained_ms": timed(lambda: [step() for _ in range(steps)], repeats=5, warmup=1) / steps}
    spans = profiled_spans(lambda: [step() for _ in range(steps)], runner.device, warmup=step)
    out["greedy_step_timeline"] = ({"error": spans} if isinstance(spans, str) or not spans else
                                   {"steps": steps, "device_events": len(spans),
                                    **timeline_gaps(spans, steps, listed=8),
                                    "kinds": activity_kinds(spans, steps, top=40)})
    return out


def runner_prefill(runner, prompt: list[int], sync, lengths=(512, 2048), repeats: int = 3) -> dict:
    """The runner's prefill (transformers' forward + the copy into the static state) at each prompt length: the
    first (cold: kernel compilation and autotuning) and the median of `repeats` more."""
    out = {"kernels": prefill_kernels()}
    for n in lengths:
        ids = (prompt * (n // len(prompt) + 1))[:n]
        times = samples_ms(lambda: runner.prefill(ids), sync, repeats + 1)  # no warm-up: the first is the cold one
        out[f"prefill_{n}_cold_ms"], out[f"prefill_{n}_ms"] = times[0], statistics.median(times[1:])
    return out


def prefill_kernels() -> dict:
    """Which implementation transformers' Qwen3.5 layers run in a CUDA prefill: fla's chunked delta rule (and
    causal-conv1d's conv) when those packages import, else transformers' own torch fallbacks (CPU tensors always
    take those: engine/backends.kernels_follow_device)."""
    import inspect

    from transformers.models.qwen3_5 import modeling_qwen3_5 as qwen

    out = {}
    for name in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn"):
        fn = getattr(qwen, name, None)
        fn = getattr(fn, "kernel", fn)  # engine/backends.by_device: the CUDA tensors' choice
        impl = None
        while fn is not None and impl is None:  # the hub-kernel wrappers keep the chosen one in a closure
            impl = inspect.getclosurevars(fn).nonlocals.get("implementation") if inspect.isfunction(fn) else None
            fn = getattr(fn, "__wrapped__", None)
        out[name] = f"{impl.__module__}.{impl.__qualname__}" if impl is not None else "unknown"
    out["fla_active"] = out["torch_chunk_gated_delta_rule"].startswith("fla.")
    return out


def graph_launch(runner, sizes: list[int], sync, repeats: int = 20) -> dict:
    """Issue #31's stall before a verify's first kernel, unprofiled: per tree size, the host's time in the forward
    graph's replay() call with the device idle before it (`launch_us`: what the device waits for once the inputs are
    up), and the replay's whole time to the device's end (`replay_ms`), medians of `repeats`, with the host's speed
    beside each launch (`host_loop_us`, host_loop_us's median). Where the runner has no graphs (a CPU): why not."""
    out = {}
    for size in sizes:
        try:
            slot = runner.slot_for(size)
        except ValueError as exc:  # the runner's length is full: what was measured, and why no more
            return {**out, "error": str(exc)}
        if slot.graph is None:
            return {"error": "the runner has no CUDA graphs here"}
        launch, whole, loop = [], [], []
        for _ in range(repeats):
            sync()
            loop.append(host_loop_us())
            start = clock()
            slot.graph.replay()
            launched = clock()
            sync()
            launch.append((launched - start) * 1e6)
            whole.append((clock() - start) * 1e3)
        out[str(size)] = {"launch_us": statistics.median(launch), "replay_ms": statistics.median(whole),
                          "host_loop_us": statistics.median(loop)}
    return out


def gate_up_forms(runner) -> dict:
    """Per tree size and GEMM library the runner captured: each MLP gate+up form's µs a call, as "auto" timed them
    (the runner's part gate_up), and the form taken."""
    from ...engine.runner import pick_gate_up

    return {f"{size}_{library}": {**timed, "taken": pick_gate_up(timed)}
            for (size, library), timed in runner.gate_up_forms.items()}


def tree_build(root: int, logprobs, budgets: list[int], timed) -> dict:
    """Issue #31 item 1's first part: the round's tree phase from the drafter's log-probs on the device to the tree on
    the host, built on the host (top-k copied back, build_tree) and on the device (device_tree_nodes, the nodes
    copied back) eagerly and in DeviceTreeBuilder's CUDA graph (`graph_ms`; `graph_error` where the capture failed),
    by the best-first kernel where it runs (engine/kernels/best_first/, the default on CUDA) and by tree_on_device's tensor
    ops in a graph too (`graph_torch_ms`), per budget: ms each (medians of 20) and whether the trees are the same."""
    from ...engine.tree import DeviceTreeBuilder, DraftTree

    out = {}
    for budget in budgets:
        host = DraftTree.from_logprobs(root, logprobs, budget)
        device = DraftTree.from_logprobs(root, logprobs, budget, on_device=True)
        builder, torch_ops = DeviceTreeBuilder(budget), DeviceTreeBuilder(budget, kernel=False)
        graph, graph_torch = builder(root, logprobs).to_host(), torch_ops(root, logprobs).to_host()
        out[str(budget)] = {
            "host_ms": timed(lambda: DraftTree.from_logprobs(root, logprobs, budget), repeats=20),
            "device_ms": timed(lambda: DraftTree.from_logprobs(root, logprobs, budget, on_device=True), repeats=20),
            "graph_ms": timed(lambda: builder(root, logprobs).to_host(), repeats=20), "graph_error": builder.error,
            "graph_torch_ms": timed(lambda: torch_ops(root, logprobs).to_host(), repeats=20),
            "same_tree": host == device == graph == graph_torch}
    return out


def best_first_warps(bench: BenchConfig, logprobs, budgets: list[int], timed, warps=(1, 2, 4, 8)) -> dict:
    """The best-first kernel (engine/kernels/best_first/) alone per budget and warps a program: µs a call in a CUDA graph
    of 8 calls (per_call_us) and whether its tree is the default warps' (`same`); where Triton cannot run, why."""
    from ...engine.kernels.device import triton_available

    if not (bench.cuda and triton_available()):
        return {"error": "the kernel runs on CUDA with Triton (tests run it in Triton's interpreter)"}
    from ...engine.kernels.best_first.triton_best_first import MAX_BUDGET, best_first_triton

    out = {}
    for budget in (b for b in budgets if b <= MAX_BUDGET):
        top = torch.topk(logprobs, min(budget, logprobs.shape[-1]), dim=-1).values  # as DeviceTree's
        want = best_first_triton(top, budget)
        out[str(budget)] = row = {}
        for w in warps:
            try:  # a warp count that cannot run here says why; the others are still timed
                same = all(torch.equal(a, b) for a, b in zip(best_first_triton(top, budget, w), want))
            except Exception as exc:
                row[str(w)] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
                continue
            row[str(w)] = {"us": per_call_us(bench, timed, 8, lambda: best_first_triton(top, budget, w)), "same": same}
    return out


def runner_variants(bench: BenchConfig, target, prompt, root: int, logprobs, main, sync, bound_ms: float) -> list[dict]:
    """The runner's greedy step and budget-64 / 128 verify with one part switched at a time from `main` (the forms
    the main runner was forced to, BenchConfig.runner_forms: the Triton delta rule, fused projections, the attention
    form, the compiled pieces, ...; `bench.variants` says which parts), each on a runner of its own; a variant that
    cannot run here (no Triton, no GPU) reports why. `compile_s`: the seconds the variant's construction spent
    compiling (torch.compile keeps its graphs per process: a variant after a compiled runner of the same model finds
    them made)."""
    from ...engine.engines import RunnerEngine
    from ...engine.runner import RunnerForms, StaticRunner
    from ...engine.tree import DraftTree

    timed = timer(sync)
    device = torch.device(bench.device)
    resolved = RunnerForms.of(main, device)
    switched = [("gdn_kernel", "torch"), ("gdn_kernel", "triton-rule"), ("gdn_kernel", "triton-solve"),
                ("fused", False),
                ("fused", True), ("attention", "sdpa"), ("attention", "eager"), ("compile", False), ("compile", True),
                ("blas", "default"), ("blas", "auto"), ("gate_up", "fused"), ("gate_up", "auto"), ("gdn_step", "torch"),
                ("gdn_step", "triton"), ("commit", "torch"), ("commit", "triton"),
                ("gdn_prep", "triton"), ("gdn_prep", "torch"), ("norm", "triton"), ("norm", "torch"),
                ("pdl", "on"), ("pdl", "off")]
    rows = []
    for field, value in switched:
        if field not in bench.variants:
            continue
        forced = {**asdict(resolved), field: value}
        try:
            if RunnerForms.of(forced, device) == resolved:  # nothing switched here (blas on a CPU)
                continue
        except ValueError:  # cannot run here: the row below says why
            pass
        row = {"options": forced}
        trees = {b: DraftTree.from_logprobs(root, logprobs, b) for b in (64, 128)}
        try:
            runner = StaticRunner(target, max_len=len(prompt) + 512, sizes=[1, *(len(t) for t in trees.values())],
                                  forms=forced)
        except ValueError as exc:
            rows.append({**row, "error": str(exc)})
            continue
        row.update(options=asdict(runner.forms), kernel_error=runner.kernel_error, compile_s=runner.compile_s,
                   compile_error=runner.compile_error)  # as it ran
        runner.prefill(prompt)
        engine = RunnerEngine(target, None, tree_size=129, block_size=16, max_new_tokens=256, runner=runner)
        row["greedy_step_ms"] = timed(greedy_stepper(engine, root), repeats=20)
        row["greedy_step_per_bound"] = row["greedy_step_ms"] / bound_ms
        for budget, tree in trees.items():
            row[f"verify_{budget}_ms"] = timed(lambda: runner.forward(tree), repeats=10)
            row[f"verify_{budget}_per_greedy_step"] = row[f"verify_{budget}_ms"] / row["greedy_step_ms"]
        row["blas"] = dict(runner.blas)  # each size's GEMM library (measured where blas="auto")
        row["gate_up_forms"] = gate_up_forms(runner)
        rows.append(row)
        progress("variant", row)  # in the log as it comes: a run stopped by its time limit keeps the rows made
        del engine, runner
        if bench.cuda:
            torch.cuda.empty_cache()
    return rows


def forms_table(fast: dict, bound_ms: float) -> str:
    """The main runner and each variant side by side, one line each (what --variants switched)."""
    verify = {row["budget"]: row["verify_ms"] for row in fast["budgets"]}
    rows = [({**fast["options"], "main": True}, fast["greedy_step_ms"], verify.get(64), verify.get(128), fast["compile_s"])]
    rows += [(v["options"], v.get("greedy_step_ms"), v.get("verify_64_ms"), v.get("verify_128_ms"), v.get("compile_s"))
             for v in fast.get("variants", [])]
    lines = [f"runner forms (bound {bound_ms:.2f} ms): greedy step ms (x bound) | verify 64, 128 ms (x step) | compile s"]
    for opts, step, v64, v128, comp in rows:
        name = " ".join(f"{k}={v}" for k, v in opts.items())
        if step is None:
            lines.append(f"  {name}: did not run")
            continue
        ver = " ".join(f"{v:.2f} ({v / step:.2f}x)" for v in (v64, v128) if v is not None)
        lines.append(f"  {name}: {step:.2f} ({step / bound_ms:.2f}x) | {ver} | {comp or 0:.1f}")
    return "\n".join(lines)
