"""Trace JSON: the contract of docs/ARCHITECTURE.md, and a lossless round trip of a real session."""

import json

import pytest

from ddtree_viz.engine.session import DecodeSession
from ddtree_viz.errors import TraceError
from ddtree_viz.trace import SCHEMA_VERSION, Trace
from tests.tiny import tiny_pair

TOP_LEVEL = {"schema_version", "target", "draft", "prompt", "prompt_ids", "output_ids", "greedy_ids",
             "first_divergence", "settings", "steps"}
STEP = {"index", "committed_len", "root_token_id", "nodes", "target_argmax", "accepted", "bonus_token_id",
        "timings_ms", "cache"}


def test_trace_round_trips_and_follows_the_contract(tmp_path):
    pair = tiny_pair("hybrid", seed=2)
    session = DecodeSession.of(pair, budget=6, max_new_tokens=12)
    session.prefill('print("<b>&amp;</b>")  # ü')
    session.run()
    trace = session.to_trace()
    path = tmp_path / "trace.json"
    trace.save(path)
    data = json.loads(path.read_text())
    assert TOP_LEVEL <= data.keys() and data["schema_version"] == SCHEMA_VERSION
    assert {"budget", "block_size", "verify", "dtype", "max_new_tokens"} <= data["settings"].keys()
    step = data["steps"][0]
    assert STEP <= step.keys()
    assert set(step["timings_ms"]) == {"draft", "tree", "verify", "commit"}
    assert step["nodes"][0]["parent"] == -1 and step["nodes"][0]["id"] == 0
    assert {"id", "parent", "depth", "token_id", "token", "logprob", "rank"} == step["nodes"][1].keys()
    assert {"layer", "type", "cache_class", "tensors", "bytes"} <= step["cache"][0].keys()
    assert data["first_divergence"] is None and data["output_ids"] == data["greedy_ids"]
    loaded = Trace.load(path)
    assert loaded == trace
    assert loaded.to_json() == trace.to_json()
    assert loaded.steps[0].acceptance == len(loaded.steps[0].accepted)


def test_saved_traces_keep_lists_and_small_objects_on_one_line(tmp_path):
    pair = tiny_pair("hybrid", seed=2)
    session = DecodeSession.of(pair, budget=12, max_new_tokens=8)
    session.prefill('x = "[1,\\n 2]"  # a string that looks like a list')
    session.run()
    trace = session.to_trace()
    path = tmp_path / "t.json"
    trace.save(path)
    text = path.read_text()
    assert Trace.load(path) == trace and json.loads(text) == json.loads(trace.to_json())
    assert len(text) < 0.8 * len(json.dumps(json.loads(text), indent=1, ensure_ascii=False))
    lines = text.splitlines()
    assert any(line.strip().startswith('{"id": 1, "parent": 0') for line in lines)  # a node: one line
    assert any(line.strip().startswith('"target_argmax": [') and line.rstrip().endswith("],") for line in lines)


def test_a_trace_past_the_total_node_limit_is_refused_before_its_nodes_are_checked():
    """#27 'Also': a trace just past MAX_TOTAL_NODES was refused after checking every node (25.8 s on the CLI)."""
    import time

    from ddtree_viz.trace import MAX_TOTAL_NODES, trace_from_dict

    half = MAX_TOTAL_NODES // 2 + 1
    data = {"schema_version": 1, "steps": [{"nodes": [{}] * half}, {"nodes": [{}] * half}]}
    start = time.perf_counter()
    with pytest.raises(TraceError, match=f"{2 * half} tree positions over all rounds; a trace may hold at most"):
        trace_from_dict(data)
    assert time.perf_counter() - start < 1.0
