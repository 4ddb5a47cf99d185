"""Reading a user's file, bounded: every reader of a file named by a user (a prompt file, a trace, a report's
records) goes through `read_limited`, so a device (`/dev/zero`, `/dev/urandom`), a pipe, a huge file, a name the
file system refuses (over 255 bytes) or a symlink loop is a clear error of the caller's kind, never a hang, a
MemoryError or a traceback. Torch-free."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

from .errors import DDTreeVizError, InputError
from .words import plural


def read_limited(path: str | Path, limit: int, what: str, *, shown: str | None = None,
                 error: type[DDTreeVizError] = InputError, too_large: Callable[[int], str] | None = None) -> str:
    """The UTF-8 text of a regular file of at most `limit` bytes. Messages name the file as `shown` (default: its
    path) and the kind of file as `what` ('prompt file', 'trace file', ...); `too_large(size)` words the size
    refusal (default: '<what> <shown> is N bytes; at most L are read'). Raises `error`."""
    shown = str(path) if shown is None else shown
    try:
        info = os.stat(path)  # follows links; a loop or an over-long name is an OSError here
        if stat.S_ISDIR(info.st_mode):
            raise error(f"{what} {shown} is a directory")
        if not stat.S_ISREG(info.st_mode):
            raise error(f"{what} {shown} is not a regular file (a device, pipe or socket is not read)")
        if info.st_size > limit:
            raise error(too_large(info.st_size) if too_large else
                        f"{what} {shown} is {plural(info.st_size, 'byte')}; at most {limit:,} are read")
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except FileNotFoundError:
        raise error(f"{what} not found: {shown}") from None
    except OSError as exc:
        raise error(f"cannot read {what} {shown}: {exc.strerror or type(exc).__name__}") from None
    if len(data) > limit:  # it grew while being read
        raise error(too_large(len(data)) if too_large else f"{what} {shown} is larger than {limit:,} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise error(f"cannot read {what} {shown}: it is not UTF-8 text") from None
