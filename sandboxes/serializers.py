"""Input limits and output shapes for the sandbox API."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework import serializers

from .models import Sandbox
from .providers.base import ExecResult, FileEntry, ProcessInfo

MAX_PATH_CHARS = 4096
MAX_COMMAND_CHARS = 65536
MAX_ENV_VARS = 100


def validate_path_text(value: str) -> str:
    if "\x00" in value:
        raise serializers.ValidationError("Paths must not contain NUL bytes.")
    if len(value.encode()) > MAX_PATH_CHARS:
        raise serializers.ValidationError(f"Paths are limited to {MAX_PATH_CHARS} bytes.")
    return value


class PathField(serializers.CharField):
    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("max_length", MAX_PATH_CHARS)
        kwargs.setdefault("trim_whitespace", False)
        super().__init__(validators=[validate_path_text], **kwargs)


def validate_env(value: dict[str, str]) -> dict[str, str]:
    if len(value) > MAX_ENV_VARS:
        raise serializers.ValidationError(f"At most {MAX_ENV_VARS} environment variables.")
    for key, item in value.items():
        if not key or "=" in key or "\x00" in key or "\x00" in item:
            raise serializers.ValidationError(f"Invalid environment variable name '{key}'.")
        if len(key) > 256 or len(item) > 32768:
            raise serializers.ValidationError("Environment variable too long.")
    return value


class EnvField(serializers.DictField):
    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("child", serializers.CharField(allow_blank=True, trim_whitespace=False))
        kwargs.setdefault("required", False)
        super().__init__(validators=[validate_env], **kwargs)


class ResourcesInput(serializers.Serializer):
    memory_mb = serializers.IntegerField(min_value=32, max_value=8192, required=False)
    cpu_count = serializers.FloatField(min_value=0.1, max_value=4, required=False)
    pids = serializers.IntegerField(min_value=8, max_value=1024, required=False)
    disk_mb = serializers.IntegerField(min_value=1, max_value=10240, required=False)


class SandboxCreateInput(serializers.Serializer):
    provider = serializers.CharField(required=False, max_length=30)
    template = serializers.CharField(required=False, max_length=100, default="default")
    timeout_s = serializers.IntegerField(required=False, min_value=10, max_value=7 * 24 * 3600)
    network = serializers.BooleanField(required=False, default=False)
    resources = ResourcesInput(required=False)
    env = EnvField()
    metadata = serializers.JSONField(required=False, default=dict)

    def validate_metadata(self, value: Any) -> Any:
        if not isinstance(value, dict):
            raise serializers.ValidationError("metadata must be an object.")
        if len(str(value)) > 16384:
            raise serializers.ValidationError("metadata is limited to 16 KB.")
        return value


class SandboxOutput(serializers.ModelSerializer):
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
            "metadata",
            "created_at",
            "started_at",
            "stopped_at",
            "destroyed_at",
            "last_activity_at",
            "expires_at",
            "error_message",
            "destroy_reason",
        ]


class TimeoutInput(serializers.Serializer):
    timeout_s = serializers.IntegerField(min_value=10, max_value=7 * 24 * 3600)


class StdinField(serializers.CharField):
    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("required", False)
        kwargs.setdefault("allow_blank", True)
        kwargs.setdefault("trim_whitespace", False)
        kwargs.setdefault("max_length", 1024 * 1024)
        super().__init__(**kwargs)


class CommandInput(serializers.Serializer):
    command = serializers.CharField(max_length=MAX_COMMAND_CHARS, trim_whitespace=False)
    args = serializers.ListField(
        child=serializers.CharField(
            max_length=MAX_COMMAND_CHARS, allow_blank=True, trim_whitespace=False
        ),
        required=False,
        allow_null=True,
        max_length=1000,
    )
    cwd = PathField(required=False, allow_null=True)
    env = EnvField()
    timeout_s = serializers.FloatField(required=False, min_value=0.1)
    stdin = StdinField()

    def validate_timeout_s(self, value: float) -> float:
        ceiling = settings.SANDPIT_MAX_COMMAND_TIMEOUT_S
        if value > ceiling:
            raise serializers.ValidationError(f"timeout_s is limited to {ceiling} seconds.")
        return value

    def validate_command(self, value: str) -> str:
        if "\x00" in value:
            raise serializers.ValidationError("command must not contain NUL bytes.")
        return value


class CodeInput(serializers.Serializer):
    code = serializers.CharField(max_length=1024 * 1024, trim_whitespace=False)
    language = serializers.CharField(required=False, allow_null=True, max_length=20)
    timeout_s = serializers.FloatField(required=False, min_value=0.1, max_value=300)
    stdin = StdinField()


def exec_result_data(result: ExecResult) -> dict[str, Any]:
    return {
        "stdout": result.stdout.decode("utf-8", errors="replace"),
        "stderr": result.stderr.decode("utf-8", errors="replace"),
        "exit_code": result.exit_code,
        "duration_ms": round(result.duration_ms, 2),
        "timed_out": result.timed_out,
        "truncated": result.truncated,
        "stdout_truncated": result.stdout_truncated,
        "stderr_truncated": result.stderr_truncated,
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
    offset = serializers.IntegerField(required=False, min_value=0, default=0)
    length = serializers.IntegerField(required=False, min_value=0, allow_null=True, default=None)


class MkdirInput(serializers.Serializer):
    path = PathField()


class MoveInput(serializers.Serializer):
    from_ = PathField()
    to = PathField()

    def get_fields(self):  # type: ignore[no-untyped-def]
        fields = super().get_fields()
        fields["from"] = fields.pop("from_")
        return fields


class ProcessStartInput(serializers.Serializer):
    command = serializers.CharField(max_length=MAX_COMMAND_CHARS, trim_whitespace=False)
    args = serializers.ListField(
        child=serializers.CharField(max_length=MAX_COMMAND_CHARS, allow_blank=True),
        required=False,
        allow_null=True,
        max_length=1000,
    )
    cwd = PathField(required=False, allow_null=True)
    env = EnvField()


class SignalInput(serializers.Serializer):
    signal = serializers.CharField(max_length=16, default="SIGTERM")


class RunInput(serializers.Serializer):
    code = serializers.CharField(required=False, max_length=1024 * 1024, trim_whitespace=False)
    command = serializers.CharField(required=False, max_length=MAX_COMMAND_CHARS)
    language = serializers.CharField(required=False, allow_null=True, max_length=20)
    provider = serializers.CharField(required=False, max_length=30)
    files = serializers.DictField(
        child=serializers.CharField(
            allow_blank=True, trim_whitespace=False, max_length=1024 * 1024
        ),
        required=False,
        default=dict,
    )
    stdin = StdinField()
    limits = serializers.DictField(
        child=serializers.FloatField(min_value=0), required=False, default=dict
    )

    def validate_files(self, value: dict[str, str]) -> dict[str, str]:
        if len(value) > 100:
            raise serializers.ValidationError("At most 100 files.")
        for path in value:
            validate_path_text(path)
        return value

    def validate_limits(self, value: dict[str, float]) -> dict[str, float]:
        allowed = {"timeout_s": 60, "memory_mb": 2048, "pids": 256}
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


class TokenInput(serializers.Serializer):
    scopes = serializers.ListField(
        child=serializers.ChoiceField(choices=["terminal", "files", "exec", "ports"]),
        min_length=1,
        max_length=4,
    )
    ttl_s = serializers.IntegerField(min_value=10, max_value=24 * 3600, default=900)
