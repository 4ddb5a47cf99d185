"""A CUDA graph launched before its inputs are known: the verify's launch off a round's critical path.

A verify graph at Qwen3.6-27B shapes is ~1,240 kernels; its replay() costs the host 0.45-0.8 ms (gpu_bench's
`graph_launch`), and in a round it can only start once the host has built the tree and staged it, so the device
waits for the launch (docs/lab/NOTEBOOK.md section 17). Launched ahead, the graph is queued on a stream of its own behind
a wait on a device word (the CUDA driver's stream memory operations: cuStreamWaitValue32 / cuStreamWriteValue32,
no kernel, no SM held), while the device still runs the draft; the host builds the tree, queues the inputs' copies
and then the word's write on the main stream, and the graph starts as soon as they land. The main stream waits for
the graph's end (an event) before anything reads its outputs.

The graph must run once the word is written whatever the host does in between: a launch not taken by a forward is
released (the word written with no new inputs: the pass runs over the last ones and its outputs are dropped; a
runner's pass writes only scratch rows past `committed`). Nothing in between may wait for the whole device (a
device-wide synchronize would wait for the graph, which waits for the host): the session launches ahead only
around its tree phase, whose only wait is on the main stream.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

WAIT_GEQ = 0x0  # CU_STREAM_WAIT_VALUE_GEQ: wait until (int32)(*word - value) >= 0


def _driver():
    """The CUDA driver's stream memory operations (the _v2 entry points, on by default since CUDA 11.7)."""
    lib = ctypes.CDLL("libcuda.so.1")
    fns = []
    for name in ("cuStreamWaitValue32_v2", "cuStreamWriteValue32_v2"):
        fn = getattr(lib, name)
        fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
        fn.restype = ctypes.c_int
        fns.append(fn)
    return fns


class DeviceWord:
    """One int32 on the device that a stream waits on and another writes: `ticket()` a new value, `wait` queues
    a wait for it on a stream, `write` queues its write."""

    def __init__(self, device: torch.device):
        self._wait, self._write = _driver()
        self.word = torch.zeros(1, dtype=torch.int32, device=device)
        self.value = 0

    def ticket(self) -> int:
        self.value = (self.value + 1) & 0x7FFFFFFF
        return self.value

    def _call(self, fn, stream: torch.cuda.Stream, value: int, flags: int) -> None:
        rc = fn(ctypes.c_void_p(stream.cuda_stream), ctypes.c_uint64(self.word.data_ptr()), ctypes.c_uint32(value),
                ctypes.c_uint(flags))
        if rc != 0:
            raise RuntimeError(f"CUDA driver error {rc} in a stream memory operation")

    def wait(self, stream: torch.cuda.Stream, value: int) -> None:
        self._call(self._wait, stream, value, WAIT_GEQ)

    def write(self, stream: torch.cuda.Stream, value: int) -> None:
        self._call(self._write, stream, value, 0)


def device_word(device: torch.device) -> tuple[DeviceWord | None, str | None]:
    """A DeviceWord where the driver has stream memory operations and they work (a write on one stream releasing
    a wait on another, waited for here), else (None, why not)."""
    if device.type != "cuda":
        return None, "no CUDA device"
    try:
        word = DeviceWord(device)
        waiter, writer = torch.cuda.Stream(device), torch.cuda.current_stream(device)
        value = word.ticket()
        word.write(writer, value)  # written first: the wait below can never hang
        word.wait(waiter, value)
        waiter.synchronize()
        return word, None
    except (OSError, AttributeError, RuntimeError) as exc:
        return None, f"{type(exc).__name__}: {exc}"


@dataclass
class Launched:
    """A graph queued behind a DeviceWord's value on `stream`; `done` is recorded after it."""

    slot: object
    value: int
    done: torch.cuda.Event


class LaunchAhead:
    """A runner's launches ahead on one device: `launch(slot)` queues the slot's graph behind a new value of the
    word, `take()` hands the pending launch to the forward that stages its inputs, `release(launched)` writes the
    word on the main stream and makes the main stream wait for the graph's end."""

    def __init__(self, word: DeviceWord, device: torch.device):
        self.word, self.device = word, device
        self.stream = torch.cuda.Stream(device)
        self.pending: Launched | None = None

    def launch(self, slot) -> None:
        main = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(main)  # after everything queued so far (the last commit, the draft)
        value = self.word.ticket()
        self.word.wait(self.stream, value)
        with torch.cuda.stream(self.stream):
            slot.graph.replay()
        done = torch.cuda.Event()
        done.record(self.stream)
        self.pending = Launched(slot, value, done)

    def take(self) -> Launched | None:
        launched, self.pending = self.pending, None
        return launched

    def release(self, launched: Launched | None) -> None:
        """The launch's inputs are queued (or it is dropped): the word written after them on the main stream, and
        the main stream behind the graph."""
        if launched is None:
            return
        main = torch.cuda.current_stream(self.device)
        self.word.write(main, launched.value)
        main.wait_event(launched.done)
