from django.urls import path, register_converter

from . import apis, run_apis
from .url_converters import ProcessIdConverter

register_converter(ProcessIdConverter, "pid")

sandbox = "sandboxes/<str:sandbox_id>"

urlpatterns = [
    path("sandboxes", apis.SandboxListApi.as_view(), name="api-sandboxes"),
    path(sandbox, apis.SandboxDetailApi.as_view(), name="api-sandbox"),
    path(f"{sandbox}/timeout", apis.SandboxTimeoutApi.as_view(), name="api-sandbox-timeout"),
    path(f"{sandbox}/stats", apis.SandboxStatsApi.as_view(), name="api-sandbox-stats"),
    path(f"{sandbox}/commands", apis.SandboxCommandApi.as_view(), name="api-sandbox-commands"),
    path(f"{sandbox}/code", apis.SandboxCodeApi.as_view(), name="api-sandbox-code"),
    path(f"{sandbox}/languages", apis.SandboxLanguagesApi.as_view(), name="api-sandbox-languages"),
    path(f"{sandbox}/files", apis.FilesApi.as_view(), name="api-sandbox-files"),
    path(
        f"{sandbox}/files/content", apis.FileContentApi.as_view(), name="api-sandbox-file-content"
    ),
    path(f"{sandbox}/files/stat", apis.FileStatApi.as_view(), name="api-sandbox-file-stat"),
    path(f"{sandbox}/files/exists", apis.FileExistsApi.as_view(), name="api-sandbox-file-exists"),
    path(f"{sandbox}/files/mkdir", apis.MkdirApi.as_view(), name="api-sandbox-mkdir"),
    path(f"{sandbox}/files/move", apis.MoveApi.as_view(), name="api-sandbox-move"),
    path(f"{sandbox}/processes", apis.ProcessListApi.as_view(), name="api-sandbox-processes"),
    path(
        f"{sandbox}/processes/<pid:pid>/signal",
        apis.ProcessSignalApi.as_view(),
        name="api-sandbox-process-signal",
    ),
    path(
        f"{sandbox}/processes/<pid:pid>/output",
        apis.ProcessOutputApi.as_view(),
        name="api-sandbox-process-output",
    ),
    path(f"{sandbox}/tokens", apis.SandboxTokenApi.as_view(), name="api-sandbox-tokens"),
    path("run", run_apis.RunApi.as_view(), name="api-run"),
    path("providers", run_apis.ProviderListApi.as_view(), name="api-providers"),
]

# Real-time layer (sandboxes/realtime_apis.py)
from . import realtime_apis  # noqa: E402

urlpatterns += [
    path(
        f"{sandbox}/terminals",
        realtime_apis.TerminalListApi.as_view(),
        name="api-sandbox-terminals",
    ),
    path(
        f"{sandbox}/terminals/<str:terminal_id>",
        realtime_apis.TerminalDetailApi.as_view(),
        name="api-sandbox-terminal",
    ),
    path(
        f"{sandbox}/terminals/<str:terminal_id>/resize",
        realtime_apis.TerminalResizeApi.as_view(),
        name="api-sandbox-terminal-resize",
    ),
    path(f"{sandbox}/ports", realtime_apis.PortListApi.as_view(), name="api-sandbox-ports"),
]

# Templates (sandboxes/template_apis.py)
from . import template_apis  # noqa: E402

urlpatterns += [
    path("templates", template_apis.TemplateListApi.as_view(), name="api-templates"),
    path(
        "templates/<str:template_id>",
        template_apis.TemplateDetailApi.as_view(),
        name="api-template",
    ),
    path(
        "templates/<str:template_id>/log",
        template_apis.TemplateLogApi.as_view(),
        name="api-template-log",
    ),
]

# Snapshots, fork, pause/resume (sandboxes/snapshot_apis.py)
from . import snapshot_apis  # noqa: E402

urlpatterns += [
    path(
        f"{sandbox}/snapshots",
        snapshot_apis.SandboxSnapshotListApi.as_view(),
        name="api-sandbox-snapshots",
    ),
    path(f"{sandbox}/fork", snapshot_apis.SandboxForkApi.as_view(), name="api-sandbox-fork"),
    path(f"{sandbox}/pause", snapshot_apis.SandboxPauseApi.as_view(), name="api-sandbox-pause"),
    path(f"{sandbox}/resume", snapshot_apis.SandboxResumeApi.as_view(), name="api-sandbox-resume"),
    path("snapshots", snapshot_apis.SnapshotListApi.as_view(), name="api-snapshots"),
    path(
        "snapshots/<str:snapshot_id>",
        snapshot_apis.SnapshotDetailApi.as_view(),
        name="api-snapshot",
    ),
]
