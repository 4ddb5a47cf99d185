"""The official FP8 checkpoint layout (Qwen3.6-27B-FP8): a tiny hybrid and its DFlash drafter saved in it load through
`load_pair` / `run --target DIR --draft DIR`, their weights equal to the same checkpoint dequantized by hand in
float32, and decode identical to greedy and to that hand-dequantized model's own generation. Every bad layout is
refused with the weight's name.

The tiny models are 192 wide (not a multiple of the 128 block): the last block of rows / columns is partial, so the
scale grid is ceil(dim / 128) and dequantizing by a block derived from the grid (192 / 2 = 96) would be wrong.
"""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from safetensors.torch import load_file

from ddtree_viz import cli
from ddtree_viz.engine.weights import fp8, load, registry
from ddtree_viz.engine.weights.base import is_stand_in
from ddtree_viz.engine.models import load_pair
from ddtree_viz.errors import ModelLoadError
from ddtree_viz.trace import Trace
from tests import tiny

HIDDEN = 192
BLOCK = (128, 128)
NOT_CONVERTED = ("lm_head", "model.embed_tokens", "linear_attn.in_proj_a", "linear_attn.in_proj_b")
LABEL = "fp8-e4m3 block 128 (dequantized to float32)"


def _to_fp8_layout(directory, skip=NOT_CONVERTED) -> None:
    """Rewrite a saved model directory in the official FP8 layout (weights + per-block scales + quantization_config)."""
    def change(state, config):
        converted = fp8.quantize_state(state, BLOCK, lambda name: not any(s in name for s in skip))
        state.clear()
        state.update(converted)
        config["quantization_config"] = fp8.config_entry(BLOCK, skip)

    tiny.edit_checkpoint(directory, change)


def by_hand(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """An e4m3 weight times its block scales, one block at a time, in float32 (the reference for the loader)."""
    out = torch.empty(q.shape, dtype=torch.float32)
    for i in range(math.ceil(q.shape[0] / BLOCK[0])):
        for j in range(math.ceil(q.shape[1] / BLOCK[1])):
            rows, cols = slice(i * BLOCK[0], (i + 1) * BLOCK[0]), slice(j * BLOCK[1], (j + 1) * BLOCK[1])
            out[rows, cols] = q[rows, cols].to(torch.float32) * scale[i, j].item()
    return out


def hand_dequantized(directory) -> dict[str, torch.Tensor]:
    """The FP8 checkpoint's state dict, every converted weight dequantized by hand (scales dropped)."""
    state = load_file(str(directory / "model.safetensors"))
    return {k: by_hand(v, state[k + "_scale_inv"]) if k + "_scale_inv" in state else v
            for k, v in state.items() if not k.endswith("_scale_inv")}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """(plain target dir, plain drafter dir, FP8 target dir, FP8 drafter dir, the hand-dequantized target model)."""
    root = tmp_path_factory.mktemp("fp8")
    pair = tiny.tiny_pair(hidden=HIDDEN)
    target, draft = tiny.save_pair(pair, root / "plain")
    fp8_target, fp8_draft = root / "fp8" / "target", root / "fp8" / "draft"
    shutil.copytree(target, fp8_target)
    shutil.copytree(draft, fp8_draft)
    _to_fp8_layout(fp8_target)
    _to_fp8_layout(fp8_draft, skip=())
    reference = tiny.target_model(hidden=HIDDEN)
    reference.load_state_dict(hand_dequantized(fp8_target))
    return target, draft, fp8_target, fp8_draft, reference


def test_the_layout_is_the_official_one(checkpoints):
    """e4m3 weights [out, in], float32 scales [ceil(out/128), ceil(in/128)], the listed modules left as they were."""
    *_, fp8_target, _, _ = checkpoints
    state = load_file(str(fp8_target / "model.safetensors"))
    weight = state["model.layers.0.mlp.gate_proj.weight"]
    assert weight.dtype == torch.float8_e4m3fn and tuple(weight.shape) == (2 * HIDDEN, HIDDEN)
    scale = state["model.layers.0.mlp.gate_proj.weight_scale_inv"]
    assert scale.dtype == torch.float32 and tuple(scale.shape) == (3, 2)  # 384 / 128, ceil(192 / 128): partial
    assert state["lm_head.weight"].dtype == torch.float32 and "lm_head.weight_scale_inv" not in state
    assert state["model.layers.0.linear_attn.in_proj_a.weight"].dtype == torch.float32
    config = json.loads((fp8_target / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == "fp8" and config["weight_block_size"] == [128, 128]


def test_loads_as_dequantized_by_hand(checkpoints):
    """Target and drafter weights equal the checkpoint dequantized by hand in float32, bit for bit."""
    _, _, fp8_target, fp8_draft, reference = checkpoints
    pair = load_pair(str(fp8_target), str(fp8_draft))
    tiny.assert_same_weights(pair.target.state_dict(), reference.state_dict())
    drafter = hand_dequantized(fp8_draft)
    for name, tensor in pair.drafter.state_dict().items():
        assert torch.equal(tensor, drafter[name]), name
    assert pair.target_precision == pair.draft_precision == LABEL
    assert f"weights: target {LABEL}, drafter {LABEL}" in pair.describe()


def test_bfloat16_load_is_the_float32_product_rounded_once(checkpoints):
    """In bfloat16 each weight is the float32 product e4m3 x scale rounded once (not fp8 and scale in bf16 first)."""
    _, _, fp8_target, fp8_draft, reference = checkpoints
    pair = load_pair(str(fp8_target), str(fp8_draft), dtype="bfloat16")
    name = "model.layers.3.self_attn.q_proj.weight"
    assert torch.equal(pair.target.state_dict()[name], reference.state_dict()[name].to(torch.bfloat16))
    assert pair.target_precision == "fp8-e4m3 block 128 (dequantized to bfloat16)"


@pytest.mark.parametrize("engine", ["transformers", "runner"])
def test_run_decodes_fp8_target_as_its_greedy(checkpoints, capsys, tmp_path, engine):
    """`run --target FP8 --draft FP8` on both engines: identical to greedy, equal to the hand-dequantized model's own
    generation, the precision printed and in the trace."""
    _, _, fp8_target, fp8_draft, reference = checkpoints
    out, trace = tiny.run_quantized(fp8_target, fp8_draft, engine, tmp_path, capsys)
    assert "identical to greedy for 16 tokens" in out and LABEL in out
    assert trace.settings["target_precision"] == trace.settings["draft_precision"] == LABEL
    assert trace.settings["engine"] == engine and len(trace.output_ids) == 16
    tiny.assert_generated_by(trace, reference)


@pytest.mark.parametrize("which", ["target", "drafter"])
def test_drafter_precision_independent_of_the_target(checkpoints, which):
    """An FP8 target with a plain drafter and a plain target with an FP8 drafter: each says its own precision."""
    target, draft, fp8_target, fp8_draft, _ = checkpoints
    pair = load_pair(str(fp8_target), str(draft)) if which == "target" else load_pair(str(target), str(fp8_draft))
    assert (pair.target_precision, pair.draft_precision) == ((LABEL, "float32") if which == "target" else ("float32", LABEL))


GATE = "model.layers.0.mlp.gate_proj.weight"
BAD_LAYOUTS = {
    "missing scales": (lambda s, c: s.pop(GATE + "_scale_inv"), f"{GATE} is float8_e4m3fn but has no scales"),
    "mis-shaped scales": (lambda s, c: s.update({GATE + "_scale_inv": torch.ones(3, 3)}),
                          f"{GATE}_scale_inv have shape [3, 3]; weight {GATE} [384, 192] in 128x128 blocks needs [3, 2]"),
    "another block": (lambda s, c: s.update({GATE + "_scale_inv": torch.ones(6, 3)}),
                      "fit 64x64 blocks, not the config's weight_block_size [128, 128]"),
    "scales not float32": (lambda s, c: s.update({GATE + "_scale_inv": torch.ones(3, 2, dtype=torch.bfloat16)}),
                           f"{GATE}_scale_inv are bfloat16, not float32"),
    "scales without weight": (lambda s, c: s.update({"model.layers.0.mlp.extra.weight_scale_inv": torch.ones(1, 1)}),
                              "model.layers.0.mlp.extra.weight_scale_inv have no weight"),
    "weight not fp8": (lambda s, c: s.update({GATE: s[GATE].to(torch.float32)}), f"{GATE} has scales but is float32"),
    "missing weight": (lambda s, c: [s.pop(GATE), s.pop(GATE + "_scale_inv")], f"target weights missing from"),
    "unknown method": (lambda s, c: c["quantization_config"].update(quant_method="bitsandbytes"),
                       "quant_method 'bitsandbytes' is not supported"),
    "unknown fmt": (lambda s, c: c["quantization_config"].update(fmt="e5m2"), "fmt 'e5m2' is not supported"),
    "static activations": (lambda s, c: c["quantization_config"].update(activation_scheme="static"),
                           "activation_scheme 'static' is not supported"),
    "bad block size": (lambda s, c: c["quantization_config"].update(weight_block_size=[128]),
                       "weight_block_size must be two whole numbers"),
    # issue #64: a NaN / inf scale made every output token '!' and the page called it identical to greedy
    "NaN scale": (lambda s, c: s[GATE + "_scale_inv"].__setitem__((1, 0), math.nan),
                  f"target tensor {GATE}_scale_inv holds 1 non-finite value (NaN; the first at [1, 0])"),
    "inf scales": (lambda s, c: s[GATE + "_scale_inv"][0].fill_(-math.inf),
                   f"target tensor {GATE}_scale_inv holds 2 non-finite values (inf; the first at [0, 0])"),
}


@pytest.mark.parametrize("keep", [False, True], ids=["dequantized", "fp8-kept"])
@pytest.mark.parametrize("case", sorted(BAD_LAYOUTS))
def test_bad_layouts_are_refused(checkpoints, tmp_path, case, keep):
    _, _, fp8_target, fp8_draft, _ = checkpoints
    broken = tmp_path / "target"
    shutil.copytree(fp8_target, broken)
    change, message = BAD_LAYOUTS[case]
    tiny.edit_checkpoint(broken, change)
    with pytest.raises(ModelLoadError) as info:
        load_pair(str(broken), str(fp8_draft), keep_quantized=keep)
    assert message in str(info.value)
    if case == "missing weight":
        assert GATE in str(info.value)


# ---- FP8 weights kept (fp8.Fp8Linear: what a target on one CUDA GPU gets), on the CPU


KEPT_LABEL = "fp8-e4m3 block 128 (fp8 weights, float32 activations)"


def test_fp8_weights_kept_are_the_checkpoints_bytes_and_scales(checkpoints):
    """keep_quantized: each converted Linear holds the checkpoint's e4m3 bytes and float32 scales (about 1 byte a
    parameter), the modules left out stay plain; transformers' own forward gives the hand-dequantized model's
    logits bit for bit (float32 on a CPU: the weight dequantized for the call, F.linear)."""
    _, _, fp8_target, fp8_draft, reference = checkpoints
    pair = load_pair(str(fp8_target), str(fp8_draft), keep_quantized=True)
    stored = load_file(str(fp8_target / "model.safetensors"))
    kept = {n: m for n, m in pair.target.named_modules() if isinstance(m, fp8.Fp8Linear)}
    assert set(f"{n}.weight" for n in kept) == {k.removesuffix("_scale_inv") for k in stored if k.endswith("_scale_inv")}
    for name, m in kept.items():
        assert m.weight.dtype == torch.float8_e4m3fn and m.weight_scale_inv.dtype == torch.float32
        assert torch.equal(m.weight.view(torch.uint8), stored[f"{name}.weight"].view(torch.uint8)), name
        assert torch.equal(m.weight_scale_inv, stored[f"{name}.weight_scale_inv"]), name
    params = sum(m.weight.numel() for m in kept.values())
    nbytes = sum(m.weight.numel() * m.weight.element_size() + m.weight_scale_inv.numel() * 4 for m in kept.values())
    assert nbytes / params < 1.01  # float32 dequantized: 4 bytes a parameter
    assert type(pair.target.model.layers[0].linear_attn.in_proj_a) is torch.nn.Linear
    tiny.assert_parameters_counted(pair, reference)
    assert type(pair.target.lm_head) is torch.nn.Linear
    assert pair.target_precision == KEPT_LABEL and pair.draft_precision == KEPT_LABEL
    ids = torch.tensor([list(range(3, 40))])
    with torch.no_grad():
        assert torch.equal(pair.target(input_ids=ids).logits, reference(input_ids=ids).logits)


def test_kept_weights_load_as_stand_ins_and_an_fp8_embedding_as_its_values(checkpoints, tmp_path):
    """keep_quantized reads each FP8 weight into its kept module only: the state transformers loads holds a stand-in
    of one element for it (a 27B checkpoint's load then takes its own size in host memory, not a dequantized
    model's), each paired back by its storage. A quantized tensor that is no Linear's (an embedding converted too)
    gets its dequantized values, not the stand-in's zeros: the model's logits are the dequantized model's."""
    from ddtree_viz.engine.models import load_target

    _, _, fp8_target, _, _ = checkpoints
    kept: dict = {}
    state = load.read_checkpoint(fp8_target, registry.spec_of(json.loads((fp8_target / "config.json").read_text()), "t"),
                                torch.float32, "target", kept)
    assert kept and all(state[name] is kept[name][0] and state[name].untyped_storage().nbytes() == 4 for name in kept)
    embedded = tmp_path / "target"
    shutil.copytree(fp8_target, embedded)

    def convert_embedding(state, config):
        name = "model.embed_tokens.weight"
        state[name], state[name + "_scale_inv"] = fp8.quantize(state[name], BLOCK)

    tiny.edit_checkpoint(embedded, convert_embedding)
    (model, _), (plain, _) = (load_target(str(embedded), torch.float32, "cpu", keep_quantized=keep)
                              for keep in (True, False))
    embedding = model.get_input_embeddings().weight
    assert not is_stand_in(embedding) and torch.equal(embedding, plain.get_input_embeddings().weight)
    ids = torch.tensor([list(range(3, 30))])
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, plain(input_ids=ids).logits)


def test_an_fp8_drafter_kept_drafts_the_dequantized_drafters_trees(checkpoints):
    """keep_quantized keeps the drafter's FP8 weights too (issue #29: an FP8 drafter on CUDA at half of bf16's memory):
    each converted drafter Linear holds the checkpoint's bytes and scales, and a session drafts the trees of the
    drafter dequantized at load, node for node and log-prob for log-prob (float32 on a CPU); through the static
    drafter (the function its CUDA graphs capture) the same trees, log-probs within 1e-5 as test_draft_runner holds."""

    _, _, fp8_target, fp8_draft, _ = checkpoints
    kept_pair, plain_pair = (load_pair(str(fp8_target), str(fp8_draft), keep_quantized=keep) for keep in (True, False))
    stored = load_file(str(fp8_draft / "model.safetensors"))
    kept = {n: m for n, m in kept_pair.drafter.named_modules() if isinstance(m, fp8.Fp8Linear)}
    assert kept and set(f"{n}.weight" for n in kept) == {k.removesuffix("_scale_inv") for k in stored
                                                         if k.endswith("_scale_inv")}
    for name, m in kept.items():
        assert torch.equal(m.weight.view(torch.uint8), stored[f"{name}.weight"].view(torch.uint8)), name
    assert not any(isinstance(m, fp8.Fp8Linear) for m in plain_pair.drafter.modules())
    assert (kept_pair.draft_precision, plain_pair.draft_precision) == (KEPT_LABEL, LABEL)
    tiny.assert_kept_drafter_drafts_as_plain(kept_pair, plain_pair)


@pytest.mark.parametrize("fused", [False, True], ids=["plain", "fused"])
def test_runner_with_fp8_weights_kept_decodes_the_hand_dequantized_greedy(checkpoints, fused):
    """The static runner over Fp8Linear weights on the CPU (the function its CUDA graphs capture, the FP8 GEMM there):
    its greedy and its DDTree (the FP8 drafter's trees) equal the hand-dequantized model's own greedy, token for
    token, in float32. Fused: the FP8 parts stacked (bytes and scales as one storage), the official layout's bf16
    in_proj_b / in_proj_a a run of their own, parts that are not whole 128-row blocks not stacked after."""
    from ddtree_viz.engine.fused import FusedRuns

    _, _, fp8_target, fp8_draft, reference = checkpoints
    pair, runner = tiny.kept_runner(fp8_target, fp8_draft, fused)
    if fused:
        gdn, attention, mlp = runner._fused[0, "mixer"], runner._fused[3, "mixer"], runner._fused[0, "mlp"]
        # qkv (64 rows: a partial block) and z in FP8, each its own run; b + a plain, one run
        assert isinstance(gdn, FusedRuns) and gdn.counts == (1, 1, 2)
        assert [type(r).__name__ for r in gdn.runs] == ["FusedFp8Linear", "FusedFp8Linear", "FusedLinear"]
        assert isinstance(attention, FusedRuns) and attention.counts == (2, 1)  # q (128 rows) + k; v after k's 32
        assert isinstance(mlp, fp8.FusedFp8Linear) and mlp.weight.dtype == torch.float8_e4m3fn
        layer = pair.target.model.layers[0].mlp
        assert layer.up_proj.weight.data_ptr() == mlp.weight[layer.gate_proj.out_features].data_ptr()
        assert layer.up_proj.weight_scale_inv.data_ptr() == mlp.scale[3].data_ptr()  # 384 rows: 3 scale rows
    tiny.assert_runner_decodes_as(pair, runner, reference)


def test_a_bad_drafter_is_refused_by_the_cli(checkpoints, tmp_path, capsys):
    """The CLI says it in one line, exit 2, with the drafter's weight named."""
    _, _, fp8_target, fp8_draft, _ = checkpoints
    broken = tmp_path / "draft"
    shutil.copytree(fp8_draft, broken)
    tiny.edit_checkpoint(broken, lambda s, c: s.pop("fc.weight_scale_inv"))
    rc = cli.main(["run", "--target", str(fp8_target), "--draft", str(broken), "--prompt", "x", "--max-new-tokens", "2"])
    err = capsys.readouterr().err
    assert rc == 2 and "error: drafter weight fc.weight is float8_e4m3fn but has no scales" in err
    assert "Traceback" not in err


# ---- the precision audit (analyze --target-b / --draft-b / --dtype-b)

PROMPTS = "def f(x):\n\nclass A:\n\nimport os\n\nfor i in range(10):\n"


def _analyze(tmp_path, capsys, *flags):
    (tmp_path / "p.txt").write_text(PROMPTS)
    out = tmp_path / "out"
    rc = cli.main(["analyze", "--prompts", str(tmp_path / "p.txt"), "--out", str(out), "--max-new-tokens", "24",
                   "--budget", "4", "--no-speedup", *flags])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    return out, json.loads((out / "summary.json").read_text()), captured


def test_precision_audit_sets_a_target_beside_its_fp8_checkpoint(checkpoints, tmp_path, capsys):
    """A: the plain pair; B: the FP8 target with A's drafter. Each side's figures are its own traces'; where the two
    greedy decodings part is computed from the traces; the report shows the audit and the loud warning."""
    target, draft, fp8_target, _, _ = checkpoints
    out, summary, captured = _analyze(tmp_path, capsys, "--target", str(target), "--draft", str(draft),
                                      "--target-b", str(fp8_target))
    audit = summary["precision_audit"]
    assert (audit["a"]["target_precision"], audit["b"]["target_precision"]) == ("float32", LABEL)
    assert audit["a"]["draft_precision"] == audit["b"]["draft_precision"] == "float32"
    assert audit["a"]["mean_acceptance"] == summary["mean_acceptance"]
    assert audit["b"]["mean_acceptance"] == summary["b"]["mean_acceptance"]
    assert audit["b"]["per_depth_acceptance"] == summary["b"]["per_depth_acceptance"]
    assert audit["a"]["decode_tok_s"] > 0 and audit["b"]["decode_tok_s"] > 0
    assert audit["prompts_compared"] == 4
    for row in audit["per_prompt"]:
        a, b = Trace.load(out / row["file_a"]), Trace.load(out / row["file_b"])
        assert b.settings["target_precision"] == LABEL and b.prompt_ids == a.prompt_ids
        n = min(len(a.greedy_ids), len(b.greedy_ids))
        parted = [k for k in range(n) if a.greedy_ids[k] != b.greedy_ids[k]]
        assert row["part_at"] == (parted[0] if parted else None)
    report = (out / "report.html").read_text()
    assert "<h2>Precision audit</h2>" in report and "id=audit" in report
    if audit["a"]["mean_acceptance"] <= 1.05:  # the tiny random drafter: the warning is loud
        assert "class=warning role=alert" in report and "WARNING: A: mean acceptance" in captured.err
    assert f"B: target {LABEL}, drafter float32" in captured.out


def test_part_margin_is_the_targets_own(checkpoints, tmp_path, capsys):
    """A: the FP8 pair in float32; B: the same in bfloat16. Where they part (past the first token), A's margin is
    the target's top-1 minus top-2 logit there, as a plain forward of the hand-dequantized model computes it."""
    _, _, fp8_target, fp8_draft, reference = checkpoints
    out, summary, _ = _analyze(tmp_path, capsys, "--target", str(fp8_target), "--draft", str(fp8_draft),
                               "--dtype-b", "bfloat16")
    audit = summary["precision_audit"]
    assert audit["b"]["target_precision"] == "fp8-e4m3 block 128 (dequantized to bfloat16)"
    later = [row for row in audit["per_prompt"] if row["part_at"]]
    assert later, "no prompt parts past its first token"
    for row in later:
        a = Trace.load(out / row["file_a"])
        ids = torch.tensor([list(a.prompt_ids) + list(a.greedy_ids[:row["part_at"]])])
        with torch.no_grad():
            top = reference(ids).logits[0, -1].topk(2).values
        assert row["a_margin"] == pytest.approx((top[0] - top[1]).item(), abs=1e-4)
        assert row["a_token_id"] == a.greedy_ids[row["part_at"]] and row["b_margin"] is not None


@pytest.mark.parametrize("flags, message", [
    (["--dtype-b", "bfloat16", "--method", "both"], "decodes one method: not --method both"),
    (["--target-b", "x"], "--target-b needs its drafter: pass --draft-b"),
])
def test_audit_options_refused_before_any_model_work(tmp_path, capsys, flags, message):
    (tmp_path / "p.txt").write_text(PROMPTS)
    rc = cli.main(["analyze", "--prompts", str(tmp_path / "p.txt"), "--out", str(tmp_path / "out"), *flags])
    assert rc == 2 and message in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_mean_acceptance_of_about_one_is_warned_of_loudly():
    """The page's stats (a session from WARN_ROUNDS rounds) and the report body (report.html and the page's Analyze
    tab) both lead with the warning; a drafter that is accepted gets none."""
    from ddtree_viz.render.report import report_body
    from ddtree_viz.render.stats_view import stats_markdown

    assert stats_markdown({"mean_acceptance": 1.0, "rounds": 10}).startswith("**⚠ Warning:** mean acceptance 1.00")
    assert "Warning" not in stats_markdown({"mean_acceptance": 1.0, "rounds": 3})
    assert "Warning" not in stats_markdown({"mean_acceptance": 2.5, "rounds": 10})
    side = {"prompts": 1, "prompts_total": 1, "rounds": 12, "generated_tokens": 12, "mean_acceptance": 1.0,
            "identical_prompts": 1, "failed": [], "top_misses": [], "per_prompt": []}
    assert "class=warning role=alert" in report_body(side, {})
    assert "class=warning" not in report_body({**side, "mean_acceptance": 3.0}, {})


def test_bench_says_each_models_precision(checkpoints, tmp_path, capsys):
    """`bench` prints and writes the models' line with both precisions."""
    _, draft, fp8_target, _, _ = checkpoints
    rc = cli.main(["bench", "--target", str(fp8_target), "--draft", str(draft), "--prompt", "def f(x):",
                   "--max-new-tokens", "6", "--budget", "4", "--json", str(tmp_path / "b.json")])
    assert rc == 0
    assert f"weights: target {LABEL}, drafter float32" in capsys.readouterr().out
    assert f"weights: target {LABEL}, drafter float32" in (tmp_path / "b.json").read_text()


def test_a_hub_id_in_the_fp8_layout_is_read_by_us(checkpoints, tmp_path, monkeypatch):
    """An FP8 target given as a hub id (here from a hub cache laid out as huggingface_hub keeps one, offline) goes
    through the same reader: its weights dequantized by hand, its precision said."""
    import huggingface_hub.constants

    _, _, fp8_target, fp8_draft, reference = checkpoints
    repo = tmp_path / "hub" / "models--org--tiny-FP8"
    revision = "0" * 40
    shutil.copytree(fp8_target, repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    pair = load_pair("org/tiny-FP8", str(fp8_draft))
    assert pair.target_precision == LABEL
    name = "model.layers.0.mlp.down_proj.weight"
    assert torch.equal(pair.target.state_dict()[name], reference.state_dict()[name])
