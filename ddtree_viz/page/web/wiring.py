"""What the tabs' wiring shares: the page (its models, the tab's state component, the open tabs), user errors as
the page's messages, and the model events' turn-taking."""

from __future__ import annotations

import contextlib
import functools
import html
import inspect
from dataclasses import dataclass, field

import gradio as gr

from ...errors import DDTreeVizError
from ..host import ModelHost
from ..state import Tabs
from .tabfiles import FileOwners

MODEL_EVENTS = 16  # Step / Run events in flight at once (they take turns on the model)
# Model work from several tabs may be in flight at once: they take turns on the model round by round
# (ModelHost.lock, granted in order), so one tab's Run does not hold up another tab's Step.
MODEL = dict(concurrency_id="model", concurrency_limit=MODEL_EVENTS)
REPORT_EVENTS = 4  # report loads (and their round links) in flight at once
# Reading a report takes no model but may take seconds (4,096 traces validated): its own group, so a load neither
# waits for nor holds up the one-at-a-time events of other tabs (gradio's default group), nor another tab's load.
REPORTS = dict(concurrency_id="reports", concurrency_limit=REPORT_EVENTS)


@dataclass
class Page:
    """What every tab's handlers use: the app, the models, the tab's state (a gr.State of state.TabState: handlers
    change it in place), the tabs open (freed when their browser tab closes), the tab selector, and who may fetch
    the files the tabs download and export (tabfiles.py)."""

    demo: gr.Blocks
    host: ModelHost
    tab: gr.State
    tabs: Tabs
    selector: gr.Tabs
    files: FileOwners = field(default_factory=FileOwners)

    def add(self, request: gr.Request, tab) -> None:
        """Note the browser tab's state (Tabs frees it when the browser tab closes)."""
        self.tabs.add(request.session_hash, tab)


def page_message(exc: Exception) -> str:
    """An error in words for the page (unescaped: whoever shows it escapes it for its medium)."""
    if isinstance(exc, gr.Error):
        return html.unescape(str(exc.message))
    if isinstance(exc, DDTreeVizError):
        return str(exc)
    if "out of memory" in str(exc).lower():
        return f"out of memory: {exc}. Try a smaller budget or fewer new tokens."
    return f"{type(exc).__name__}: {exc}"


def page_error(exc: Exception) -> gr.Error:
    """The message gradio shows for an error. gradio renders a message as HTML, and messages quote what the user
    gave (a prompt's character, a file's name, a trace's field): escaped, so it shows as text."""
    return gr.Error(html.escape(page_message(exc), quote=False))


@contextlib.contextmanager
def _as_page_error():
    try:
        yield
    except gr.Error:
        raise
    except Exception as exc:  # noqa: BLE001
        raise page_error(exc) from None


def errors_in_status(note):
    """A decorator: an error in a handler whose first argument is the tab goes to `note(tab, message)`, whose
    outputs (the status line) are what the handler returns instead: the other panels stay as they were, with no
    error badge over them (a raised gr.Error marks every output of the event), and the message is where the user
    looks rather than in a toast."""
    def decorate(fn):
        if inspect.isgeneratorfunction(fn):
            def wrapped(t, *args, **kwargs):
                try:
                    yield from fn(t, *args, **kwargs)
                except Exception as exc:  # noqa: BLE001 - every error is the user's message here
                    yield note(t, page_message(exc))
        else:
            def wrapped(t, *args, **kwargs):
                try:
                    return fn(t, *args, **kwargs)
                except Exception as exc:  # noqa: BLE001
                    return note(t, page_message(exc))
        functools.update_wrapper(wrapped, fn)
        return wrapped
    return decorate


def shows_errors(fn):
    """User errors become a message in the page; the app keeps serving."""
    if inspect.isgeneratorfunction(fn):
        def wrapped(*args, **kwargs):
            with _as_page_error():
                yield from fn(*args, **kwargs)
    else:
        def wrapped(*args, **kwargs):
            with _as_page_error():
                return fn(*args, **kwargs)
    functools.update_wrapper(wrapped, fn)
    return wrapped
