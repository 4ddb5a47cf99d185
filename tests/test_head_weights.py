"""--head-weights (issue #67 item 1): the target's lm_head quantized at load, 4-bit (symmetric, groups of 128) or FP8
(e4m3, 128 x 128 block scales), so a 24 GB card keeps the 27B's 2.37 GiB bf16 head in 0.61 or 1.18 GiB. The target's
function changes with it: greedy decoding and DDTree change together and stay equal, and the precision audit says
where the quantized head's greedy output parts from the plain one's. Real tiny checkpoints, loaded as a user's are."""

from __future__ import annotations

import json

import pytest
import torch

from ddtree_viz.engine import models
from ddtree_viz.engine.models import load_pair
from ddtree_viz.engine.weights import at_load, fp8, int4_common as int4
from ddtree_viz.errors import InputError
from ddtree_viz.trace import Trace
from tests import tiny

HIDDEN = 256  # two groups of 128 a row for the 4-bit head, two block columns for the FP8 one

LABELS = {"int4": "float32; lm_head int4 w4a16 group 128 sym (quantized at load)",
          "fp8": "float32; lm_head fp8-e4m3 block 128 (quantized at load)"}


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return tiny.save_pair(tiny.tiny_pair(hidden=HIDDEN), tmp_path_factory.mktemp("head") / "plain")


def whole_head(weight: torch.Tensor, weights: str) -> torch.Tensor:
    """The head's real weight, quantized as one piece by the formats' own functions (the load slices it)."""
    if weights == "fp8":
        return fp8.dequantize(*fp8.quantize(weight, (128, 128)), (128, 128))
    spec = int4.Int4Spec(128, True)
    return int4.dequantize(int4.quantize(weight, spec), spec)


@pytest.mark.parametrize("weights", ["int4", "fp8"])
@pytest.mark.parametrize("engine", ["transformers", "runner"])
def test_a_quantized_head_decodes_the_quantized_targets_greedy_output(plain, tmp_path, capsys, monkeypatch, engine,
                                                                       weights):
    """`run --head-weights`: on both engines the output is identical to greedy, and that greedy output is the one
    of the target whose lm_head is the quantized weight (made here as one piece; the load quantizes 128 rows at a
    time, so the slices must stack to the whole); the precision printed and in the trace."""
    monkeypatch.setattr(at_load, "SLICE_ROWS", 128)  # three slices of the 258-row head
    target, draft = plain
    out, trace = tiny.run_quantized(target, draft, engine, tmp_path, capsys, "--head-weights", weights)
    assert LABELS[weights] in out and trace.settings["target_precision"] == LABELS[weights]
    reference = tiny.target_model(hidden=HIDDEN)
    reference.load_state_dict(load_pair(str(target), str(draft)).target.state_dict())
    head = reference.get_output_embeddings()
    with torch.no_grad():
        real = whole_head(head.weight, weights)
        assert 0 < (real - head.weight).abs().max() <= head.weight.abs().max() / 14  # at most half a 4-bit step
        head.weight.copy_(real)
    tiny.assert_generated_by(trace, reference)


def test_the_head_is_kept_quantized_and_named_in_the_costs_key(plain):
    """The head module holds the quantized parts (no float weight of its own), the rest of the target is as loaded,
    its cost table is not the plain target's; a tied head becomes a copy (its label says no memory is saved);
    another format, a non-Linear head and a dispatched one are refused with what to do."""
    from accelerate.hooks import ModelHook, add_hook_to_module

    from ddtree_viz.engine.costs import pair_key

    target, draft = plain
    pair, base = load_pair(str(target), str(draft), head_weights="int4"), load_pair(str(target), str(draft))
    head = pair.target.get_output_embeddings()
    assert isinstance(head, int4.Int4Linear) and head.weight_packed.dtype == torch.int32
    assert (head.out_features, head.in_features) == (tiny.VOCAB, HIDDEN)
    assert not any(isinstance(m, torch.nn.Linear) and m.out_features == tiny.VOCAB for m in pair.target.modules())
    assert pair_key(pair, "runner", 8) != pair_key(base, "runner", 8)
    assert pair.target_parameters == base.target_parameters == pair.checkpoint.parameters  # the head's out x in
    assert "lm_head int4" in pair.describe()
    embedded = load_pair(head_weights="fp8")
    assert embedded.target_precision.endswith("(quantized at load; tied: a copy beside the embedding)")
    assert isinstance(embedded.target.get_input_embeddings().weight, torch.nn.Parameter)
    # the page's "parameters loaded ... of the checkpoint's": a tied head's copy is the embedding's, counted once
    assert embedded.target_parameters == load_pair().target_parameters == embedded.checkpoint.parameters
    assert " of the checkpoint's" not in embedded.parameters_line()
    with pytest.raises(InputError, match="--head-weights must be one of int4, fp8, not 'nf4'"):
        load_pair(str(target), str(draft), head_weights="nf4")
    with pytest.raises(InputError, match="quantizes a plain lm_head; this target's is Int4Linear"):
        models.quantize_head(pair.target, "fp8", torch.float32)
    add_hook_to_module(base.target.get_output_embeddings(), ModelHook())
    with pytest.raises(InputError, match="needs the target on one device"):
        models.quantize_head(base.target, "int4", torch.float32)


def test_precision_audit_of_a_quantized_head(plain, tmp_path, capsys):
    """`analyze --head-weights-b int4`: A the plain target, B the same with its head made 4-bit at load. Each side's
    output is its own greedy (DDTree exact on both), B's target labelled, and where the two greedy outputs part
    is reported from the traces themselves (none, or the first index where their tokens differ)."""
    from ddtree_viz import cli

    target, draft = plain
    prompts = tmp_path / "p.txt"
    prompts.write_text("def f(x):\n\nclass A:\n")
    out = tmp_path / "out"
    rc = cli.main(["analyze", "--prompts", str(prompts), "--out", str(out), "--max-new-tokens", "16", "--budget", "4",
                   "--no-speedup", "--target", str(target), "--draft", str(draft), "--head-weights-b", "int4"])
    assert rc == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    audit = summary["precision_audit"]
    assert (audit["a"]["target_precision"], audit["b"]["target_precision"]) == ("float32", LABELS["int4"])
    settings = json.loads((out / "prompts.json").read_text())["settings"]  # (a resumed run quantizes B's head too)
    assert audit["prompts_compared"] == 2 and settings["b"]["head_weights"] == "int4"
    for row in audit["per_prompt"]:
        a, b = Trace.load(out / row["file_a"]), Trace.load(out / row["file_b"])
        assert a.output_ids == a.greedy_ids and b.output_ids == b.greedy_ids
        parted = next((i for i, (x, y) in enumerate(zip(a.output_ids, b.output_ids)) if x != y), None)
        assert row["part_at"] == parted
    capsys.readouterr()


def test_the_memory_plan_counts_the_quantized_head(tmp_path):
    """gpu_bench --head-weights: the bench's quantized target built with its head quantized as a user's load does
    it, and the memory plan on the meta device saves exactly the head's bytes: vocab x hidden x 2 (bf16) against
    the 4-bit words, bf16 scales and shape, or the e4m3 bytes and float32 block scales."""
    from ddtree_viz.benchmarks.gpu import config, memory, models as bench_models, plan

    for weights in ("int4", "fp8"):
        base = config.BenchConfig(smoke=True, device="cpu")
        head = config.BenchConfig(smoke=True, device="cpu", head_weights=weights)
        plans = [plan.memory_plan(b, "int4", False, contexts=(300,), budget=8, rounds=1, layers=2) for b in (base, head)]
        target = bench_models.build_quantized_target(head, 2, torch.bfloat16, "int4")
        vocab, hidden = target.get_output_embeddings().out_features, target.get_output_embeddings().in_features
        kept = (vocab * hidden // 2 + vocab * (hidden // 128) * 2 + 16 if weights == "int4"  # (+ its shape: 2 int64)
                else vocab * hidden + -(-vocab // 128) * (hidden // 128) * 4)
        assert plans[1]["head_weights"] == weights and plans[0]["head_weights"] is None
        assert (plans[0]["target_GiB"] - plans[1]["target_GiB"]) * 2**30 == pytest.approx(2 * vocab * hidden - kept)
        assert plans[1]["target_GiB"] * 2**30 == memory.model_bytes(target)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the Triton GEMMs in CUDA graphs)")
@pytest.mark.parametrize("weights", ["int4", "fp8"])
def test_a_quantized_head_on_the_gpu_runner(plain, tmp_path, capsys, weights):
    """On CUDA the head stays packed and its product is the Triton GEMM's, captured in the runner's graphs and called
    by the static drafter: `run --device cuda --engine runner --head-weights` is identical to greedy, and its
    output is greedy's of the quantized target decoded on the CPU (float32: to the order of the sums)."""
    target, draft = plain
    _, trace = tiny.run_quantized(target, draft, "runner", tmp_path, capsys, "--head-weights", weights,
                                  "--device", "cuda")
    _, cpu = tiny.run_quantized(target, draft, "transformers", tmp_path, capsys, "--head-weights", weights)
    assert trace.settings["target_precision"] == LABELS[weights] and trace.output_ids == cpu.output_ids
