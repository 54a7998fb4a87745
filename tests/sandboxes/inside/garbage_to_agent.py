"""Run inside a sandbox: send the agent malformed requests on its socket, many times over.

Prints how many were sent. The test then checks that the host-side log the agent's stderr
goes to did not grow: a sandbox must not be able to fill the host's jail root through it.
"""

from __future__ import annotations

import socket
import sys

AGENT_SOCKET = "/run/sandpit/agent.sock"
MALFORMED = [
    b"garbage\n",
    b'{"op": 5}\n',
    b'{"op": "exec", "argv": 7}\n',
    b"\xff\xfe" * 1000 + b"\n",
    b'{"op": "exec", "argv": ["\\u0000"]}\n',
    b"[1, 2]\n",
    b'{"op": "read", "path": {"a": 1}}\n',
    b"{" * 100_000 + b"\n",
]


def send(request: bytes) -> None:
    with socket.socket(socket.AF_UNIX) as connection:
        connection.settimeout(5)
        connection.connect(AGENT_SOCKET)
        try:
            connection.sendall(request)
            connection.shutdown(socket.SHUT_WR)
            connection.recv(100)
        except OSError:
            pass


def main(rounds: int) -> None:
    sent = 0
    for _ in range(rounds):
        for request in MALFORMED:
            send(request)
            sent += 1
    print(sent)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100)
