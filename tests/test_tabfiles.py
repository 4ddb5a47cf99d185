"""Issue #64, class 1: a tab's files reach no other client, under any route gradio registers.

The real app (build_app, gradio's App.create_app with main's middleware list) is called as uvicorn calls it: the
raw request target as a client sent it (no client-side normalizing of `..` or `//`), the path percent-decoded once.
Every route of its table whose path has a parameter is asked for a recorded file in that parameter, spelled every
way below, by a client without a cookie and one with another cookie: none gets the file's bytes, and the owner
gets them wherever the app without the guard served them. A route form gradio adds (or this project mounts) that
serves files by path is probed the same way, so an unguarded one fails here."""
from __future__ import annotations

import asyncio
import os
import secrets
from types import SimpleNamespace
from urllib.parse import quote, unquote

import gradio as gr
import pytest
from fastapi.responses import FileResponse
from starlette.routing import BaseRoute, Mount, Route, WebSocketRoute, compile_path

from ddtree_viz.page.host import ModelHost
from ddtree_viz.page.web.tabfiles import COOKIE, FileOwners, file_guard

OWNER, OTHER = "owner-cookie", "other-cookie"
FILE_FORMS = {"/gradio_api/file={path_or_url:path}", "/gradio_api/file/{path:path}"}  # gradio 6.31's, found below
DUMMY = {"int": "0", "float": "0", "uuid": "00000000-0000-0000-0000-000000000000"}  # other parameters' values


def route_table(routes: list[BaseRoute], prefix: str = "") -> list[tuple[str, frozenset[str]]]:
    """(path template, methods) of every HTTP route, included routers and mounts opened. A route kind this does not
    know fails the test: a new kind could serve files unprobed."""
    table = []
    for route in routes:
        if hasattr(route, "effective_candidates"):  # FastAPI 0.165's included router (gradio's /gradio_api routes)
            table += route_table(route.effective_candidates(), prefix)
            table += route_table(route.effective_low_priority_routes(), prefix)
        elif isinstance(route, Mount):
            table += route_table(route.routes or [], prefix + route.path)
        elif isinstance(route, WebSocketRoute):
            continue  # FileGuard passes websockets through; gradio 6.31 serves no file over one
        elif isinstance(route, Route) or type(route).__name__ == "_EffectiveRouteContext":
            table.append((prefix + route.path, frozenset(route.methods or {"GET"})))
        else:
            raise AssertionError(f"a route kind this test does not know: {route!r}")
    return table


def spellings(path: str) -> list[str]:
    """A recorded file's real path as a raw request target could carry it."""
    parent, name = os.path.split(path)
    return [*LEAKED(path), path.lstrip("/"), "".join(f"%{b:02X}" for b in path.encode()), path.replace("/", "//"),
            "/" + path, quote(os.path.relpath(path), safe=""), path.upper(), quote(quote(path, safe=""), safe=""),
            parent + "/" + "".join(f"%{b:02X}" for b in name.encode())]


def LEAKED(path: str) -> list[str]:  # noqa: N802 - a table: spellings gradio 6.31's file routes serve unguarded
    parent, name = os.path.split(path)
    return [path, quote(path, safe=""), os.path.relpath(path), f"{parent}/./../{os.path.basename(parent)}/./{name}",
            path + "/.", path + "/x/.."]


def probes(template: str, path: str) -> list[str]:
    """Raw targets for `template`, the file's path spelled each way in each parameter (the others plain)."""
    _, fmt, convertors = compile_path(template)
    plain = {k: DUMMY.get(type(c).__name__.removesuffix("Convertor").lower(), "x") for k, c in convertors.items()}
    return [fmt.format(**{**plain, param: spelled}) for param in convertors for spelled in spellings(path)]


def fetch(app, method: str, target: str, cookie: str | None) -> tuple[int, bytes]:
    """One request as uvicorn hands it to the app: (status, body; 500 where the app raised, what came so far)."""
    raw, _, query = target.partition("?")
    headers = [(b"host", b"testserver")] + ([(b"cookie", f"{COOKIE}={cookie}".encode())] if cookie else [])
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
             "scheme": "http", "path": unquote(raw), "raw_path": raw.encode(), "query_string": query.encode(),
             "root_path": "", "headers": headers, "client": ("127.0.0.1", 1), "server": ("testserver", 80)}
    got = {"status": 0, "body": b""}
    sent = [False]

    async def receive():
        if sent[0]:
            await asyncio.sleep(3600)  # the client stays connected
        sent[0] = True
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        if message["type"] == "http.response.start":
            got["status"] = message["status"]
        elif message["type"] == "http.response.body":
            got["body"] += message.get("body", b"")

    async def run():
        try:
            await asyncio.wait_for(app(scope, receive, send), timeout=3)
        except Exception:  # noqa: BLE001 - an error (or a stream left open) serves what it sent
            got["status"] = got["status"] or 500

    asyncio.run(run())
    return got["status"], got["body"]


@pytest.fixture(scope="module")
def demo():
    from ddtree_viz.page.web.app import build_app

    return build_app(ModelHost(None, None, "float32", "cpu"))


@pytest.fixture(scope="module")
def recorded(demo, tmp_path_factory):
    """A trace file downloaded by OWNER's browser, as step_tab's `offered` records it: (its cache path, bytes)."""
    secret = f'{{"prompt": "secret {secrets.token_hex(16)}"}}'.encode()
    src = tmp_path_factory.mktemp("download") / "ddtree-trace.json"
    src.write_bytes(secret)
    button = next(b for b in demo.blocks.values() if isinstance(b, gr.DownloadButton))
    path = demo.ddtree_files.offer(button, src, SimpleNamespace(cookies={COOKIE: OWNER}))
    assert path != str(src) and open(path, "rb").read() == secret
    yield path, secret
    os.unlink(path)
    os.rmdir(os.path.dirname(path))


def create_app(demo, owners: FileOwners | None):
    from gradio.routes import App

    return App.create_app(demo, app_kwargs={"middleware": file_guard(owners)} if owners is not None else {})


def leaks(app, path: str, secret: bytes, cookies=(None, OTHER)) -> set[tuple[str, str, str]]:
    """(route template, method, target) of every probe that got the file's bytes, for any of `cookies`."""
    found = set()
    for template, methods in route_table(app.routes):
        if "{" not in template:
            continue
        for method in sorted(methods):
            for target in probes(template, path):
                for cookie in cookies:
                    status, body = fetch(app, method, target, cookie)
                    if secret in body:
                        found.add((template, method, target))
    return found


def test_no_route_serves_a_recorded_file_to_a_client_that_does_not_own_it(demo, recorded):
    path, secret = recorded
    bare = leaks(create_app(demo, None), path, secret, cookies=(None,))
    # the probe finds what it must: without the guard, both of gradio 6.31's file route forms serve the file to
    # anyone, percent-encoded, with `.` and `..`, relative to the working directory (and /file/ with a doubled
    # slash). A gradio whose routes serve it under another form fails here too: look at that form, then add it.
    assert {template for template, _, _ in bare} == FILE_FORMS, bare
    assert {target for _, _, target in bare} >= {form + spelled for form in ("/gradio_api/file=", "/gradio_api/file/")
                                                  for spelled in LEAKED(path)}
    guarded = create_app(demo, demo.ddtree_files)
    assert leaks(guarded, path, secret) == set()
    for template, method, target in sorted(bare):  # the owner's browser still gets its file, by every such form
        status, body = fetch(guarded, method, target, OWNER)
        assert status == 200 and (body == secret or method == "HEAD"), (template, method, target, status)
        assert fetch(guarded, method, target, OTHER)[0] == 404 and fetch(guarded, method, target, None)[0] == 404


def test_a_new_route_form_that_serves_files_is_guarded_too(demo, recorded):
    """A route of a form gradio does not have (the path in the middle, a query parameter) serves the file to anyone
    without the guard, and only to its owner with it: the guard goes by the file served, not by a URL form."""
    path, secret = recorded

    def serve(p: str):
        return FileResponse(os.path.abspath(p))

    for owners in (None, demo.ddtree_files):
        app = create_app(demo, owners)
        app.add_api_route("/x/{p:path}/raw", serve, methods=["GET"])
        app.add_api_route("/y", serve, methods=["GET"])  # ?p=<path>
        new = leaks(app, path, secret) | {("/y", "GET", f"/y?p={s}") for s in spellings(path)
                                         if secret in fetch(app, "GET", f"/y?p={s}", None)[1]}
        if owners is None:
            assert {t for t, _, _ in new} == FILE_FORMS | {"/x/{p:path}/raw", "/y"}, new
        else:
            assert new == set()
            assert fetch(app, "GET", f"/x/{path}/raw", OWNER) == (200, secret)
            assert fetch(app, "GET", f"/y?p={quote(path, safe='')}", OWNER) == (200, secret)


def test_unrecorded_files_are_served_as_before(demo, recorded):
    """gradio's own files (an upload: not recorded) still reach any client; nothing recorded, nothing refused."""
    from gradio.utils import get_upload_folder

    upload = os.path.join(get_upload_folder(), secrets.token_hex(8), "upload.txt")
    os.makedirs(os.path.dirname(upload))
    try:
        with open(upload, "wb") as f:
            f.write(b"an upload")
        app = create_app(demo, demo.ddtree_files)
        assert fetch(app, "GET", f"/gradio_api/file={upload}", None) == (200, b"an upload")
        assert fetch(app, "GET", f"/gradio_api/file/{upload}", OTHER) == (200, b"an upload")
    finally:
        os.unlink(upload)
        os.rmdir(os.path.dirname(upload))
    owners = FileOwners()
    assert not owners.refuses({f"/gradio_api/file={recorded[0]}"}, None)  # nothing recorded: nothing refused


def test_an_event_cannot_be_handed_another_browsers_download(demo, recorded):
    """The gap beside the routes: a client handing a handler (/replay, a report upload) the cache path of another
    browser's download as its file input. The handlers' check refuses it by the file's identity (any spelling);
    the owner, and files nobody recorded, pass."""
    from ddtree_viz.errors import InputError

    path, _ = recorded
    owners = demo.ddtree_files
    for cookie in (None, OTHER):
        for form in (path, path.replace("/", "//"), os.path.relpath(path)):
            with pytest.raises(InputError, match="belongs to another browser"):
                owners.check_inputs(form, SimpleNamespace(cookies={COOKIE: cookie} if cookie else {}))
        with pytest.raises(InputError, match="belongs to another browser") as refused:
            owners.check_inputs([__file__, path], SimpleNamespace(cookies={}))
        # the file named by its base name, never the server's folder (issue #65 item 7)
        assert os.path.basename(path) in str(refused.value) and os.path.dirname(path) not in str(refused.value)
    owners.check_inputs(path, SimpleNamespace(cookies={COOKIE: OWNER}))
    owners.check_inputs([__file__], SimpleNamespace(cookies={}))
    owners.check_inputs(None, None)
