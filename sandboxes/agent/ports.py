"""Listening TCP ports of the sandbox and byte streams to them."""

from __future__ import annotations

import os
import select

from .wire import CHUNK, AgentError, send_line, socket


def _jail_socket_inodes() -> set[str]:
    """Inodes of the sockets held by processes of this jail (all we can see in /proc)."""
    inodes: set[str] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{entry}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    return inodes


def _listening() -> list[dict]:
    """TCP ports in LISTEN state whose socket belongs to a process of this jail. With
    --share-net the table is the host's: this filter keeps host services out of
    open_ports and connect_port."""
    ours = _jail_socket_inodes()
    ports: dict[int, str] = {}
    for name in ("tcp", "tcp6"):
        try:
            with open(f"/proc/net/{name}") as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != "0A" or fields[9] not in ours:
                continue
            addr_hex, port_hex = fields[1].split(":")
            port = int(port_hex, 16)
            raw = bytes.fromhex(addr_hex)
            if len(raw) == 4:
                address = socket.inet_ntop(socket.AF_INET, raw[::-1])
            else:
                words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
                address = socket.inet_ntop(socket.AF_INET6, words)
            ports.setdefault(port, address)
    return [{"port": p, "address": a} for p, a in sorted(ports.items())]


def op_ports(conn: socket.socket, req: dict) -> None:
    send_line(conn, {"ok": True, "ports": _listening()})


def op_connect(conn: socket.socket, req: dict) -> None:
    port = int(req["port"])
    if not 0 < port < 65536:
        raise AgentError("invalid_request", f"bad port {port}")
    if not any(p["port"] == port for p in _listening()):
        raise AgentError("port_closed", f"nothing in the sandbox listens on port {port}")
    upstream = None
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        candidate = socket.socket(family, socket.SOCK_STREAM)
        candidate.settimeout(5)
        try:
            candidate.connect((host, port))
        except OSError:
            candidate.close()
            continue
        upstream = candidate
        break
    if upstream is None:
        raise AgentError("port_closed", f"nothing listens on port {port}")
    upstream.settimeout(None)
    try:
        send_line(conn, {"ok": True})
        _splice_sockets(conn, upstream)
    finally:
        upstream.close()


def _splice_sockets(a: socket.socket, b: socket.socket) -> None:
    poller = select.poll()
    poller.register(a.fileno(), select.POLLIN)
    poller.register(b.fileno(), select.POLLIN)
    by_fd = {a.fileno(): (a, b), b.fileno(): (b, a)}
    half_closed = 0
    while half_closed < 2:
        for fd, _ev in poller.poll():
            src, dst = by_fd[fd]
            try:
                data = src.recv(CHUNK)
            except OSError:
                data = b""
            if data:
                dst.sendall(data)
                continue
            poller.unregister(fd)
            half_closed += 1
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                return


def splice_fds(conn: socket.socket, in_fd: int, out_fd: int) -> None:
    """Copy `in_fd` to the connection and the connection to `out_fd` until the connection
    ends; end of `in_fd` half-closes the connection (the relay mode's pipe)."""
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN)
    poller.register(in_fd, select.POLLIN)
    while True:
        for fd, _ev in poller.poll():
            if fd == in_fd:
                data = os.read(in_fd, CHUNK)
                if data:
                    conn.sendall(data)
                    continue
                poller.unregister(in_fd)
                try:
                    conn.shutdown(socket.SHUT_WR)
                except OSError:
                    return
                continue
            try:
                data = conn.recv(CHUNK)
            except OSError:
                data = b""
            if not data:
                return
            view = memoryview(data)
            while view:
                view = view[os.write(out_fd, view) :]
