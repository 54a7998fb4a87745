"""The web server: daphne with a ceiling on request bodies, enforced while they arrive.

Run it like daphne: ``python -m playground.webserver -b 127.0.0.1 -p 8000
playground.asgi:application`` (every daphne option works).

Why not an ASGI middleware: daphne hands a request to the application only after the
whole body has arrived (Twisted spools it to a temporary file), and then queues every
chunk of it in memory at once before the application runs a single line. A 2 GiB
upload therefore costs 2 GiB of server memory whatever the application does. The only
place to refuse it is where the bytes come in: the Content-Length header (refused before
any of the body is read) and the running count of a chunked body (cut at the ceiling).
Bodies under the ceiling still meet Django's per-endpoint limits (JSON bodies:
``DATA_UPLOAD_MAX_MEMORY_SIZE``; file content: ``SANDPIT_MAX_FILE_BYTES``).
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import threading
import time
from typing import Any

try:
    import uvloop
except ImportError:  # the stock asyncio loop serves too, with more CPU per frame
    uvloop = None  # type: ignore[assignment]

if __name__ == "__main__" and uvloop is not None:
    # daphne builds its event loop from the policy when daphne.server is first imported (the
    # next lines), and runs Twisted on it: on uvloop a terminal's keystroke costs ~20% less
    # CPU in this process (bench/bench_terminal.py). Only as the server: tests importing
    # this module keep the stock loop.
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())

from daphne.cli import CommandLineInterface  # noqa: E402 - after the loop policy
from daphne.http_protocol import HTTPFactory, WebRequest  # noqa: E402
from daphne.server import Server  # noqa: E402
from daphne.ws_protocol import WebSocketProtocol  # noqa: E402
from django.conf import settings  # noqa: E402
from django.urls import get_resolver  # noqa: E402
from twisted.internet import defer  # noqa: E402

from common.errors import error_body  # noqa: E402
from playground.webprocs import planned_processes, serve
from playground.webthreads import request_calls_in_progress, skip_request_started

logger = logging.getLogger("playground.webserver")


def max_request_bytes() -> int:
    """The largest request body any endpoint accepts, in bytes (read per request, so
    settings overridden in tests apply)."""
    return int(settings.SANDPIT_MAX_REQUEST_BYTES)


def closing_error_response(status: str, code: str, message: str, *headers: str) -> bytes:
    """A complete HTTP/1.1 error response in the API's one error shape, for an answer the
    server gives before the application sees the request; the connection closes after it."""
    body = json.dumps(error_body(code, message)).encode()
    head = "".join(
        f"{line}\r\n"
        for line in (
            f"HTTP/1.1 {status}",
            "Content-Type: application/json",
            f"Content-Length: {len(body)}",
            *headers,
            "Connection: close",
        )
    )
    return f"{head}\r\n".encode() + body


def payload_too_large_response(limit: int) -> bytes:
    """413, the rest of the body never read."""
    return closing_error_response(
        "413 Payload Too Large",
        "payload_too_large",
        f"Request bodies are limited to {limit} bytes.",
    )


def server_stopping_response() -> bytes:
    """503 for a request arriving while the server stops: the client's next try opens a new
    connection (to another process, or once the server is back)."""
    return closing_error_response(
        "503 Service Unavailable",
        "server_stopping",
        "This server is stopping; send the request again.",
        "Retry-After: 1",
    )


class BodyLimitedWebRequest(WebRequest):
    """daphne's request, refusing a body over ``max_request_bytes()`` as it arrives."""

    refused = False
    received_bytes = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Twisted would parse a POST's form or multipart body into `args`, which daphne
        # never reads: a copy of every such body, and a malformed multipart one answered
        # with a bare 400 and a dropped connection before Django could answer in the API's
        # error shape. Each POST with a body also paid ~65 us of CPU here for Twisted's parse
        # of its content type (an email header parse).
        super().__init__(*args, **{**kwargs, "parsePOSTFormSubmission": False})

    def gotLength(self, length: int | None) -> None:
        self.limit = max_request_bytes()
        if length is not None and length > self.limit:
            # No "100 Continue" after our answer: the client must not send the body.
            self.requestHeaders.removeHeader(b"expect")
            self.refuse()
            return
        super().gotLength(length)

    def handleContentChunk(self, data: bytes) -> None:
        if self.refused:
            return
        self.received_bytes += len(data)
        if self.received_bytes > self.limit:
            self.refuse()
            return
        super().handleContentChunk(data)

    def refuse(self) -> None:
        self.refused = True
        # Twisted fills in the method and path only once the body is complete.
        logger.warning(
            "Refused a request body over %d bytes from %s", self.limit, self.getClientAddress()
        )
        transport = self.channel.transport
        if transport is not None:
            transport.write(payload_too_large_response(self.limit))
        self.channel.loseConnection()

    def process(self) -> Any:
        if self.refused:
            return None
        if getattr(self.server, "stopping", False):
            # Not started once the server stops: a keep-alive client would otherwise keep
            # handing it work through the grace, and work cancelled at its end (a create
            # whose answer never came) is worse than a request to send again.
            transport = self.channel.transport
            if transport is not None:
                transport.write(server_stopping_response())
            self.channel.loseConnection()
            return None
        if self.requestHeaders.hasHeader(b"transfer-encoding"):
            # The body is complete and counted: present it with its length, as a buffering
            # proxy does, so the application reads a chunked upload like any other.
            self.requestHeaders.removeHeader(b"transfer-encoding")
            self.requestHeaders.setRawHeaders(
                b"content-length", [str(self.received_bytes).encode()]
            )
        return super().process()


GC_YOUNGEST_THRESHOLD = 7000
"""Allocations between collections of the youngest generation (Python's default is 700).
Every request leaves its whole object graph (Django's and DRF's request, response, view,
authenticators: about 70 objects) in reference cycles that only the collector frees. At 700
a collection also visits the objects of every request still in flight, and promotes them;
at 7000 most of those have finished first. The garbage held back is bounded by the
threshold."""


def freeze_startup_heap() -> None:
    """Move every object alive once the application is loaded (modules, classes, settings,
    URL patterns: about 190,000 objects here) out of the collector's reach, and collect the
    youngest generation less often.

    Unfrozen, each full collection walked that whole heap: ~100 ms of CPU with everything
    stopped, 20 times in a 10-client read benchmark of 13,000 requests, and the collector
    took ~270 us of CPU per request in all. Frozen, with the threshold above: ~75 us."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNGEST_THRESHOLD, *gc.get_threshold()[1:])


def start_providers_prepare() -> None:
    """The warm pools start filling in a thread, before the first request; building the
    docker provider waits for the engine."""
    from sandboxes.services import providers_prepare

    threading.Thread(
        target=providers_prepare, name="sandpit-providers-prepare", daemon=True
    ).start()


def load_url_patterns() -> None:
    """Import the URL configuration now: Django imports it at the first request (~70 ms of
    that request's time here), and its objects (~7,700) would stay out of the frozen heap."""
    _ = get_resolver().url_patterns


def server_ready() -> None:
    """daphne's ready callable: it listens now, and the application is loaded."""
    skip_request_started()
    load_url_patterns()
    freeze_startup_heap()
    start_providers_prepare()


class BodyLimitedHTTPFactory(HTTPFactory):
    def buildProtocol(self, addr: Any) -> Any:
        protocol = super().buildProtocol(addr)
        protocol.requestFactory = BodyLimitedWebRequest
        return protocol


class SandpitServer(Server):
    """daphne's Server with the body-limited HTTP factory, and a stop that lets the requests
    in flight finish.

    daphne builds its HTTP factory inside ``run()`` and offers no option for it, so the
    attribute is a property that builds ours instead. tests/realtime's upload tests fail
    if a daphne upgrade stops going through it.

    Stopping: requests arriving once the server stops (on connections already open) are
    answered 503 ``server_stopping`` and their connection closed. daphne cancels every
    application at once (``kill_all_applications``, run
    before the reactor shuts down), but a cancelled request's view keeps running on its
    thread, with no event loop left for what it hands to one: a destroy's broadcast of its
    new state (``async_to_sync``) then waited forever, the process never exited, and the
    client got no answer. Now the server first stops listening and lets the HTTP requests in
    flight finish, up to ``SANDPIT_WEB_STOP_GRACE_S``. Views still running after that (the
    grace ran out) are cancelled as before, and once the reactor has stopped, its loop runs
    on until they have finished, so what they hand it completes.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["ready_callable"] = kwargs.get("ready_callable") or server_ready
        super().__init__(*args, **kwargs)
        self._ports: list[Any] = []
        self.stopping = False
        """Set once the server stops: requests arriving after it are answered 503."""

    def listen_success(self, port: Any) -> None:
        self._ports.append(port)
        super().listen_success(port)

    def kill_all_applications(self) -> defer.Deferred[Any]:
        self.stopping = True
        for port in self._ports:
            port.stopListening()
        deadline = time.monotonic() + settings.SANDPIT_WEB_STOP_GRACE_S
        drained: defer.Deferred[None] = defer.Deferred()

        def check() -> None:
            if not self.http_requests_in_flight() or time.monotonic() >= deadline:
                drained.callback(None)
            else:
                asyncio.get_event_loop().call_later(0.02, check)

        check()
        return drained.addCallback(lambda _: super(SandpitServer, self).kill_all_applications())

    def http_requests_in_flight(self) -> int:
        """HTTP requests whose application has not returned (WebSockets stay open for good:
        daphne closes them after the grace)."""
        return sum(
            1
            for protocol, details in list(self.connections.items())
            if not isinstance(protocol, WebSocketProtocol)
            and details.get("application_instance") is not None
            and not details["application_instance"].done()
        )

    def run(self) -> None:
        try:
            super().run()
        finally:
            loop = asyncio.get_event_loop()
            if not loop.is_running() and not loop.is_closed():
                loop.run_until_complete(request_calls_finished())
                loop.close()

    @property
    def http_factory(self) -> HTTPFactory:
        return self._body_limited_factory

    @http_factory.setter
    def http_factory(self, _daphne_factory: HTTPFactory) -> None:
        self._body_limited_factory = BodyLimitedHTTPFactory(self)


async def request_calls_finished() -> None:
    """Run the stopped server's loop until no request thread has work: a view cancelled at
    the stop may still be running, and hand the loop a call (a broadcast) that would
    otherwise never run, leaving its thread, and the process's exit, waiting for good."""
    while request_calls_in_progress():  # noqa: ASYNC110 - other threads change it
        await asyncio.sleep(0.02)


class SandpitCommandLineInterface(CommandLineInterface):
    """daphne's command line, plus ``--processes N``: N servers on the -b/-p address
    (default ``SANDPIT_WEB_PROCESSES``, 'auto'; see playground/webprocs.py)."""

    server_class = SandpitServer

    def __init__(self) -> None:
        super().__init__()
        self.parser.add_argument(
            "--processes",
            type=int,
            default=None,
            help="web server processes sharing the -b/-p address (SO_REUSEPORT), 0 for one "
            "per core; default SANDPIT_WEB_PROCESSES (auto: one per core where that is safe)",
        )

    def run(self, args: list[str]) -> Any:
        parsed = self.parser.parse_args(args)
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "playground.settings")
        requested = settings.SANDPIT_WEB_PROCESSES if parsed.processes is None else parsed.processes
        processes, note = planned_processes(requested)
        if note is not None:
            logger.warning("%s", note)
        if processes <= 1:
            return super().run(args)
        if (
            parsed.port is None
            or parsed.unix_socket
            or parsed.file_descriptor is not None
            or parsed.socket_strings
        ):
            self.parser.error("--processes needs -p (and -b) and no -u, --fd or -e")
        raise SystemExit(serve(processes, parsed.host or "127.0.0.1", parsed.port, args))


if __name__ == "__main__":
    SandpitCommandLineInterface.entrypoint()
