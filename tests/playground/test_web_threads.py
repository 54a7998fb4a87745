"""Django's HTTP handler on reused request threads (playground/webthreads.py), driven
in-process over ASGI: requests still run side by side, each on one thread, and a thread
still busy with a cancelled request is not handed to the next one. Without Django's
request_started receivers (as the web server runs) a request is one thread hop fewer, and
still finds no database connection left open on its thread. A response whole when its view
returns is closed on the view's thread, once: one hop fewer again, and nothing that runs on
the thread later (a query on the way out, a streamed body) escapes the close."""

from __future__ import annotations

import ast
import asyncio
import inspect
import json
import textwrap
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.testing import ApplicationCommunicator
from django.core import signals
from django.core.handlers.asgi import ASGIHandler
from django.db import close_old_connections, connections, reset_queries
from django.http import (
    FileResponse,
    HttpResponse,
    JsonResponse,
    StreamingHttpResponse,
)
from django.template import engines
from django.template.response import SimpleTemplateResponse

from playground.webthreads import (
    PooledASGIHandler,
    RequestThread,
    RequestThreads,
    closes_with_its_view,
    request_started_has_no_work,
    skip_request_started,
)
from tests.playground import threads_urls

pytestmark = pytest.mark.urls("tests.playground.threads_urls")


def scope(path: str) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"testserver")],
        "client": ("127.0.0.1", 1),
        "server": ("testserver", 80),
    }


async def whole_response(communicator: ApplicationCommunicator) -> tuple[int, bytes]:
    """The status and the whole body (streamed or not) of the request `communicator` sent."""
    start = await communicator.receive_output(30)
    body = b""
    while True:
        message = await communicator.receive_output(30)
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await communicator.wait(30)
    return start["status"], body


async def get(app: PooledASGIHandler, path: str) -> tuple[int, str]:
    communicator = ApplicationCommunicator(app, scope(path))
    await communicator.send_input({"type": "http.request", "body": b""})
    start = await communicator.receive_output(30)
    body = await communicator.receive_output(30)
    await communicator.wait(30)
    return start["status"], body["body"].decode()


async def cancel_inside_the_view(app: PooledASGIHandler, path: str) -> None:
    """Request `path` (a view that blocks on threads_urls.RELEASE) and cancel the
    application once the view is running, as daphne does when the client is gone."""
    for event in (threads_urls.RELEASE, threads_urls.ENTERED, threads_urls.LEFT):
        event.clear()
    held = ApplicationCommunicator(app, scope(path))
    await held.send_input({"type": "http.request", "body": b""})
    assert await asyncio.to_thread(threads_urls.ENTERED.wait, 20)
    held.future.cancel()
    with pytest.raises(asyncio.CancelledError):
        await held.future


def test_two_slow_requests_run_at_the_same_time() -> None:
    """Each view waits at a two-party barrier: both return only if they ran at once."""
    threads_urls.BARRIER.reset()
    app = PooledASGIHandler(keep=4)

    async def both() -> list[tuple[int, str]]:
        return list(await asyncio.gather(get(app, "/meet"), get(app, "/meet")))

    (status_a, thread_a), (status_b, thread_b) = asyncio.run(both())
    assert (status_a, status_b) == (200, 200)
    assert thread_a != thread_b
    assert app.threads.idle_count() == 2  # both kept for the next requests


def test_a_request_thread_is_reused() -> None:
    app = PooledASGIHandler(keep=4)

    async def one_after_another() -> list[tuple[int, str]]:
        return [await get(app, "/ident"), await get(app, "/ident"), await get(app, "/ident")]

    answers = asyncio.run(one_after_another())
    assert {status for status, _ in answers} == {200}
    assert len({thread for _, thread in answers}) == 1
    assert threading.get_ident() != int(answers[0][1])  # not the event loop's thread


def test_keep_zero_is_djangos_thread_per_request() -> None:
    app = PooledASGIHandler(keep=0)

    async def one_after_another() -> list[tuple[int, str]]:
        return [await get(app, "/ident"), await get(app, "/ident")]

    answers = asyncio.run(one_after_another())
    assert {status for status, _ in answers} == {200}
    assert app.threads.idle_count() == 0


def test_a_thread_still_busy_after_its_request_was_cancelled_is_not_reused() -> None:
    """daphne cancels an application that outlives its client by the close timeout; the
    view's thread still runs it. The next request must be served meanwhile (on another
    thread), not queued behind the abandoned view."""
    app = PooledASGIHandler(keep=4)

    async def scenario() -> tuple[int, str]:
        await cancel_inside_the_view(app, "/hold")
        assert app.threads.idle_count() == 0  # its thread is still busy: not kept
        try:
            answer = await get(app, "/ident")
            # Answered while the abandoned view still blocks: not queued behind it.
            assert not threads_urls.LEFT.is_set()
            return answer
        finally:
            threads_urls.RELEASE.set()

    status, _ = asyncio.run(scenario())
    assert status == 200
    assert threads_urls.LEFT.wait(20)


# --- request_started skipped on reused threads ---------------------------------------------


@pytest.fixture
def request_started_skipped() -> Iterator[None]:
    """skip_request_started as the web server calls it, undone afterwards."""
    try:
        assert skip_request_started()
        assert not signals.request_started.has_listeners()
        yield
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_started.connect(reset_queries)


class CountingThreads(RequestThreads):
    """Request threads that count the calls handed to them."""

    def __init__(self, keep: int) -> None:
        super().__init__(keep)
        self.calls = 0
        self._counting: set[int] = set()

    def take(self) -> RequestThread:
        thread = super().take()
        if id(thread) in self._counting:  # a thread kept from an earlier request
            return thread
        self._counting.add(id(thread))
        submit = thread.submit

        def counted(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return submit(fn, *args, **kwargs)

        thread.submit = counted  # type: ignore[method-assign]
        return thread


def test_without_request_started_receivers_a_request_is_one_hop_fewer() -> None:
    def hops(app: PooledASGIHandler) -> int:
        app.threads = CountingThreads(4)
        assert asyncio.run(get(app, "/ident"))[0] == 200
        return app.threads.calls

    with_receivers = hops(PooledASGIHandler(keep=4))
    assert skip_request_started()
    try:
        without = hops(PooledASGIHandler(keep=4))
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_started.connect(reset_queries)
    # Django's: request_started, the view, response.close (request_finished); the close
    # now ends the view's own hop.
    assert (with_receivers, without) == (2, 1)


@pytest.mark.django_db(transaction=True)
def test_a_reused_thread_starts_each_request_without_a_connection(
    request_started_skipped: None,
) -> None:
    threads_urls.OPENED.clear()
    app = PooledASGIHandler(keep=4)

    async def three() -> list[tuple[int, str]]:
        return [await get(app, "/database") for _ in range(3)]

    answers = [json.loads(body) for status, body in asyncio.run(three()) if status == 200]
    assert len(answers) == 3
    assert len({answer["thread"] for answer in answers}) == 1  # one thread, reused
    assert not any(answer["open_at_start"] for answer in answers)
    assert all(used.connection is None for used in threads_urls.OPENED)  # closed after each


async def failing_send(message: dict[str, Any]) -> None:
    raise OSError("the connection went away")


@pytest.mark.django_db(transaction=True)
def test_a_request_that_ended_without_request_finished_leaves_no_connection(
    request_started_skipped: None,
) -> None:
    """The response could not be sent (here: the server's send raises), so Django never
    closed the response (streamed: not closed with its view): its thread is not reused,
    and its connection is closed."""
    threads_urls.OPENED.clear()
    app = PooledASGIHandler(keep=4)

    async def scenario() -> tuple[int, str]:
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        await queue.put({"type": "http.request", "body": b""})
        with pytest.raises(OSError):
            await app(scope("/stream-database"), queue.get, failing_send)
        assert app.threads.idle_count() == 0
        return await get(app, "/database")

    status, body = asyncio.run(scenario())
    assert status == 200
    assert not json.loads(body)["open_at_start"]
    first = threads_urls.OPENED[0]
    deadline = time.monotonic() + 20
    while first.connection is not None and time.monotonic() < deadline:
        time.sleep(0.05)  # closed on its own thread, after the handler returned
    assert first.connection is None


def test_request_started_is_kept_where_it_has_work(settings: Any) -> None:
    settings.DEBUG = True  # queries are logged: reset_queries must run
    assert not request_started_has_no_work()
    settings.DEBUG = False
    settings.SANDPIT_WEB_THREADS = 0  # a thread per request: nothing to skip either way
    assert not request_started_has_no_work()
    settings.SANDPIT_WEB_THREADS = 64
    database = connections["default"].settings_dict
    kept, database["CONN_MAX_AGE"] = database.get("CONN_MAX_AGE", 0), 60
    try:  # persistent connections: close_old_connections ends those too old
        assert not request_started_has_no_work()
        assert not skip_request_started()
    finally:
        database["CONN_MAX_AGE"] = kept
    assert request_started_has_no_work()


def test_a_request_aborted_before_its_view_gives_its_thread_back() -> None:
    """The client left while its body was arriving: nothing ran on the thread, so it is
    kept as it was, without a hop to close connections it never opened."""
    app = PooledASGIHandler(keep=4)
    app.threads = CountingThreads(4)

    async def scenario() -> None:
        messages = iter([{"type": "http.disconnect"}])

        async def receive() -> dict[str, Any]:
            return next(messages)

        async def send(message: dict[str, Any]) -> None:
            raise AssertionError(f"nothing is sent to a client that left: {message}")

        await app(scope("/ident"), receive, send)

    asyncio.run(scenario())
    assert app.threads.calls == 0
    assert app.threads.idle_count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_cancelled_request_closes_its_connection_once_its_view_returns() -> None:
    """Its thread exits instead of serving again; the connection the view opened must not
    stay open behind it (it was never given back to the pool)."""
    threads_urls.OPENED.clear()
    app = PooledASGIHandler(keep=4)

    async def scenario() -> None:
        await cancel_inside_the_view(app, "/hold-database")
        assert threads_urls.OPENED[0].connection is not None  # the view still runs
        threads_urls.RELEASE.set()

    asyncio.run(scenario())
    assert threads_urls.LEFT.wait(20)
    deadline = time.monotonic() + 20
    while threads_urls.OPENED[0].connection is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threads_urls.OPENED[0].connection is None


# --- a whole response closed on its view's thread --------------------------------------------


@pytest.fixture
def finished_on() -> Iterator[list[int]]:
    """The threads request_finished ran on, in order, while the test runs."""
    seen: list[int] = []

    def record(**_kwargs: object) -> None:
        seen.append(threading.get_ident())

    signals.request_finished.connect(record, dispatch_uid="test-web-threads-finished-on")
    try:
        yield seen
    finally:
        signals.request_finished.disconnect(dispatch_uid="test-web-threads-finished-on")


def test_a_whole_response_is_closed_once_on_its_views_thread(
    request_started_skipped: None, finished_on: list[int]
) -> None:
    app = PooledASGIHandler(keep=4)
    app.threads = CountingThreads(4)
    status, body = asyncio.run(get(app, "/ident"))
    assert status == 200
    assert finished_on == [int(body)]  # once, on the thread the view ran on
    assert app.threads.calls == 1  # the view's hop, and no other
    assert app.threads.idle_count() == 1  # kept: request_finished ran on it


@pytest.mark.django_db(transaction=True)
def test_a_response_that_cannot_be_sent_was_closed_with_its_view(
    request_started_skipped: None, finished_on: list[int]
) -> None:
    """The send raises after the view closed its response: the connection it used is
    already closed, and its thread is clean to serve again."""
    threads_urls.OPENED.clear()
    app = PooledASGIHandler(keep=4)

    async def scenario() -> None:
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        await queue.put({"type": "http.request", "body": b""})
        with pytest.raises(OSError):
            await app(scope("/database"), queue.get, failing_send)

    asyncio.run(scenario())
    assert threads_urls.OPENED[0].connection is None
    assert len(finished_on) == 1
    assert app.threads.idle_count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_query_after_the_view_is_closed_after_it(
    request_started_skipped: None, finished_on: list[int], settings: Any
) -> None:
    """Middleware ran a query on the request's thread after the view had closed its
    response: Django's close follows as before, so that connection is not left open."""
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "tests.playground.threads_urls.QueryAfterTheView"]
    threads_urls.OPENED.clear()
    app = PooledASGIHandler(keep=4)
    status, body = asyncio.run(get(app, "/ident"))
    assert status == 200
    assert finished_on == [int(body), int(body)]  # with its view, then after the query
    assert len(threads_urls.OPENED) == 1
    assert threads_urls.OPENED[0].connection is None
    assert app.threads.idle_count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_streamed_response_is_closed_once_after_its_body(
    request_started_skipped: None, finished_on: list[int]
) -> None:
    threads_urls.OPENED.clear()
    app = PooledASGIHandler(keep=4)

    async def streamed() -> tuple[int, bytes]:
        communicator = ApplicationCommunicator(app, scope("/stream-database"))
        await communicator.send_input({"type": "http.request", "body": b""})
        return await whole_response(communicator)

    status, body = asyncio.run(streamed())
    assert status == 200
    assert finished_on == [int(body)]  # once, after the body, on the request's thread
    assert threads_urls.OPENED[0].connection is None


def test_a_view_that_raises_is_closed_once(
    request_started_skipped: None, finished_on: list[int]
) -> None:
    app = PooledASGIHandler(keep=4)
    status, _ = asyncio.run(get(app, "/fails"))
    assert status == 500
    assert len(finished_on) == 1


def test_which_responses_close_with_their_view(tmp_path: Any) -> None:
    template = engines["django"].from_string("hello")
    unrendered = SimpleTemplateResponse(template)
    rendered = SimpleTemplateResponse(template)
    rendered.render()
    streamed = StreamingHttpResponse(iter([b"x"]))
    (tmp_path / "file").write_bytes(b"x")
    with (tmp_path / "file").open("rb") as handle:
        a_file = FileResponse(handle)
        assert not closes_with_its_view(a_file)
    assert closes_with_its_view(HttpResponse(b"x"))
    assert closes_with_its_view(JsonResponse({"x": 1}))
    assert closes_with_its_view(rendered)
    assert not closes_with_its_view(unrendered)  # Django renders it after the view
    assert not closes_with_its_view(streamed)


def _body_without_docstring(function: Any) -> list[ast.stmt]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    definition = tree.body[0]
    assert isinstance(definition, ast.AsyncFunctionDef)
    body = definition.body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return body


class _OursAsDjangos(ast.NodeTransformer):
    """Our handle's one change undone (its last step closes every response again), and
    our type annotations dropped (Django's has none)."""

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> Any:
        node.returns = None
        for argument in node.args.args:
            argument.annotation = None
        return self.generic_visit(node)

    def visit_If(self, node: ast.If) -> Any:
        if "closed(response)" in ast.unparse(node.test):
            return node.body
        return self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> Any:
        if ast.unparse(node) == "thread = SERVING_THREAD.get()":
            return None
        return node


def test_our_handle_is_djangos_but_for_its_last_step() -> None:
    """PooledASGIHandler.handle is a copy of Django's with one change. A Django upgrade
    that changes Django's fails here: compare the two again, and copy it afresh."""
    ours = _body_without_docstring(PooledASGIHandler.handle)
    ours = [_OursAsDjangos().visit(statement) for statement in ours]
    djangos = _body_without_docstring(ASGIHandler.handle)
    dump = ast.Module(body=ours, type_ignores=[])
    assert ast.dump(ast.fix_missing_locations(dump)) == ast.dump(
        ast.Module(body=djangos, type_ignores=[])
    )
