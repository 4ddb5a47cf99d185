"""Validation: a record against the invariants the engine guarantees (the trace contract's "what load refuses"),
each violation a TraceError naming it."""

from __future__ import annotations

from typing import Any

from ..words import plural
from ..errors import TraceError
from ..options import DRAFTER_FAMILIES, MAX_TOP_K, METHODS, TREE_SCORINGS, VERIFY_MODES
from ..treeops import check_parents, depths_of, follow, is_parent_chain
from .io import check_plain, check_text, show
from .schema import (MAX_DEPTH, MAX_NODES, MAX_TOKEN_CHARS, MAX_TOKEN_ID, MAX_TOTAL_NODES, SCHEMA_VERSION,
                     VERDICT_MISMATCH, VERDICT_NOISE)

# A record of records.py (StepRecord, LayerCache, Trace), read here by its fields only: records.py calls these checks
# as it builds its records, so this module does not import it (the import graph has no circle: test_structure.py).
Record = Any

LOGPROB_SLACK = 1e-3  # a log-prob or probability may pass 0 / 1 by float rounding, no more


def _token_id(value: int, where: str) -> None:
    if not 0 <= value <= MAX_TOKEN_ID:
        raise TraceError(f"{where}: token id {value} is out of range (0..{MAX_TOKEN_ID})")


def _token_ids(values, where: str) -> None:
    for i, v in enumerate(values):
        if not 0 <= v <= MAX_TOKEN_ID:
            _token_id(v, f"{where}[{i}]")


def _at_least(value, lo, where: str, what: str = "") -> None:
    if value < lo:
        raise TraceError(f"{where}: {what or 'value'} {value} is below {lo}")


def validate_step(step: Record, where: str = "step") -> None:
    """One round against the engine's invariants: a rooted tree numbered parents first (invariant 6), depths that
    follow the parents, per-position arrays of one entry per position, an accepted path that is a parent chain
    from the root and is where the target's choices lead, the bonus the target's choice at its end, the tokens
    the round added taken from that path, sizes within the limits, log-probs <= 0, probabilities in [0, 1].
    TraceError naming the first violation."""
    parents = _check_tree(step, where)
    _check_positions(step, where)
    _check_path(step, parents, where)
    _check_round_extras(step, where)


def _check_tree(step: Record, where: str) -> list[int]:
    """The round's header and its tree: a root first, ids in order, parents before children, depths that follow
    the parents, the root holding the round's root token. Returns the parent list."""
    n = len(step.nodes)
    if n == 0 or step.nodes[0].parent != -1:
        raise TraceError(f"{where}: the first node must be the root (parent -1)")
    if n > MAX_NODES:
        raise TraceError(f"{where}.nodes: {n} tree positions; a round may hold at most {MAX_NODES}")
    _at_least(step.index, 0, f"{where}.index", "round index")
    _at_least(step.committed_len, 1, f"{where}.committed_len", "committed length")
    _token_id(step.root_token_id, f"{where}.root_token_id")
    _token_id(step.bonus_token_id, f"{where}.bonus_token_id")
    parents = []
    for i, node in enumerate(step.nodes):
        at = f"{where}.nodes[{i}]"
        if node.id != i:
            raise TraceError(f"{where}: node ids must be 0..{n - 1} in order (node {i} has id {node.id})")
        if i > 0 and not 0 <= node.parent < i:
            raise TraceError(f"{where}: node {i} has parent {node.parent}, which does not precede it")
        parents.append(node.parent)
        _token_id(node.token_id, f"{at}.token_id")
        check_text(node.token, f"{at}.token", MAX_TOKEN_CHARS)
        if i == 0:
            if node.rank != -1 or node.logprob != 0.0:
                raise TraceError(f"{at}: the root has rank -1 and log-prob 0, not rank {node.rank}, log-prob {node.logprob}")
        else:
            _at_least(node.rank, 0, f"{at}.rank", "rank")
            if node.logprob > LOGPROB_SLACK:
                raise TraceError(f"{at}.logprob: a log-prob is at most 0, not {node.logprob}")
    check_parents(parents)  # the same rule the engine's trees obey (invariant 6); checked above with clearer words
    depths = depths_of(parents)
    for i, node in enumerate(step.nodes):
        if node.depth != depths[i]:
            raise TraceError(f"{where}.nodes[{i}].depth: {node.depth}, but its parents put it at depth {depths[i]}")
        if depths[i] > MAX_DEPTH:
            raise TraceError(f"{where}.nodes[{i}]: depth {depths[i]}; a tree may be at most {MAX_DEPTH} deep")
    if step.nodes[0].token_id != step.root_token_id:
        raise TraceError(f"{where}: the root node holds token {step.nodes[0].token_id}, "
                         f"but root_token_id is {step.root_token_id}")
    return parents


def _check_positions(step: Record, where: str) -> None:
    """The per-position arrays (one entry per tree position), the top-k rows (matching entry for entry, within
    MAX_TOP_K), log-probs <= 0, probabilities in [0, 1], and the budget curve's keys 1..B."""
    n = len(step.nodes)
    for name in ("target_argmax", "target_margin", "target_choice", "target_prob", "selector_unary", "selector_pair"):
        values = getattr(step, name)
        if len(values) != n and (name == "target_argmax" or values):
            raise TraceError(f"{where}: {name} has {plural(len(values), 'entry')} for {plural(n, 'node')}")
    _token_ids(step.target_argmax, f"{where}.target_argmax")
    _token_ids(step.target_choice, f"{where}.target_choice")
    for i, m in enumerate(step.target_margin):
        _at_least(m, 0.0, f"{where}.target_margin[{i}]", "a top-1 minus top-2 margin")
    for i, prob in enumerate(step.target_prob):
        if not -LOGPROB_SLACK <= prob <= 1 + LOGPROB_SLACK:
            raise TraceError(f"{where}.target_prob[{i}]: a probability is in [0, 1], not {prob}")
    if step.target_prob and not step.target_choice:
        raise TraceError(f"{where}: target_prob without target_choice")
    for ids_name, values_name, rows in (("draft_top_ids", "draft_top_logprobs", None),
                                        ("target_top_ids", "target_top_probs", n)):
        ids, values = getattr(step, ids_name), getattr(step, values_name)
        if rows is not None and ids and len(ids) != rows:
            raise TraceError(f"{where}: {ids_name} has {plural(len(ids), 'row')} for {plural(n, 'node')}")
        if len(values) != len(ids) or any(len(a) != len(b) for a, b in zip(ids, values)):
            raise TraceError(f"{where}: {values_name} does not match {ids_name} entry for entry")
        for r, row in enumerate(ids):
            if len(row) > MAX_TOP_K:
                raise TraceError(f"{where}.{ids_name}[{r}]: {plural(len(row), 'entry')}; a trace may hold at most "
                                 f"{MAX_TOP_K}")
            _token_ids(row, f"{where}.{ids_name}[{r}]")
    for r, row in enumerate(step.draft_top_logprobs):
        if any(v > LOGPROB_SLACK for v in row):
            raise TraceError(f"{where}.draft_top_logprobs[{r}]: a log-prob is at most 0")
    for r, row in enumerate(step.target_top_probs):
        if any(not -LOGPROB_SLACK <= v <= 1 + LOGPROB_SLACK for v in row):
            raise TraceError(f"{where}.target_top_probs[{r}]: a probability is in [0, 1]")
    if any(not k.isdigit() or not isinstance(v, int) or v < 0 for k, v in step.budget_curve.items()):
        raise TraceError(f"{where}: budget_curve must map budgets (whole numbers as strings) to token counts")
    if step.budget_curve and sorted(int(k) for k in step.budget_curve) != list(range(1, len(step.budget_curve) + 1)):
        raise TraceError(f"{where}.budget_curve: the budgets must be 1, 2, ..., {len(step.budget_curve)}, none missing")


def _check_path(step: Record, parents: list[int], where: str) -> None:
    """The accepted path: from the root along parents, where the target's choices lead; the bonus the choice at
    its end; the tokens the round added taken from that path."""
    n = len(step.nodes)
    if not step.accepted or step.accepted[0] != 0 or any(not 0 <= a < n for a in step.accepted):
        raise TraceError(f"{where}: accepted path must start at the root and name existing nodes")
    if not is_parent_chain(parents, step.accepted):
        raise TraceError(f"{where}.accepted: {show(list(step.accepted))} is not a path from the root "
                         "(each position must be a child of the one before it)")
    token_ids = [node.token_id for node in step.nodes]
    walked, bonus = follow(parents, token_ids, step.choices)
    if tuple(walked) != step.accepted:
        raise TraceError(f"{where}.accepted: {show(list(step.accepted))}, but the target's choices lead along "
                         f"{show(walked)}")
    if bonus != step.bonus_token_id:
        raise TraceError(f"{where}.bonus_token_id: {step.bonus_token_id}, but the target's choice at the last "
                         f"accepted position is {bonus}")
    gained = [token_ids[a] for a in step.accepted[1:]] + [step.bonus_token_id]
    if step.new_token_ids and tuple(gained[:len(step.new_token_ids)]) != step.new_token_ids:
        raise TraceError(f"{where}.new_token_ids: {show(list(step.new_token_ids))} are not the accepted path's "
                         f"tokens and the bonus {show(gained)}")


def _check_round_extras(step: Record, where: str) -> None:
    """The round's method and verify mode, timings, the bonus's draft rank, the cache lists (one layer count) and
    the naive mode's state errors (one per layer)."""
    if step.method not in METHODS:
        raise TraceError(f"{where}.method: {show(step.method)} (one of {', '.join(METHODS)})")
    if step.verify not in VERIFY_MODES:
        raise TraceError(f"{where}.verify: {show(step.verify)} (one of {', '.join(VERIFY_MODES)})")
    if not isinstance(step.timings_ms, dict):
        raise TraceError(f"{where}: timings_ms must be an object")
    for name, ms in step.timings_ms.items():
        _at_least(ms, 0.0, f"{where}.timings_ms.{name}", "a time")
    if step.bonus_draft_rank is not None:
        _at_least(step.bonus_draft_rank, 0, f"{where}.bonus_draft_rank", "rank")
    if step.bonus_draft_logprob is not None and step.bonus_draft_logprob > LOGPROB_SLACK:
        raise TraceError(f"{where}.bonus_draft_logprob: a log-prob is at most 0, not {step.bonus_draft_logprob}")
    layers = 0
    for name in ("cache", "cache_before_commit"):
        _check_cache(getattr(step, name), f"{where}.{name}")
        layers = layers or len(getattr(step, name))
    if step.cache and step.cache_before_commit and len(step.cache) != len(step.cache_before_commit):
        raise TraceError(f"{where}: cache has {plural(len(step.cache), 'layer')}, cache_before_commit "
                         f"{len(step.cache_before_commit)}")
    if step.naive_state_error:
        if layers and len(step.naive_state_error) != layers:
            raise TraceError(f"{where}: naive_state_error has {plural(len(step.naive_state_error), 'entry')} for "
                             f"{plural(layers, 'layer')}")
        for i, e in enumerate(step.naive_state_error):
            if e is not None:
                _at_least(e, 0.0, f"{where}.naive_state_error[{i}]", "a distance")


def _check_cache(layers: tuple[Record, ...], where: str) -> None:
    for j, layer in enumerate(layers):
        at = f"{where}[{j}]"
        if layer.layer != j:
            raise TraceError(f"{at}.layer: {layer.layer}, but the entries are layers 0, 1, ... in order")
        _at_least(layer.bytes, 0, f"{at}.bytes", "a size")
        if layer.kv_length is not None:
            _at_least(layer.kv_length, 0, f"{at}.kv_length", "a length")
        for t, tensor in enumerate(layer.tensors):
            for d, size in enumerate(tensor.shape):
                _at_least(size, 0, f"{at}.tensors[{t}].shape[{d}]", "a size")


# what the known settings may be (others are kept as they are: fields may be added within a schema version)
def _check_settings(settings: dict[str, Any], where: str) -> None:
    check_plain(settings, where)

    def need(key, ok, what):
        if key in settings and not ok(settings[key]):
            raise TraceError(f"{where}.{key}: expected {what}, got {show(settings[key])}")

    def whole(lo):
        return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= lo

    def number(lo, hi):
        return lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and lo <= v <= hi

    need("budget", whole(1), "a whole number >= 1")
    need("block_size", lambda v: whole(2)(v) and v <= MAX_DEPTH + 1, f"a whole number from 2 to {MAX_DEPTH + 1}")
    need("max_new_tokens", whole(1), "a whole number >= 1")
    need("method", lambda v: v in METHODS, " or ".join(METHODS))
    need("tree_scoring", lambda v: v in TREE_SCORINGS, " or ".join(TREE_SCORINGS))
    need("drafter_family", lambda v: v in DRAFTER_FAMILIES, " or ".join(DRAFTER_FAMILIES))
    need("verify", lambda v: v in VERIFY_MODES, " or ".join(VERIFY_MODES))
    for key in ("dtype", "device", "engine", "reference"):
        need(key, lambda v: isinstance(v, str), "a string")
    need("temperature", number(0.0, 1e6), "a number >= 0")
    need("top_k", whole(0), "a whole number >= 0")
    need("top_p", lambda v: number(0.0, 1.0)(v) and v > 0, "a number in (0, 1]")
    need("seed", whole(0), "a whole number >= 0")
    need("noise", lambda v: v is None or isinstance(v, str), "a string or null")


def validate(trace: Record) -> Record:
    """The whole trace against its own invariants (those the engine guarantees, docs/ARCHITECTURE.md): each round
    (validate_step), rounds numbered 0, 1, ... in order, each starting where the previous one left the cache
    (committed length + its accepted path) from the token it ended on (its bonus), the output being the prefill's
    token plus what the rounds added, a first_divergence that is where output and reference first differ, cache
    lists of one entry per layer, sizes within the limits. Returns the trace; TraceError naming the first violation."""
    where = "trace"
    _check_fields(trace, where)
    _check_rounds(trace, where)
    _check_divergence(trace, where)
    return trace


def _check_fields(trace: Record, where: str) -> None:
    """The trace's own fields: names, settings, token ids and texts, times, noise figures, the verdict's name,
    the total tree size, the output within max_new_tokens, the prefill's cache list."""
    for name in ("target", "draft"):
        check_text(getattr(trace, name), f"{where}.{name}", 4096)
    _check_settings(trace.settings, f"{where}.settings")
    _token_ids(trace.prompt_ids, f"{where}.prompt_ids")
    _token_ids(trace.output_ids, f"{where}.output_ids")
    if trace.greedy_ids is not None:
        _token_ids(trace.greedy_ids, f"{where}.greedy_ids")
    for key, text in trace.token_texts.items():
        check_text(text, f"{where}.token_texts.{key}", MAX_TOKEN_CHARS)
    _at_least(trace.prefill_ms, 0.0, f"{where}.prefill_ms", "a time")
    _at_least(trace.reference_ms, 0.0, f"{where}.reference_ms", "a time")
    for name in ("numerical_noise", "tree_drift"):
        if getattr(trace, name) is not None:
            _at_least(getattr(trace, name), 0.0, f"{where}.{name}", "a distance")
    for name in ("noise_positions", "drift_positions"):
        _at_least(getattr(trace, name), 0, f"{where}.{name}", "a count")
    if trace.invalid is not None:
        check_text(trace.invalid, f"{where}.invalid", 4096)
    if trace.divergence_verdict not in (None, VERDICT_NOISE, VERDICT_MISMATCH):
        raise TraceError(f"{where}.divergence_verdict: {show(trace.divergence_verdict)} (one of null, "
                         f"{VERDICT_NOISE}, {VERDICT_MISMATCH})")
    check_total_nodes([{"nodes": s.nodes} for s in trace.steps], where)
    max_new = trace.settings.get("max_new_tokens")
    if isinstance(max_new, int) and not isinstance(max_new, bool) and len(trace.output_ids) > max_new:
        raise TraceError(f"{where}.output_ids: {plural(len(trace.output_ids), 'token')}, more than its max_new_tokens "
                         f"{max_new}")
    _check_cache(trace.prefill_cache, f"{where}.prefill_cache")


def _check_rounds(trace: Record, where: str) -> None:
    """The rounds in order, each starting where the previous one left the cache from the token it ended on, within
    the block size, cache lists of one layer count; the output the prefill's token plus what the rounds added."""
    block = trace.settings.get("block_size")
    layers = len(trace.prefill_cache)
    committed = len(trace.prompt_ids)
    made = 1  # output tokens the prefill and rounds account for; each round adds at least one
    exact = True  # every round says which tokens it added (new_token_ids), so the output is known exactly
    for i, step in enumerate(trace.steps):
        at = f"{where}.steps[{i}]"
        if step.index != i:
            raise TraceError(f"{at}.index: {step.index}, but rounds are numbered 0, 1, ... in order "
                             f"(this is round {i})")
        if i == 0:
            if not trace.prompt_ids:
                raise TraceError(f"{where}.prompt_ids: empty, but the trace has rounds")
            if not trace.output_ids:
                raise TraceError(f"{where}.output_ids: empty, but the trace has rounds (the prefill makes the first token)")
            if step.root_token_id != trace.output_ids[0]:
                raise TraceError(f"{at}.root_token_id: {step.root_token_id}, but round 1 starts from the prefill's "
                                 f"token, output_ids[0] = {trace.output_ids[0]}")
        else:
            before = trace.steps[i - 1]
            if step.root_token_id != before.bonus_token_id:
                raise TraceError(f"{at}.root_token_id: {step.root_token_id}, but round {i + 1} starts from round {i}'s "
                                 f"bonus token {before.bonus_token_id}")
            if before.new_token_ids and len(before.new_token_ids) < before.acceptance:
                raise TraceError(f"{where}.steps[{i - 1}].new_token_ids: cut short (the output ended), "
                                 "yet more rounds follow")
        if step.committed_len != committed:
            raise TraceError(f"{at}.committed_len: {step.committed_len}, but "
                             + (f"the prompt is {plural(committed, 'token')}" if i == 0 else
                                f"round {i} left {plural(committed, 'token')} in the cache "
                                f"({trace.steps[i - 1].committed_len} "
                                f"+ its accepted path of {trace.steps[i - 1].acceptance})"))
        if isinstance(block, int) and not isinstance(block, bool):
            deepest = max(node.depth for node in step.nodes)
            if deepest > block - 1:
                raise TraceError(f"{at}: a node at depth {deepest}, deeper than the block size {block} allows "
                                 f"({block - 1})")
        for name in ("cache", "cache_before_commit"):
            entries = len(getattr(step, name))
            if entries:
                layers = layers or entries
                if entries != layers:
                    raise TraceError(f"{at}.{name}: {plural(entries, 'layer')}, but the trace's cache lists have {layers}")
        if step.naive_state_error and layers and len(step.naive_state_error) != layers:
            raise TraceError(f"{at}: naive_state_error has {plural(len(step.naive_state_error), 'entry')} for "
                             f"{plural(layers, 'layer')}")
        committed += step.acceptance
        exact = exact and bool(step.new_token_ids)
        made += len(step.new_token_ids) if step.new_token_ids else 1
    if trace.steps:
        if exact:
            added = [t for s in trace.steps for t in s.new_token_ids]
            if list(trace.output_ids[1:]) != added:
                raise TraceError(f"{where}.output_ids: {plural(len(trace.output_ids), 'token')}, but they are not the "
                                 f"prefill's token followed by the {len(added)} the rounds added (new_token_ids)")
        elif len(trace.output_ids) < made:
            raise TraceError(f"{where}.output_ids: {plural(len(trace.output_ids), 'token')}, fewer than the {made} its "
                             "rounds "
                             "produced")


def _check_divergence(trace: Record, where: str) -> None:
    """first_divergence (and the margin and verdict on it) where output and reference first differ. A reference
    still decoding (reference_pending: the live page) is compared as far as it goes."""
    out, ref, recorded = trace.output_ids, trace.greedy_ids, trace.first_divergence
    if ref is None:
        if recorded is not None:
            raise TraceError(f"{where}.first_divergence: {recorded}, but there is no reference (greedy_ids is null)")
        if trace.divergence_verdict is not None:
            raise TraceError(f"{where}.divergence_verdict: given, but there is no reference (greedy_ids is null)")
        return
    if trace.reference_pending:
        if len(ref) >= len(out):
            raise TraceError(f"{where}.reference_pending: true, but greedy_ids already covers the output")
        out = out[:len(ref)]
    common = min(len(out), len(ref))
    actual = next((i for i in range(common) if out[i] != ref[i]), None)
    if actual is None and len(out) != len(ref):
        actual = common
    if recorded != actual:
        said = "identical" if actual is None else f"first different at token {actual}"
        raise TraceError(f"{where}.first_divergence: {recorded}, but output_ids and greedy_ids are {said}")
    if actual is not None and actual == len(ref) < len(out):
        raise TraceError(f"{where}.greedy_ids: {plural(len(ref), 'token')}, all equal to the output's first ones, yet "
                         "the output "
                         "goes on (the reference stops early only at end of text, where the output stops too)")
    if actual is None:
        for name in ("divergence_margin", "divergence_verdict"):
            if getattr(trace, name) is not None:
                raise TraceError(f"{where}.{name}: given, but the output is identical to its reference")
    if trace.divergence_margin is not None:
        _at_least(trace.divergence_margin, 0.0, f"{where}.divergence_margin", "a margin")


def check_total_nodes(steps: Any, where: str) -> None:
    """MAX_TOTAL_NODES over the rounds' node lists as parsed, before any node is built and checked: a trace just
    past the limit is refused at once, not after validating all of it (validate checks the built trace again)."""
    if not isinstance(steps, list):
        return
    total = sum(len(s["nodes"]) for s in steps if isinstance(s, dict) and isinstance(s.get("nodes"), (list, tuple)))
    if total > MAX_TOTAL_NODES:
        raise TraceError(f"{where}: {total} tree positions over all rounds; a trace may hold at most {MAX_TOTAL_NODES}")


def check_version(data: dict) -> None:
    version = data.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise TraceError("the trace has no integer 'schema_version': not a ddtree-viz trace")
    if version > SCHEMA_VERSION:
        raise TraceError(
            f"the trace has schema_version {version}, newer than this ddtree-viz understands "
            f"({SCHEMA_VERSION}); upgrade ddtree-viz to read it"
        )
    if version < 1:
        raise TraceError(f"unsupported schema_version {version}")
