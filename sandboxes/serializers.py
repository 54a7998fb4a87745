"""Input limits and output shapes for the sandbox API."""

from __future__ import annotations

import base64
from typing import Any

from django.conf import settings
from rest_framework import serializers

from common.inputs import InputSerializer
from common.outputs import DirectOutput

from .code_runs import CodeRun
from .models import Sandbox, SandboxState
from .providers.base import ExecResult, FileEntry, ProcessInfo

MAX_PATH_CHARS = 4096
MAX_COMMAND_CHARS = 65536
MAX_ENV_VARS = 100
MAX_OFFSET = 2**63 - 1


class StrictCharField(serializers.CharField):
    """A JSON string and nothing else. DRF's CharField turns 42 into "42", so
    {"command": 42} ran `42` and {"code": 42} ran as node; a typed field must refuse."""

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return str(super().to_internal_value(data))


class StrictBooleanField(serializers.BooleanField):
    """true or false only: DRF's BooleanField takes "yes", "on", "1" and 1 as true."""

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid", input=data)
        return data


class StrictIntegerField(serializers.IntegerField):
    """A JSON integer only: DRF's IntegerField takes "600" and 600.0."""

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return int(super().to_internal_value(data))


class StrictFloatField(serializers.FloatField):
    """A JSON number only: DRF's FloatField takes "1.5"."""

    def to_internal_value(self, data: Any) -> float:
        if isinstance(data, bool) or not isinstance(data, int | float):
            self.fail("invalid")
        return float(super().to_internal_value(data))


def validate_path_text(value: str) -> None:
    if "\x00" in value:
        raise serializers.ValidationError("Paths must not contain NUL bytes.")
    if len(value.encode()) > MAX_PATH_CHARS:
        raise serializers.ValidationError(f"Paths are limited to {MAX_PATH_CHARS} bytes.")


class PathField(StrictCharField):
    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("max_length", MAX_PATH_CHARS)
        kwargs.setdefault("trim_whitespace", False)
        super().__init__(validators=[validate_path_text], **kwargs)


def validate_env(value: dict[str, str]) -> None:
    if len(value) > MAX_ENV_VARS:
        raise serializers.ValidationError(f"At most {MAX_ENV_VARS} environment variables.")
    for key, item in value.items():
        if not key or "=" in key or "\x00" in key or "\x00" in item:
            raise serializers.ValidationError(f"Invalid environment variable name '{key}'.")
        if len(key) > 256 or len(item) > 32768:
            raise serializers.ValidationError("Environment variable too long.")


class EnvField(serializers.DictField):
    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("child", StrictCharField(allow_blank=True, trim_whitespace=False))
        kwargs.setdefault("required", False)
        super().__init__(validators=[validate_env], **kwargs)


class ResourcesInput(InputSerializer):
    memory_mb = StrictIntegerField(
        min_value=32,
        max_value=8192,
        required=False,
        help_text="Memory for the whole sandbox, in MiB (default 512).",
    )
    cpu_count = StrictFloatField(
        min_value=0.1, max_value=4, required=False, help_text="CPU cores (default 1.0)."
    )
    pids = StrictIntegerField(
        min_value=8,
        max_value=1024,
        required=False,
        help_text="Processes and threads at once (default 128).",
    )
    disk_mb = StrictIntegerField(
        min_value=1,
        max_value=10240,
        required=False,
        help_text="Workspace quota and largest file, in MiB (default 512).",
    )


class SandboxCreateInput(InputSerializer):
    provider = StrictCharField(
        required=False,
        max_length=30,
        help_text="An enabled provider (GET /api/v1/providers); default: the server's default.",
    )
    template = StrictCharField(
        required=False,
        max_length=100,
        default="default",
        help_text="The image or template to start from.",
    )
    timeout_s = StrictIntegerField(
        required=False,
        min_value=10,
        max_value=7 * 24 * 3600,
        help_text="Idle timeout in seconds: destroyed after this long without activity "
        "(default SANDPIT_IDLE_TIMEOUT_S).",
    )
    network = StrictBooleanField(
        required=False,
        default=False,
        help_text="Outbound network access (only where the organization allows it).",
    )
    resources = ResourcesInput(required=False, help_text="Limits for the sandbox.")
    snapshot = StrictCharField(
        required=False,
        max_length=40,
        help_text="A snapshot id (snp_...) to start from: its files, provider and template "
        "(a fork); resources default to those of the sandbox it was taken from.",
    )
    env = EnvField(help_text="Environment variables for every command, name to value.")
    metadata = serializers.JSONField(
        required=False,
        default=dict,
        help_text="Your own JSON object kept with the sandbox (at most 16 KB).",
    )

    def validate_metadata(self, value: Any) -> Any:
        if not isinstance(value, dict):
            raise serializers.ValidationError("metadata must be an object.")
        if len(str(value)) > 16384:
            raise serializers.ValidationError("metadata is limited to 16 KB.")
        if _holds_nul(value):
            # PostgreSQL's jsonb cannot store \u0000: refused here rather than a 500 there.
            raise serializers.ValidationError("metadata must not contain NUL characters.")
        return value


def _holds_nul(value: Any) -> bool:
    """Whether any string (key or value) in a parsed JSON value contains NUL; iterative."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


class SandboxOutput(DirectOutput, serializers.ModelSerializer):
    """Every sandbox response (read, create, list, destroy): read directly (common/outputs.py)."""

    class Meta:
        model = Sandbox
        fields = [
            "id",
            "state",
            "provider",
            "template",
            "resources",
            "timeout_s",
            "network",
            "isolation",
            "metadata",
            "created_at",
            "started_at",
            "stopped_at",
            "paused_at",
            "destroyed_at",
            "last_activity_at",
            "expires_at",
            "error_message",
            "destroy_reason",
            "snapshot",
        ]


class TimeoutInput(InputSerializer):
    timeout_s = StrictIntegerField(
        min_value=10,
        max_value=7 * 24 * 3600,
        help_text="The new idle timeout in seconds; the call also counts as activity.",
    )


class StdinField(StrictCharField):
    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("required", False)
        kwargs.setdefault("allow_blank", True)
        kwargs.setdefault("trim_whitespace", False)
        kwargs.setdefault("max_length", 1024 * 1024)
        super().__init__(**kwargs)


OUTPUT_ENCODINGS = ("utf-8", "base64")


class EncodingField(serializers.ChoiceField):
    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("required", False)
        kwargs.setdefault("default", "utf-8")
        kwargs.setdefault(
            "help_text",
            'How stdout and stderr come back: "utf-8" text (invalid bytes become U+FFFD, '
            'the default) or "base64" of the exact bytes, for binary output.',
        )
        super().__init__(choices=OUTPUT_ENCODINGS, **kwargs)


class CommandInput(InputSerializer):
    command = StrictCharField(
        max_length=MAX_COMMAND_CHARS,
        trim_whitespace=False,
        help_text="Alone: a shell command line run under `sh -c`. With `args`: the program "
        "to execute directly.",
    )
    args = serializers.ListField(
        child=StrictCharField(
            max_length=MAX_COMMAND_CHARS, allow_blank=True, trim_whitespace=False
        ),
        required=False,
        allow_null=True,
        max_length=1000,
        help_text="Arguments for `command`, passed as they are (no shell).",
    )
    cwd = PathField(
        required=False,
        allow_null=True,
        help_text="Working directory, relative to /workspace (default /workspace).",
    )
    env = EnvField(help_text="Extra environment variables for this command.")
    timeout_s = StrictFloatField(
        required=False,
        min_value=0.1,
        help_text="Seconds before the command is killed (default 30, at most "
        "SANDPIT_MAX_COMMAND_TIMEOUT_S); the answer then has timed_out true.",
    )
    stdin = StdinField(help_text="Text fed to the command's standard input (at most 1 MiB).")
    encoding = EncodingField()
    background = StrictBooleanField(
        required=False,
        default=False,
        help_text="true: start the command and answer at once (202) with its pid; its output "
        "is kept for GET .../processes/{pid}/output. Not with stdin or timeout_s.",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs.get("background"):
            given = [name for name in ("stdin", "timeout_s") if attrs.get(name) is not None]
            if given:
                raise serializers.ValidationError(
                    f"A background command takes no {' or '.join(given)}: it runs until it "
                    "exits or is signalled (POST .../processes/{pid}/signal)."
                )
        return attrs

    def validate_timeout_s(self, value: float) -> float:
        ceiling = settings.SANDPIT_MAX_COMMAND_TIMEOUT_S
        if value > ceiling:
            raise serializers.ValidationError(f"timeout_s is limited to {ceiling} seconds.")
        return value

    def validate_command(self, value: str) -> str:
        if "\x00" in value:
            raise serializers.ValidationError("command must not contain NUL bytes.")
        return value


class CodeInput(InputSerializer):
    code = StrictCharField(
        max_length=1024 * 1024, trim_whitespace=False, help_text="The program's source."
    )
    language = StrictCharField(
        required=False,
        allow_null=True,
        max_length=20,
        help_text="A language the sandbox runs (GET .../languages: python, node, typescript, "
        "bash, c, cpp, go, rust, java, ruby, perl, php, lua, or an alias); without it, "
        "detected from the code (shebang, `package main`, `fn main()`, `#include`, ...).",
    )
    timeout_s = StrictFloatField(
        required=False,
        min_value=0.1,
        max_value=300,
        help_text="Seconds before the program is killed (default 30); the compile step of a "
        "compiled language has its own limit.",
    )
    compile_timeout_s = StrictFloatField(
        required=False,
        min_value=0.1,
        max_value=300,
        help_text="Seconds the compile step of a compiled language may take (default 30).",
    )
    stdin = StdinField(
        help_text="Text fed to the program's standard input (at most 1 MiB); without it, "
        "input() meets end of file."
    )
    encoding = EncodingField()


def _encoded(data: bytes, encoding: str) -> str:
    if encoding == "base64":
        return base64.b64encode(data).decode("ascii")
    return data.decode("utf-8", errors="replace")


def exec_result_data(result: ExecResult, encoding: str = "utf-8") -> dict[str, Any]:
    """A command's result; stdout and stderr in `encoding` (named in the answer)."""
    return {
        "stdout": _encoded(result.stdout, encoding),
        "stderr": _encoded(result.stderr, encoding),
        "encoding": encoding,
        "exit_code": result.exit_code,
        "duration_ms": round(result.duration_ms, 2),
        "timed_out": result.timed_out,
        "truncated": result.truncated,
        "stdout_truncated": result.stdout_truncated,
        "stderr_truncated": result.stderr_truncated,
    }


def compile_data(result: ExecResult | None, encoding: str = "utf-8") -> dict[str, Any] | None:
    """A compile step (None when nothing was compiled): the compiler's output (each stream
    at most 64 KiB) and status."""
    if result is None:
        return None
    return {
        "stdout": _encoded(result.stdout, encoding),
        "stderr": _encoded(result.stderr, encoding),
        "exit_code": result.exit_code,
        "duration_ms": round(result.duration_ms, 2),
        "timed_out": result.timed_out,
        "truncated": result.truncated,
    }


def code_run_data(run: CodeRun, encoding: str = "utf-8") -> dict[str, Any]:
    """A snippet's run: the program's result (the compiler's when the compile failed), its
    language, `compile` (null for an interpreted language) and `compile_failed`."""
    return {
        **exec_result_data(run.result, encoding),
        "language": run.language,
        "compile": compile_data(run.compile, encoding),
        "compile_failed": run.compile_failed,
    }


class LanguageOutput(serializers.Serializer):
    name = serializers.CharField(help_text="What `language` takes (/code, /run, the SDK).")
    # A declared field (the serializer's metaclass takes it off the class), not Field.label.
    label = serializers.CharField(help_text="A name for people (the playground's menu).")  # type: ignore[assignment]
    compiled = serializers.BooleanField(help_text="Compiled before it runs.")
    extensions = serializers.ListField(
        child=serializers.CharField(), help_text="File extensions, without the dot."
    )
    aliases = serializers.ListField(
        child=serializers.CharField(), help_text="Other names `language` accepts."
    )
    sample = serializers.CharField(help_text="A hello-world program.")


def background_output_data(
    pid: int, output: Any, *, stdout_offset: int, stderr_offset: int, encoding: str
) -> dict[str, Any]:
    """A background command's output since the offsets, the offsets to ask from next time,
    and its state (running null when the sandbox no longer lists it)."""
    process = output.process
    return {
        "pid": pid,
        "stdout": _encoded(output.stdout, encoding),
        "stderr": _encoded(output.stderr, encoding),
        "encoding": encoding,
        "stdout_offset": stdout_offset + len(output.stdout),
        "stderr_offset": stderr_offset + len(output.stderr),
        "running": process.running if process is not None else None,
        "exit_code": process.exit_code if process is not None else None,
    }


def file_entry_data(entry: FileEntry) -> dict[str, Any]:
    return {
        "name": entry.name,
        "path": entry.path,
        "type": entry.type,
        "size": entry.size,
        "mtime": entry.mtime,
    }


def process_data(info: ProcessInfo) -> dict[str, Any]:
    return {
        "pid": info.pid,
        "command": info.command,
        "running": info.running,
        "exit_code": info.exit_code,
        "started_at": info.started_at,
    }


class PathQuery(serializers.Serializer):
    path = PathField(required=False, default=".", allow_blank=True)
    recursive = serializers.BooleanField(required=False, default=False)
    # Bounded by what a file offset (off_t) can hold: past it, pread raises OverflowError.
    offset = serializers.IntegerField(required=False, min_value=0, max_value=MAX_OFFSET, default=0)
    length = serializers.IntegerField(
        required=False, min_value=0, max_value=MAX_OFFSET, allow_null=True, default=None
    )


class BackgroundOutputQuery(serializers.Serializer):
    stdout_offset = serializers.IntegerField(
        required=False, min_value=0, max_value=MAX_OFFSET, default=0
    )
    stderr_offset = serializers.IntegerField(
        required=False, min_value=0, max_value=MAX_OFFSET, default=0
    )
    encoding = EncodingField()


class ExistsOutput(serializers.Serializer):
    exists = serializers.BooleanField()


class MkdirInput(InputSerializer):
    path = PathField(help_text="Directory to create, with its parents; relative to /workspace.")


class MoveInput(InputSerializer):
    from_ = PathField(help_text="The file or directory to move.")
    to = PathField(help_text="Its new path.")

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        fields["from"] = fields.pop("from_")
        return fields


class ProcessStartInput(InputSerializer):
    command = StrictCharField(
        max_length=MAX_COMMAND_CHARS,
        trim_whitespace=False,
        help_text="Alone: a shell command line run under `sh -c`. With `args`: the program "
        "to execute directly.",
    )
    args = serializers.ListField(
        child=StrictCharField(max_length=MAX_COMMAND_CHARS, allow_blank=True),
        required=False,
        allow_null=True,
        max_length=1000,
        help_text="Arguments for `command`, passed as they are (no shell).",
    )
    cwd = PathField(
        required=False,
        allow_null=True,
        help_text="Working directory, relative to /workspace (default /workspace).",
    )
    env = EnvField(help_text="Extra environment variables for this process.")


class SignalInput(InputSerializer):
    signal = StrictCharField(
        max_length=16,
        default="SIGTERM",
        help_text="A signal name (SIGTERM, TERM, SIGKILL, ...) or number; default SIGTERM.",
    )


class RunInput(InputSerializer):
    code = StrictCharField(
        required=False,
        max_length=1024 * 1024,
        trim_whitespace=False,
        help_text="A program to run (give exactly one of code and command).",
    )
    command = StrictCharField(
        required=False,
        max_length=MAX_COMMAND_CHARS,
        help_text="A shell command line to run under `sh -c` (exactly one of code and command).",
    )
    language = StrictCharField(
        required=False,
        allow_null=True,
        max_length=20,
        help_text="The language of `code` (see GET /sandboxes/{id}/languages; default: "
        "detected). Compiled languages are compiled first: a failure is the "
        "'compile_error' verdict.",
    )
    provider = StrictCharField(
        required=False, max_length=30, help_text="An enabled provider; default the server's."
    )
    files = serializers.DictField(
        child=StrictCharField(allow_blank=True, trim_whitespace=False, max_length=1024 * 1024),
        required=False,
        default=dict,
        help_text="Files written before the run: path relative to /workspace to text content "
        "(at most 100).",
    )
    stdin = StdinField(help_text="Text fed to standard input (at most 1 MiB).")
    limits = serializers.DictField(
        child=StrictFloatField(min_value=0),
        required=False,
        default=dict,
        help_text="timeout_s: the run (default 10, at most 60); compile_timeout_s: the compile "
        "step of a compiled language (default 30, at most 60); memory_mb (default 256, at "
        "most 2048) and pids (default 64, at most 256): the sandbox, both steps.",
    )

    def validate_files(self, value: dict[str, str]) -> dict[str, str]:
        if len(value) > 100:
            raise serializers.ValidationError("At most 100 files.")
        for path in value:
            validate_path_text(path)
        return value

    def validate_limits(self, value: dict[str, float]) -> dict[str, float]:
        allowed = {"timeout_s": 60, "compile_timeout_s": 60, "memory_mb": 2048, "pids": 256}
        for key, item in value.items():
            if key not in allowed:
                raise serializers.ValidationError(f"Unknown limit '{key}'.")
            if item > allowed[key]:
                raise serializers.ValidationError(f"{key} is limited to {allowed[key]}.")
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("code" in attrs) == ("command" in attrs):
            raise serializers.ValidationError("Give exactly one of 'code' or 'command'.")
        return attrs


class TokenInput(InputSerializer):
    scopes = serializers.ListField(
        child=serializers.ChoiceField(choices=["terminal", "files", "exec", "ports"]),
        min_length=1,
        max_length=4,
        help_text="What the token may reach in this sandbox: terminal, files, exec, ports.",
    )
    ttl_s = StrictIntegerField(
        min_value=10,
        max_value=24 * 3600,
        default=900,
        help_text="Lifetime in seconds (default 900, at most a day).",
    )


class SandboxListQuery(serializers.Serializer):
    """The list's own query parameters (pages aside)."""

    state = serializers.ChoiceField(
        choices=SandboxState.values,
        required=False,
        help_text="Only sandboxes in this state.",
    )
    all = serializers.BooleanField(
        required=False, default=False, help_text="true: include destroyed sandboxes."
    )
