"""REST endpoints of the real-time layer: terminals and open ports.

Terminal create/resize/kill are metered (feature 'terminal'); listing is free. Terminals
live in the sandbox's agent, reachable from every web process (see sandboxes/terminals.py).
"""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from common.inputs import InputSerializer
from common.schema_shapes import results_of

from . import services
from .apis import SandboxApi, _validated
from .caller import Caller
from .serializers import EnvField, PathField, StrictCharField, StrictIntegerField
from .terminals import (
    TerminalInfo,
    terminal_create,
    terminal_get,
    terminal_kill,
    terminal_resize,
    terminals_for_sandbox,
)
from .watchers import port_url

SHELLS = ("/bin/bash", "/bin/sh", "bash", "sh", "/usr/bin/python3", "python3")


class TerminalCreateInput(InputSerializer):
    cols = StrictIntegerField(
        min_value=2, max_value=1000, required=False, default=80, help_text="Columns (default 80)."
    )
    rows = StrictIntegerField(
        min_value=1, max_value=500, required=False, default=24, help_text="Rows (default 24)."
    )
    shell = StrictCharField(
        max_length=200,
        required=False,
        allow_null=True,
        help_text="The program to run, one executable without arguments (default: the "
        "sandbox's login shell, bash).",
    )
    cwd = PathField(
        required=False,
        allow_null=True,
        help_text="Working directory, relative to /workspace (default /workspace).",
    )
    env = EnvField(help_text="Extra environment variables for the shell.")

    def validate_shell(self, value: str | None) -> str | None:
        if value and ("\x00" in value or " " in value):
            raise serializers.ValidationError("shell is one executable path, without arguments.")
        return value


class TerminalResizeInput(InputSerializer):
    cols = StrictIntegerField(min_value=2, max_value=1000, help_text="Columns.")
    rows = StrictIntegerField(min_value=1, max_value=500, help_text="Rows.")


def ws_url(request: Any, path: str) -> str:
    scheme = "wss" if request.is_secure() else "ws"
    return f"{scheme}://{request.get_host()}{path}"


def terminal_data(request: Any, info: TerminalInfo) -> dict[str, Any]:
    path = f"/ws/sandboxes/{info.sandbox_id}/terminals/{info.id}"
    return {
        "id": info.id,
        "sandbox_id": info.sandbox_id,
        "ws_url": ws_url(request, path),
        "ws_path": path,
        "cols": info.cols,
        "rows": info.rows,
        "shell": info.shell,
        "running": info.running,
        "exit_code": info.exit_code,
        "clients": info.clients,
    }


class TerminalOutput(serializers.Serializer):
    """What `terminal_data` answers, for the schema."""

    id = serializers.CharField()
    sandbox_id = serializers.CharField()
    ws_url = serializers.CharField(help_text="Its WebSocket, absolute (ws:// or wss://).")
    ws_path = serializers.CharField()
    cols = serializers.IntegerField()
    rows = serializers.IntegerField()
    shell = serializers.CharField(allow_null=True)
    running = serializers.BooleanField()
    exit_code = serializers.IntegerField(allow_null=True)
    clients = serializers.IntegerField(help_text="WebSockets attached now.")


class TerminalListApi(SandboxApi):
    required_scope = "terminal"
    sandbox_token_methods = frozenset({"GET", "POST"})

    @extend_schema(
        operation_id="v1_sandboxes_terminals_list",
        responses=results_of("Terminal", TerminalOutput(many=True)),
    )
    def get(self, request: Request, sandbox_id: str) -> Response:
        sandbox = self.sandbox(request, sandbox_id)
        terminals = terminals_for_sandbox(sandbox=sandbox)
        return Response({"results": [terminal_data(request, t) for t in terminals]})

    @extend_schema(request=TerminalCreateInput, responses={201: TerminalOutput})
    def post(self, request: Request, sandbox_id: str) -> HttpResponse:
        data = _validated(TerminalCreateInput, request.data)
        sandbox = self.sandbox(request, sandbox_id)

        def run(caller: Caller) -> Response:
            terminal = terminal_create(
                caller=caller,
                sandbox=sandbox,
                cols=data["cols"],
                rows=data["rows"],
                shell=data.get("shell"),
                cwd=data.get("cwd"),
                env=data.get("env"),
            )
            return Response(terminal_data(request, terminal), status=status.HTTP_201_CREATED)

        return self.operate(request, run)


class TerminalDetailApi(SandboxApi):
    required_scope = "terminal"
    sandbox_token_methods = frozenset({"GET", "DELETE"})

    @extend_schema(operation_id="v1_sandboxes_terminal_retrieve", responses=TerminalOutput)
    def get(self, request: Request, sandbox_id: str, terminal_id: str) -> Response:
        sandbox = self.sandbox(request, sandbox_id)
        return Response(
            terminal_data(request, terminal_get(sandbox=sandbox, terminal_id=terminal_id))
        )

    def delete(self, request: Request, sandbox_id: str, terminal_id: str) -> HttpResponse:
        sandbox = self.sandbox(request, sandbox_id)
        terminal_get(sandbox=sandbox, terminal_id=terminal_id)

        def run(caller: Caller) -> Response:
            terminal_kill(caller=caller, sandbox=sandbox, terminal_id=terminal_id)
            return Response(status=status.HTTP_204_NO_CONTENT)

        return self.operate(request, run)


class TerminalResizeApi(SandboxApi):
    required_scope = "terminal"
    sandbox_token_methods = frozenset({"POST"})

    @extend_schema(request=TerminalResizeInput, responses=TerminalOutput)
    def post(self, request: Request, sandbox_id: str, terminal_id: str) -> HttpResponse:
        data = _validated(TerminalResizeInput, request.data)
        sandbox = self.sandbox(request, sandbox_id)
        terminal_get(sandbox=sandbox, terminal_id=terminal_id)

        def run(caller: Caller) -> Response:
            terminal = terminal_resize(
                caller=caller,
                sandbox=sandbox,
                terminal_id=terminal_id,
                cols=data["cols"],
                rows=data["rows"],
            )
            return Response(terminal_data(request, terminal))

        return self.operate(request, run)


class PortOutput(serializers.Serializer):
    port = serializers.IntegerField(help_text="TCP port listening in the sandbox.")
    address = serializers.CharField(help_text="The address it listens on.")
    url = serializers.CharField(help_text="Its preview URL (see Port previews).")


class PortListApi(SandboxApi):
    required_scope = "ports"
    sandbox_token_methods = frozenset({"GET"})

    @extend_schema(responses=results_of("Port", PortOutput(many=True)))
    def get(self, request: Request, sandbox_id: str) -> HttpResponse:
        sandbox = self.sandbox(request, sandbox_id)

        def run(caller: Caller) -> Response:
            ports = services.sandbox_ports_list(caller=caller, sandbox=sandbox)
            return Response(
                {
                    "results": [
                        {"port": port, "address": address, "url": port_url(sandbox.id, port)}
                        for port, address in ports
                    ]
                }
            )

        return self.operate(request, run)
