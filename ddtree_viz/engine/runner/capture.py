"""The runner's CUDA graphs: a slot's forward, commit and walk captured once (per tree size and attention length
bucket, on first use), replayed every round; the device's staging of a static tree captured as a graph of its own;
a graph's replay timed (what autotune compares). Without graphs (a CPU) each is run eagerly instead."""

from __future__ import annotations

import torch

from .buffers import Slot
from .layers import StaticModel


def capture(slot: Slot, model: StaticModel, pool):
    """(forward graph, commit graph, walk graph (walk_commit's: the walk, its copy to the host, the commit), forward
    outputs) of a slot: two warm-up runs on a side stream, then the captures; the state they mutate is the caller's
    to restore."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        warm_up(slot, model)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        slot.out = out = model.forward(slot)
    commit_graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(commit_graph, pool=pool):
        model.commit(slot)
    walk_graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(walk_graph, pool=pool):
        walk_commit(model, slot)
    return graph, commit_graph, walk_graph, out


def warm_up(slot: Slot, model: StaticModel) -> None:
    """capture's two warm-up runs of the slot's forward, walk and commit (each committing nothing: length 0), as it
    runs them on its side stream; what they change of the state is State.copy's (tests/test_runner.py)."""
    for _ in range(2):
        slot.out = model.forward(slot)
        model.walk(slot)
        slot.commit_in.zero_()  # a warm-up commits nothing (length 0), whatever the walk made of zeros
        model.commit(slot)


def walk_commit(model: StaticModel, slot: Slot) -> None:
    """Runner.queue_walk's device work, one graph where there are graphs (one launch for what was five): the walk,
    its result's copy to the host's pinned `walk_host` with `walked` recorded right after it (an external event:
    captured, the record is a node of the graph, so read_walk waits for the copy alone, not the commit), then the
    commit."""
    model.walk(slot)
    if slot.walked is not None:
        slot.walk_host.copy_(slot.walk_out, non_blocking=True)
        slot.walked.record()
    model.commit(slot)


def capture_staging(stage) -> torch.cuda.CUDAGraph:
    """`stage()` (a slot's Slot.stage_tensors from a static tree's tensors) as a CUDA graph (a warm-up run on a side
    stream first): it writes only the slot's inputs, which every forward rewrites (its temporaries in a pool of its
    own: a few small tensors)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        stage()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        stage()
    return graph


def replay(graph, eager, slot: Slot) -> None:
    """A slot's captured graph replayed, or its function run eagerly where there is none (no CUDA graphs)."""
    if graph is not None:
        graph.replay()
    else:
        eager(slot)


def replay_ms(graph, repeats: int = 5) -> float:
    """The median milliseconds of a graph's replay (after one untimed); a forward graph writes only its outputs
    and the tree's scratch K/V rows past the committed ones."""
    graph.replay()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[repeats // 2]
