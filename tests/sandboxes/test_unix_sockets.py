"""reachable_path: a Unix socket deeper than sun_path's 107 bytes is still reached."""

from __future__ import annotations

import socket

import pytest

from sandboxes.providers.unix_sockets import reachable_path


def test_a_socket_past_sun_path_is_reached_through_its_directory(tmp_path):  # type: ignore[no-untyped-def]
    deep = tmp_path / ("d" * 80) / ("e" * 80)
    deep.mkdir(parents=True)
    path = deep / "agent.sock"
    assert len(str(path).encode()) > 107
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        with reachable_path(path) as name:
            server.bind(name)
        server.listen(1)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            with pytest.raises(OSError, match="too long"):
                client.connect(str(path))
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            with reachable_path(path) as name:
                client.connect(name)
            accepted, _ = server.accept()
            client.sendall(b"hello")
            assert accepted.recv(5) == b"hello"
            accepted.close()


def test_a_short_path_is_used_as_it_is(tmp_path):  # type: ignore[no-untyped-def]
    with reachable_path(tmp_path / "a.sock") as name:
        assert name == str(tmp_path / "a.sock")
