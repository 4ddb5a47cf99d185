"""Downloads and exports served only to the browser that made them (issue #27, D13).

gradio serves a returned file at `/gradio_api/file=<its cache path>` to any client that has the URL, until
--file-ttl. A page that --share or --host opens to other people would then hand a tab's trace (its prompt and
output) to whoever learns the link (a proxy's log, a pasted URL). So every browser gets a random cookie (COOKIE,
HttpOnly, set on its first request), each file a tab downloads or exports is recorded with the cookie of the
request that made it (FileOwners.offer), and FileGuard answers 404 to a request for a recorded file that does not
carry one of its owners' cookies. The cookie is the browser's, not the tab's: tabs of one browser share it (a
browser tab's session id lives in its page script, which a plain link click cannot send). Files gradio serves for
itself (its assets, the user's own uploads) are not recorded and stay as they were.
"""
from __future__ import annotations

import os
import secrets
import threading
from http.cookies import SimpleCookie
from pathlib import Path

import gradio as gr

COOKIE = "ddv_client"
FILE_ROUTE = "/file="  # gradio's route for the files it serves: <root>/gradio_api/file=<path>


class FileOwners:
    """Which browsers (cookies) may fetch each downloaded or exported file, by its path in gradio's cache."""

    def __init__(self) -> None:
        self._owners: dict[str, set[str | None]] = {}
        self._lock = threading.Lock()

    def offer(self, component: gr.components.Component, path: Path, request: gr.Request | None) -> str:
        """Put `path` in gradio's cache now (gradio's own copy: the returned path is already there, so gradio serves
        it as is) and record the requesting browser as an owner. Without a cookie nobody may fetch it. Records of
        files gradio's delete_cache has removed go here too."""
        cached = os.path.realpath(component.move_resource_to_block_cache(str(path)))
        owner = _request_cookie(request)
        with self._lock:
            for gone in [p for p in self._owners if not os.path.exists(p)]:
                del self._owners[gone]
            self._owners.setdefault(cached, set()).add(owner)
        return cached

    def may_fetch(self, path: str, owner: str | None) -> bool:
        """True for a file nobody recorded (gradio's own), or when `owner` is one of its owners."""
        with self._lock:
            owners = self._owners.get(os.path.realpath(path))
        return owners is None or (owner is not None and owner in owners)


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
    """ASGI middleware around gradio's app: the cookie for every browser, and the owners' check on file requests."""

    def __init__(self, app, owners: FileOwners) -> None:
        self.app, self.owners = app, owners

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        cookie = _scope_cookie(scope)
        path = scope.get("path", "")
        if FILE_ROUTE in path and not self.owners.may_fetch(path.partition(FILE_ROUTE)[2], cookie):
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
