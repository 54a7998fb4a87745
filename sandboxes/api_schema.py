"""What the sandbox API's OpenAPI schema says of answers the views build as plain dicts
(sandboxes/serializers.py's `*_data` functions) and of query parameters they read by hand:
declarations for the schema, never run on a request. tests/playground/test_api_fuzz.py holds
the answers to them."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter
from rest_framework import serializers

from .serializers import MAX_OFFSET

PATH_PARAM = OpenApiParameter(
    "path", str, description="Relative to /workspace, or absolute under /workspace or /tmp"
)
PATH_REQUIRED_PARAM = OpenApiParameter(
    "path",
    str,
    required=True,
    description="The file or directory: relative to /workspace, or absolute under /workspace "
    "or /tmp",
)


def byte_offset_param(name: str, description: str) -> OpenApiParameter:
    """A query parameter counting bytes of a file or a stream: 0 to what an off_t holds."""
    return OpenApiParameter(
        name, {"type": "integer", "minimum": 0, "maximum": MAX_OFFSET}, description=description
    )


RECURSIVE_PARAM = OpenApiParameter(
    "recursive", bool, description="Listing: the whole tree. Delete: a directory and its contents."
)


class TokenOutput(serializers.Serializer):
    token = serializers.CharField(help_text="The sandbox token: Authorization: Bearer <token>.")
    scopes = serializers.ListField(
        child=serializers.CharField(), help_text="What it may reach, sorted."
    )
    expires_at = serializers.DateTimeField(help_text="When it stops working.")


class FileEntryOutput(serializers.Serializer):
    """What `file_entry_data` answers, for the schema."""

    name = serializers.CharField()
    path = serializers.CharField()
    type = serializers.ChoiceField(choices=["file", "dir", "symlink"])
    size = serializers.IntegerField()
    mtime = serializers.FloatField(help_text="Last modified, seconds since the epoch.")


class ProcessOutput(serializers.Serializer):
    """What `process_data` answers, for the schema."""

    pid = serializers.IntegerField()
    command = serializers.CharField()
    running = serializers.BooleanField()
    exit_code = serializers.IntegerField(allow_null=True)
    started_at = serializers.FloatField(
        allow_null=True, help_text="Seconds since the epoch, where the provider knows."
    )


class CompileOutput(serializers.Serializer):
    stdout = serializers.CharField()
    stderr = serializers.CharField()
    exit_code = serializers.IntegerField(allow_null=True)
    duration_ms = serializers.FloatField()
    timed_out = serializers.BooleanField()
    truncated = serializers.BooleanField()


class ExecResultOutput(CompileOutput):
    """`exec_result_data`: a command's result (a compile step's fields, and these)."""

    stdout = serializers.CharField(help_text="In `encoding`: utf-8 text, or base64.")
    stderr = serializers.CharField(help_text="In `encoding`: utf-8 text, or base64.")
    encoding = serializers.ChoiceField(choices=["utf-8", "base64"])
    stdout_truncated = serializers.BooleanField()
    stderr_truncated = serializers.BooleanField()


class CodeRunOutput(ExecResultOutput):
    """`code_run_data`: a snippet's run."""

    language = serializers.CharField()
    compile = CompileOutput(allow_null=True, help_text="null for an interpreted language.")
    compile_failed = serializers.BooleanField()


class RunOutput(ExecResultOutput):
    """A one-shot run's verdict."""

    verdict = serializers.ChoiceField(
        choices=["ok", "compile_error", "runtime_error", "timeout", "memory_limit", "output_limit"]
    )
    language = serializers.CharField(allow_null=True)
    compile = CompileOutput(allow_null=True)
    cpu_time_ms = serializers.FloatField(allow_null=True)
    peak_memory_bytes = serializers.IntegerField(allow_null=True)


class BackgroundStartOutput(ProcessOutput):
    background = serializers.BooleanField()


class BackgroundOutputOutput(serializers.Serializer):
    """`background_output_data`: output since the offsets, and where to ask from next."""

    pid = serializers.IntegerField()
    stdout = serializers.CharField()
    stderr = serializers.CharField()
    encoding = serializers.ChoiceField(choices=["utf-8", "base64"])
    stdout_offset = serializers.IntegerField()
    stderr_offset = serializers.IntegerField()
    running = serializers.BooleanField(allow_null=True)
    exit_code = serializers.IntegerField(allow_null=True)


class FileListOutput(serializers.Serializer):
    entries = FileEntryOutput(many=True)


class SignalOutput(serializers.Serializer):
    pid = serializers.IntegerField()
    signal = serializers.CharField(help_text="As it was asked for.")


class StatsOutput(serializers.Serializer):
    cpu_percent = serializers.FloatField()
    memory_bytes = serializers.IntegerField()
    disk_bytes = serializers.IntegerField()
    net_rx_bytes = serializers.IntegerField()
    net_tx_bytes = serializers.IntegerField()
    uptime_s = serializers.FloatField()
    process_count = serializers.IntegerField()


class ProviderHealthOutput(serializers.Serializer):
    ok = serializers.BooleanField()
    detail = serializers.CharField(allow_blank=True)
    latency_ms = serializers.FloatField(required=False, help_text="Absent when it failed.")


class ProviderLimitsOutput(serializers.Serializer):
    max_concurrent_sandboxes = serializers.IntegerField(help_text="For this organization.")
    max_command_timeout_s = serializers.IntegerField()
    max_file_bytes = serializers.IntegerField()
    max_output_bytes = serializers.IntegerField()


class ProviderOutput(serializers.Serializer):
    """One entry of `providers_describe`."""

    name = serializers.CharField()
    default = serializers.BooleanField()
    isolation = serializers.CharField(required=False, help_text="Absent when it failed.")
    capabilities = serializers.ListField(child=serializers.CharField())
    health = ProviderHealthOutput()
    limits = ProviderLimitsOutput()
