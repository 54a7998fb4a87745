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
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from contextvars import ContextVar
from typing import Any

import django
from asgiref.sync import ThreadSensitiveContext
from django.conf import settings
from django.core import signals
from django.core.handlers.asgi import ASGIHandler
from django.db import close_old_connections, connections, reset_queries


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

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        with self._lock:
            self._pending += 1
        self.finished = False
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

    def idle(self) -> bool:
        with self._lock:
            return self._pending == 0


class RequestThreads:
    """Idle request threads, at most `keep` of them. Used from the event loop only."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._idle: list[RequestThread] = []

    def take(self) -> RequestThread:
        return self._idle.pop() if self._idle else RequestThread()

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


def get_asgi_application() -> PooledASGIHandler:
    """As django.core.asgi.get_asgi_application, with request threads kept for reuse."""
    django.setup(set_prefix=False)
    return PooledASGIHandler(int(settings.SANDPIT_WEB_THREADS))
