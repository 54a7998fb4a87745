"""Django's HTTP handler with request threads kept for reuse.

Under ASGI, Django runs each request's sync code (views, ORM, signal receivers) on a thread
of the request's own: ``ASGIHandler.__call__`` enters asgiref's ``ThreadSensitiveContext``,
which starts a new one-thread executor per request and, when the request ends, a second
thread to join it. Requests were never serialized on one thread (Django >= 3.2), but each
paid two thread starts, and a burst of 100 requests started 200 threads.

``PooledASGIHandler`` hands each request a thread from a pool of idle ones instead, through
asgiref's public ``ThreadSensitiveContext(executor=...)``: all of one request's sync work
still runs on one thread (Django's connection handling needs that: each request opens its
database connection on that thread and closes it in ``request_finished``, see
``close_old_connections``), and requests still run side by side, as many at once as
arrive. ``SANDPIT_WEB_THREADS`` bounds how many idle threads are kept, not how many
requests run: a request finding none idle gets a new thread (as Django does), so long
requests (streams, commands running for minutes) can never starve the others.

A thread whose request was cancelled while its sync code still runs (the client went
away) is not reused: the next request would queue behind it. It finishes that call, closes
its database connections and exits.

One thread hop fewer per request: Django sends ``request_started`` to its two receivers
(``close_old_connections``, ``reset_queries``) on the request's thread, a hop of its own
before the view's (about 100 us of a request's CPU and three context switches here, 10
clients at once). On this server's threads both have nothing to do when connections are
not kept between requests (``CONN_MAX_AGE`` 0) and queries are not logged (DEBUG off): a
thread is reused only once ``request_finished`` ran on it, and with ``CONN_MAX_AGE`` 0 that
closed every connection it opened; a new thread has none. The web server then disconnects
them once it listens (``skip_request_started``), and Django skips the hop when no receiver
is synchronous.

And one more at the end: Django closes the response (``response.close()``, which sends
``request_finished``) on the request's thread once it is sent, a hop of its own after the
view's. A response that is whole when the view returns (not streamed, not rendered later)
is closed on the view's thread instead, at the end of the view's own hop, and the handler
skips the hop after sending it: 0.3-0.4 ms of a bare request and ~0.4 ms of its CPU here.
Whatever still runs on the thread after that (a session saved on the way out) gets
Django's close after sending, as before (``RequestThread.ran_after_close``).
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextvars import ContextVar
from typing import Any

import django
from asgiref.sync import ThreadSensitiveContext, iscoroutinefunction, sync_to_async
from django.conf import settings
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.db import close_old_connections, connections, reset_queries
from django.http import HttpResponse, HttpResponseBase
from django.urls import set_script_prefix

_busy_lock = threading.Lock()
_busy_calls = 0


def request_calls_in_progress() -> int:
    """Calls queued or running on request threads, in this process (the web server waits
    for them when it stops: see playground/webserver.py)."""
    with _busy_lock:
        return _busy_calls


def _count_call(delta: int) -> None:
    global _busy_calls  # noqa: PLW0603 - one count for the process
    with _busy_lock:
        _busy_calls += delta


class RequestThread(ThreadPoolExecutor):
    """One worker thread; knows whether a call is still queued or running on it."""

    def __init__(self) -> None:
        super().__init__(max_workers=1, thread_name_prefix="sandpit-request")
        self._lock = threading.Lock()
        self._pending = 0
        self.finished = True
        """Whether request_finished ran on it after the last call handed to it (set by the
        receiver `note_request_finished`, on this thread; cleared by each `submit`): a
        thread whose request never reached it (aborted while its body arrived) stays so."""
        self.closed_early: HttpResponseBase | None = None
        """The response its view's own call closed (`close_after_view`), if any."""
        self.ran_after_close = False
        """Whether a call was handed to it after that: its close must come after it."""

    def begin_request(self) -> None:
        self.closed_early = None
        self.ran_after_close = False

    def closed(self, response: HttpResponseBase) -> bool:
        """Whether `response` was closed on this thread with nothing run on it since."""
        return self.closed_early is response and not self.ran_after_close

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        with self._lock:
            self._pending += 1
        _count_call(1)
        self.finished = False
        if self.closed_early is not None:
            self.ran_after_close = True
        try:
            future = super().submit(fn, *args, **kwargs)
        except BaseException:
            self._done(None)
            raise
        future.add_done_callback(self._done)
        return future

    def _done(self, _future: object) -> None:
        with self._lock:
            self._pending -= 1
        _count_call(-1)

    def idle(self) -> bool:
        with self._lock:
            return self._pending == 0


class RequestThreads:
    """Idle request threads, at most `keep` of them. Used from the event loop only."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._idle: list[RequestThread] = []

    def take(self) -> RequestThread:
        thread = self._idle.pop() if self._idle else RequestThread()
        thread.begin_request()
        return thread

    def give_back(self, thread: RequestThread) -> None:
        if thread.idle() and thread.finished and len(self._idle) < self.keep:
            self._idle.append(thread)
            return
        if not thread.finished:
            # Its request ended without request_finished (cancelled, or failed sending):
            # close what it opened, after the call it may still be running.
            thread.submit(connections.close_all)
        thread.shutdown(wait=False)  # lets a still-running call finish, then it exits

    def idle_count(self) -> int:
        return len(self._idle)


SERVING_THREAD: ContextVar[RequestThread | None] = ContextVar(
    "sandpit_request_thread", default=None
)
"""The request thread of the request in this context (asgiref copies the context into the
thread for each sync call)."""


def note_request_finished(**_kwargs: object) -> None:
    """request_finished receiver, connected after Django's own: it ran, and its connections
    are closed or kept as CONN_MAX_AGE says, on this request's thread."""
    thread = SERVING_THREAD.get()
    if thread is not None:
        thread.finished = True


def closes_with_its_view(response: HttpResponseBase) -> bool:
    """Whether `response` is whole when its view returns: not streamed, nor rendered later
    (Django renders a template response after the view, on the request's thread)."""
    return isinstance(response, HttpResponse) and getattr(response, "is_rendered", True)


def close_after_view(
    view: Callable[..., HttpResponseBase], handler_class: type
) -> Callable[..., HttpResponseBase]:
    """`view`, closing its response on its own thread when it returns, where Django would
    close it in a hop of its own once it is sent (see the module docstring)."""

    @functools.wraps(view)
    def view_then_close(request: Any, *args: Any, **kwargs: Any) -> HttpResponseBase:
        response = view(request, *args, **kwargs)
        thread = SERVING_THREAD.get()
        if thread is not None and closes_with_its_view(response):
            # request_finished's sender, as the handler sets it before closing.
            response._handler_class = handler_class  # type: ignore[attr-defined]
            response.close()
            thread.closed_early = response
        return response

    return view_then_close


def request_started_has_no_work() -> bool:
    """Whether Django's request_started receivers are no-ops on this server's request
    threads: threads are reused, connections are never kept between requests and queries
    are not logged."""
    return (
        int(settings.SANDPIT_WEB_THREADS) > 0
        and not settings.DEBUG
        and all(
            connections[alias].settings_dict.get("CONN_MAX_AGE", 0) == 0 for alias in connections
        )
    )


def skip_request_started() -> bool:
    """In the web server (its ready callable): disconnect Django's request_started receivers
    where they have nothing to do (see the module docstring). Returns whether it did."""
    if not request_started_has_no_work():
        return False
    signals.request_started.disconnect(close_old_connections)
    signals.request_started.disconnect(reset_queries)
    return True


class PooledASGIHandler(ASGIHandler):
    """Django's ASGI handler, each request on a reused thread (see the module docstring).
    With `keep` 0 it is Django's own behaviour: a new thread per request."""

    def __init__(self, keep: int) -> None:
        super().__init__()
        self.threads = RequestThreads(keep)
        signals.request_finished.connect(
            note_request_finished, dispatch_uid="sandpit-request-thread-finished"
        )

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or self.threads.keep <= 0:
            await super().__call__(scope, receive, send)  # Django refuses other types
            return
        thread = self.threads.take()
        serving = SERVING_THREAD.set(thread)
        try:
            async with ThreadSensitiveContext(executor=thread):
                await self.handle(scope, receive, send)
        finally:
            SERVING_THREAD.reset(serving)
            self.threads.give_back(thread)

    def make_view_atomic(self, view: Callable[..., Any]) -> Callable[..., Any]:
        """Django's (ATOMIC_REQUESTS), and a sync view's response closed on its own thread."""
        view = super().make_view_atomic(view)
        if self.threads.keep <= 0 or iscoroutinefunction(view):
            return view
        return close_after_view(view, type(self))

    async def handle(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Django's ASGIHandler.handle, but for its last step: a response closed on its
        view's thread is not closed again. tests/playground/test_web_threads.py compares
        the two, so a Django upgrade that changes Django's fails there."""
        # Receive the HTTP request body as a stream object.
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        # Request is complete and can be served.
        set_script_prefix(get_script_prefix(scope))
        await signals.request_started.asend(sender=self.__class__, scope=scope)
        # Get the request and check for basic issues.
        request, error_response = self.create_request(scope, body_file)
        if request is None:
            body_file.close()
            await self.send_response(error_response, send)  # type: ignore[arg-type]
            await sync_to_async(error_response.close)()  # type: ignore[union-attr]
            return

        async def process_request(request: Any, send: Any) -> Any:
            response = await self.run_get_response(request)
            try:
                await self.send_response(response, send)
            except asyncio.CancelledError:
                # Client disconnected during send_response (ignore exception).
                pass

            return response

        # Try to catch a disconnect while getting response.
        tasks = [
            # Check the status of these tasks and (optionally) terminate them
            # in this order. The listen_for_disconnect() task goes first
            # because it should not raise unexpected errors that would prevent
            # us from cancelling process_request().
            asyncio.create_task(self.listen_for_disconnect(receive)),
            asyncio.create_task(process_request(request, send)),
        ]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        # Now wait on both tasks (they may have both finished by now).
        for task in tasks:
            if task.done():
                try:
                    task.result()
                except RequestAborted:
                    # Ignore client disconnects.
                    pass
                except AssertionError:
                    body_file.close()
                    raise
            else:
                # Allow views to handle cancellation.
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    # Task re-raised the CancelledError as expected.
                    pass

        try:
            response = tasks[1].result()
        except asyncio.CancelledError:
            await signals.request_finished.asend(sender=self.__class__)
        else:
            thread = SERVING_THREAD.get()
            if thread is None or not thread.closed(response):
                await sync_to_async(response.close)()

        body_file.close()


def get_asgi_application() -> PooledASGIHandler:
    """As django.core.asgi.get_asgi_application, with request threads kept for reuse."""
    django.setup(set_prefix=False)
    return PooledASGIHandler(int(settings.SANDPIT_WEB_THREADS))
