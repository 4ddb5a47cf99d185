"""Per-phase times of a round (draft, tree, verify, commit) that are right on a GPU and cost it nothing extra.

Timing a phase with the host clock needs a device wait at its end, and those waits are not free: the host
stops queueing work while the GPU drains. On one CUDA device, `PhaseClock` records a CUDA event at each phase
boundary instead and reads the times once, after the round's last event: the GPU timeline gives each phase
its own share (a host-only phase, such as building the tree, shows as the gap between its events: the GPU is
idle then). Anywhere else (the CPU, a target split over several GPUs) it keeps the wall clock after waiting
for every device (`sync`), as before.
"""

from __future__ import annotations

import time

import torch


def single_cuda_device(*models) -> torch.device | None:
    """The CUDA device when every parameter of `models` sits on that one device, else None."""
    devices = {p.device for m in models if m is not None for p in m.parameters()}
    if len(devices) == 1:
        (device,) = devices
        if device.type == "cuda":
            return device
    return None


class PhaseClock:
    """`lap(name)` at the end of each phase, `times()` once after the last: {name: milliseconds}."""

    def __init__(self, sync, cuda_device: torch.device | None = None):
        self._sync, self._device = sync, cuda_device
        self._names: list[str] = []
        if cuda_device is None:
            self._times: dict[str, float] = {}
            self._clock = time.perf_counter()
        else:
            self._events = [self._event()]

    def _event(self):
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self._device))
        return event

    def lap(self, name: str) -> None:
        if self._device is None:
            self._sync()
            now = time.perf_counter()
            self._times[name] = (now - self._clock) * 1e3
            self._clock = now
        else:
            self._names.append(name)
            self._events.append(self._event())

    def times(self) -> dict[str, float]:
        if self._device is None:
            return dict(self._times)
        self._events[-1].synchronize()
        return {name: float(a.elapsed_time(b)) for name, a, b in zip(self._names, self._events, self._events[1:])}


class Timing:
    """How a session's rounds are timed, shared by the round and the scheduler: `on` (the session's time_phases:
    each phase timed), `sync` (wait for the devices) and the one CUDA device the models sit on (None: the wall
    clock after a wait)."""

    def __init__(self, on: bool, sync, cuda_device: torch.device | None):
        self.on, self.sync, self.cuda_device = bool(on), sync, cuda_device

    def round_clock(self) -> PhaseClock | None:
        """A round's clock where its phases are timed (None: untimed, no waits)."""
        return PhaseClock(self.sync, self.cuda_device) if self.on else None

    def queued_clock(self) -> PhaseClock | None:
        """The clock of work queued for the next round: where the rounds are timed, or on one GPU (CUDA events
        cost no wait there)."""
        return PhaseClock(self.sync, self.cuda_device) if self.on or self.cuda_device is not None else None
