"""Django's HTTP handler on reused request threads (playground/webthreads.py), driven
in-process over ASGI: requests still run side by side, each on one thread, and a thread
still busy with a cancelled request is not handed to the next one."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from asgiref.testing import ApplicationCommunicator

from playground.webthreads import PooledASGIHandler
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


async def get(app: PooledASGIHandler, path: str) -> tuple[int, str]:
    communicator = ApplicationCommunicator(app, scope(path))
    await communicator.send_input({"type": "http.request", "body": b""})
    start = await communicator.receive_output(30)
    body = await communicator.receive_output(30)
    await communicator.wait(30)
    return start["status"], body["body"].decode()


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
    for event in (threads_urls.RELEASE, threads_urls.ENTERED, threads_urls.LEFT):
        event.clear()
    app = PooledASGIHandler(keep=4)

    async def scenario() -> tuple[int, str]:
        held = ApplicationCommunicator(app, scope("/hold"))
        await held.send_input({"type": "http.request", "body": b""})
        assert await asyncio.to_thread(threads_urls.ENTERED.wait, 20)
        held.future.cancel()
        with pytest.raises(asyncio.CancelledError):
            await held.future
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
