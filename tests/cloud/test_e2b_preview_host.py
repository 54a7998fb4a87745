"""Previews through a cloud edge: the proxy must send the Host the provider's stream names."""

from __future__ import annotations

import asyncio
import time

from sandboxes.preview.access import Upstream


def test_e2b_port_stream_names_the_edge_host_and_the_proxy_sends_it(provider, sandbox):
    # A tiny server in the (fake) e2b sandbox that answers with the Host it was sent.
    provider.write_file(
        sandbox,
        "echo_host.py",
        b"import http.server\n"
        b"class H(http.server.BaseHTTPRequestHandler):\n"
        b"    def do_GET(self):\n"
        b"        body = self.headers['Host'].encode()\n"
        b"        self.send_response(200); self.send_header('Content-Length', str(len(body)))\n"
        b"        self.end_headers(); self.wfile.write(body)\n"
        b"http.server.HTTPServer(('127.0.0.1', 8124), H).serve_forever()\n",
    )
    provider.start_process(sandbox, "python3", args=["echo_host.py"])
    deadline = time.monotonic() + 15
    while not any(p.port == 8124 for p in provider.open_ports(sandbox)):
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.1)

    stream = provider.connect_port(sandbox, 8124)
    upstream = Upstream(stream)
    try:
        host = upstream.host(8124)
        assert host == stream.host_header == "127.0.0.1:8124"  # what the fake's get_host says

        async def ask() -> bytes:
            reader, writer = await asyncio.open_connection(sock=upstream.sock)
            writer.write(f"GET / HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
            await writer.drain()
            return await reader.read()

        response = asyncio.run(ask())
    finally:
        asyncio.run(upstream.close())
    assert response.startswith(b"HTTP/1.0 200")
    assert response.endswith(b"127.0.0.1:8124")


def test_local_streams_answer_to_localhost():
    class Stream:
        def fileno(self) -> int:
            return 0

    upstream = Upstream.__new__(Upstream)
    upstream.stream = Stream()
    assert upstream.host(8000) == "localhost:8000"
