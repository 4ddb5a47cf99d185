"""Downloads and exports served only to the browser that made them (issue #27, D13; issue #64).

gradio serves a returned file to any client that has its URL, until --file-ttl, and under more than one route
form: `/gradio_api/file=<its cache path>` and `/gradio_api/file/<path>` in gradio 6.31, each taking the path
percent-encoded, with doubled slashes, `.` and `..`, or relative to the server's working directory. A page that
--share or --host opens to other people would then hand a tab's trace (its prompt and output) to whoever learns
the link (a proxy's log, a pasted URL). So every browser gets a random cookie (COOKIE, HttpOnly, set on its first
request), each file a tab downloads or exports is recorded with the cookie of the request that made it
(FileOwners.offer), and FileGuard answers 404 to any request (any route, any method) whose path or query names a
recorded file, however spelled, without one of that file's owners' cookies. "Names" is decided by what would be
served, not by the URL's form: each stretch of the decoded path between slashes (and after a `=`) that contains a
recorded file's name is resolved as gradio resolves it (os.path.abspath, relative to the working directory) and as
the system does, and the file found is compared by identity (device and inode: symlinks, case and spelling do not
matter). The cookie is the browser's, not the tab's: tabs of one browser share it (a browser tab's session id lives
in its page script, which a plain link click cannot send). Files gradio serves for itself (its assets, the user's
own uploads) are not recorded and stay as they were.
"""
from __future__ import annotations

import os
import secrets
import threading
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from pathlib import Path
from urllib.parse import parse_qsl, unquote

import gradio as gr
from starlette.middleware import Middleware

COOKIE = "ddv_client"
MAX_SLASHES = 64  # a request naming a recorded file in a path of more segments than this is refused unchecked


@dataclass
class _Record:
    path: str  # the file's real path in gradio's cache
    owners: set[str | None] = field(default_factory=set)


def _identity(path: str) -> tuple[int, int] | None:
    """The file a path reaches (device, inode), following symlinks; None where it reaches none."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):  # missing, too long, a NUL byte
        return None
    return st.st_dev, st.st_ino


class FileOwners:
    """Which browsers (cookies) may fetch each downloaded or exported file, by the file's identity."""

    def __init__(self) -> None:
        self._files: dict[tuple[int, int], _Record] = {}
        self._lock = threading.Lock()

    def offer(self, component: gr.components.Component, path: Path, request: gr.Request | None) -> str:
        """Put `path` in gradio's cache now (gradio's own copy: the returned path is already there, so gradio serves
        it as is) and record the requesting browser as an owner. Without a cookie nobody may fetch it. Records of
        files gradio's delete_cache has removed (or whose place another file took) go here too."""
        cached = os.path.realpath(component.move_resource_to_block_cache(str(path)))
        key, owner = _identity(cached), _request_cookie(request)
        with self._lock:
            for gone in [k for k, rec in self._files.items() if _identity(rec.path) != k]:
                del self._files[gone]
            if key is not None:
                if key not in self._files or self._files[key].path != cached:
                    self._files[key] = _Record(cached)
                self._files[key].owners.add(owner)
        return cached

    def check_inputs(self, paths, request: gr.Request | None) -> None:
        """An event's file inputs (an upload's server paths) that name another browser's recorded download: refused
        (InputError), as the file routes refuse them. A client could otherwise hand a handler (/replay, a report
        upload) the cache path of a trace another tab downloaded and have it shown."""
        from ...errors import InputError

        texts = {str(p) for p in ([paths] if isinstance(paths, (str, os.PathLike)) else paths or ())}
        cookie = _request_cookie(request)
        refused = sorted(os.path.basename(t) for t in texts if self.refuses({t}, cookie))  # (never the server's folder)
        if refused:
            raise InputError(f"{', '.join(refused)}: that file belongs to another browser's session: upload a file of "
                             "your own")

    def refuses(self, texts: set[str], owner: str | None) -> bool:
        """True when any of `texts` (a request's decoded path, its query's values) names a recorded file, in any
        spelling a route could resolve, that `owner` does not own. A file nobody recorded is never refused."""
        with self._lock:
            records = {k: (rec.path, frozenset(rec.owners)) for k, rec in self._files.items()}
        names = {os.path.basename(path).casefold() for path, _ in records.values()}
        for text in texts:
            if not any(name in text.casefold() for name in names):
                continue
            stretches = _stretches(text)
            if stretches is None:
                return True
            for stretch in stretches:
                if not any(name in stretch.casefold() for name in names):
                    continue
                for form in {os.path.abspath(stretch), stretch}:  # gradio's resolution, the system's
                    key = _identity(form)
                    if key in records and (owner is None or owner not in records[key][1]) \
                            and _identity(records[key][0]) == key:
                        return True
        return False


def _stretches(text: str) -> set[str] | None:
    """Every part of `text` a route's path parameter could hold as a file path: from its start, a slash or just
    after a slash or `=`, to a slash or its end. None when the text has over MAX_SLASHES slashes."""
    slashes = [i for i, c in enumerate(text) if c == "/"]
    if len(slashes) > MAX_SLASHES:
        return None
    starts = {0, *slashes, *(i + 1 for i, c in enumerate(text) if c in "/=")}
    ends = {*slashes, len(text)}
    return {text[a:b] for a in starts for b in ends if a < b}


def _request_texts(scope) -> set[str]:
    """What a request could name a file by: its path as routes see it (percent-decoded once), decoded once more,
    and its query's values."""
    path = scope.get("path", "")
    query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
    values = [value for _, value in query]
    return {path, unquote(path), *values, *(unquote(v) for v in values)}


def _request_cookie(request: gr.Request | None) -> str | None:
    try:
        return request.cookies.get(COOKIE) if request is not None else None
    except AttributeError:  # a request with no HTTP headers (a handler called in-process)
        return None


def _scope_cookie(scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"cookie":
            jar = SimpleCookie()
            try:
                jar.load(value.decode("latin-1"))
            except Exception:  # noqa: BLE001 - a malformed Cookie header is no cookie
                continue
            if COOKIE in jar:
                return jar[COOKIE].value
    return None


class FileGuard:
    """ASGI middleware around gradio's app: the cookie for every browser, and the owners' check on every request."""

    def __init__(self, app, owners: FileOwners) -> None:
        self.app, self.owners = app, owners

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        cookie = _scope_cookie(scope)
        if self.owners.refuses(_request_texts(scope), cookie):
            await send({"type": "http.response.start", "status": 404,
                        "headers": [(b"content-type", b"text/plain; charset=utf-8")]})
            return await send({"type": "http.response.body", "body": b"Not Found"})
        if cookie is not None:
            return await self.app(scope, receive, send)
        new = f"{COOKIE}={secrets.token_urlsafe(32)}; Path=/; HttpOnly; SameSite=Lax".encode()

        async def with_cookie(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (b"set-cookie", new)]}
            await send(message)

        return await self.app(scope, receive, with_cookie)


def file_guard(owners: FileOwners) -> list[Middleware]:
    """The middleware list for gradio's launch(app_kwargs={"middleware": ...}) (app.main; the tests build the same)."""
    return [Middleware(FileGuard, owners=owners)]
