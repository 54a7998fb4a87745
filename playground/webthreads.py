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
away) is not reused: the next request would queue behind it. It finishes that call and
exits.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import django
from asgiref.sync import ThreadSensitiveContext
from django.conf import settings
from django.core.handlers.asgi import ASGIHandler


class RequestThread(ThreadPoolExecutor):
    """One worker thread; knows whether a call is still queued or running on it."""

    def __init__(self) -> None:
        super().__init__(max_workers=1, thread_name_prefix="sandpit-request")
        self._lock = threading.Lock()
        self._pending = 0

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        with self._lock:
            self._pending += 1
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
        if thread.idle() and len(self._idle) < self.keep:
            self._idle.append(thread)
        else:  # lets a still-running call finish, then the thread exits
            thread.shutdown(wait=False)

    def idle_count(self) -> int:
        return len(self._idle)


class PooledASGIHandler(ASGIHandler):
    """Django's ASGI handler, each request on a reused thread (see the module docstring).
    With `keep` 0 it is Django's own behaviour: a new thread per request."""

    def __init__(self, keep: int) -> None:
        super().__init__()
        self.threads = RequestThreads(keep)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or self.threads.keep <= 0:
            await super().__call__(scope, receive, send)  # Django refuses other types
            return
        thread = self.threads.take()
        try:
            async with ThreadSensitiveContext(executor=thread):
                await self.handle(scope, receive, send)
        finally:
            self.threads.give_back(thread)


def get_asgi_application() -> PooledASGIHandler:
    """As django.core.asgi.get_asgi_application, with request threads kept for reuse."""
    django.setup(set_prefix=False)
    return PooledASGIHandler(int(settings.SANDPIT_WEB_THREADS))
