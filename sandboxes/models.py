"""Sandbox rows: Sandpit's record of each sandbox a provider runs for an organization."""

from __future__ import annotations

import secrets
from typing import Any

from django.db import models
from django.utils import timezone

from accounts.models import ApiKey, Organization, User

from . import row_cache


def new_sandbox_id() -> str:
    return "sbx_" + secrets.token_hex(10)


class SandboxState(models.TextChoices):
    CREATING = "creating", "Creating"
    RUNNING = "running", "Running"
    PAUSED = "paused", "Paused"
    ARCHIVED = "archived", "Archived"
    STOPPED = "stopped", "Stopped"
    ERROR = "error", "Error"
    DESTROYED = "destroyed", "Destroyed"


LIVE_STATES = (SandboxState.CREATING, SandboxState.RUNNING)
"""States in which the sandbox's processes run. A paused sandbox keeps its provider resource
(processes frozen, memory kept) but is not live: the idle clock stops and operations wait for
resume. An archived one has only a snapshot left; resume starts it again from that snapshot."""

# creating → running ⇄ paused → archived → running; any → stopped | error → destroyed
ALLOWED_TRANSITIONS: dict[str, set[str]] = {
    SandboxState.CREATING: {SandboxState.RUNNING, SandboxState.ERROR, SandboxState.DESTROYED},
    SandboxState.RUNNING: {
        SandboxState.PAUSED,
        SandboxState.STOPPED,
        SandboxState.ERROR,
        SandboxState.DESTROYED,
    },
    SandboxState.PAUSED: {
        SandboxState.RUNNING,
        SandboxState.ARCHIVED,
        SandboxState.STOPPED,
        SandboxState.ERROR,
        SandboxState.DESTROYED,
    },
    SandboxState.ARCHIVED: {SandboxState.RUNNING, SandboxState.ERROR, SandboxState.DESTROYED},
    SandboxState.STOPPED: {SandboxState.DESTROYED, SandboxState.ERROR},
    SandboxState.ERROR: {SandboxState.DESTROYED},
    SandboxState.DESTROYED: set(),
}


class SandboxQuerySet(models.QuerySet["Sandbox"]):
    """Writes that tell the per-process row caches (sandboxes/row_cache.py) what changed."""

    def update(self, **kwargs: Any) -> int:
        """Rows it cannot name: every process reads every sandbox from the database again.
        A write to known rows says which (`update_row`)."""
        count = super().update(**kwargs)
        if count:
            row_cache.rows_changed(None, using=self.db)
        return count

    def update_row(self, sandbox_id: str, **kwargs: Any) -> int:
        """`self.filter(pk=sandbox_id).update(**kwargs)`, recorded as a change of that row
        only."""
        count = models.QuerySet.update(self.filter(pk=sandbox_id), **kwargs)
        if count:
            row_cache.rows_changed([sandbox_id], using=self.db)
        return count

    def delete(self) -> tuple[int, dict[str, int]]:
        deleted = super().delete()
        if deleted[0]:
            row_cache.rows_changed(None, using=self.db)
        return deleted


class Sandbox(models.Model):
    """One isolated environment. The row outlives the provider resource so usage,
    audit and "why was it reaped" stay answerable."""

    id = models.CharField(primary_key=True, max_length=40, default=new_sandbox_id, editable=False)
    organization = models.ForeignKey(
        Organization, on_delete=models.CASCADE, related_name="sandboxes"
    )
    created_by = models.ForeignKey(
        User, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_by_key = models.ForeignKey(
        ApiKey, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    provider = models.CharField(max_length=30)
    provider_id = models.CharField(max_length=200, blank=True, default="")
    state = models.CharField(
        max_length=12, choices=SandboxState.choices, default=SandboxState.CREATING, db_index=True
    )
    template = models.CharField(max_length=100, default="default")
    snapshot = models.ForeignKey(
        "Snapshot",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        help_text="The snapshot it was started (forked) from, if any.",
    )
    engine = models.CharField(
        max_length=100,
        blank=True,
        default="",
        help_text="Which engine of the provider runs it (docker: a SANDPIT_DOCKER_HOSTS entry).",
    )
    resources = models.JSONField(default=dict, blank=True)
    timeout_s = models.PositiveIntegerField(help_text="Idle timeout in seconds.")
    network = models.BooleanField(default=False)
    isolation = models.CharField(
        max_length=20,
        blank=True,
        default="",
        help_text="What separates it from the host kernel: 'container', 'gvisor' (docker), "
        "empty where the provider does not say.",
    )
    metadata = models.JSONField(default=dict, blank=True)
    ephemeral = models.BooleanField(default=False, help_text="Created by /run; destroyed after.")
    error_message = models.TextField(blank=True, default="")
    destroy_reason = models.CharField(max_length=40, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    stopped_at = models.DateTimeField(null=True, blank=True)
    paused_at = models.DateTimeField(null=True, blank=True)
    destroyed_at = models.DateTimeField(null=True, blank=True)
    last_activity_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(help_text="Maximum lifetime; reaped after this.")

    objects = SandboxQuerySet.as_manager()

    class Meta:
        indexes = [models.Index(fields=["organization", "state"])]
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.id} ({self.provider}, {self.state})"

    def save(self, *args: Any, **kwargs: Any) -> None:
        changed = not self._state.adding  # a new row: no process holds it yet
        super().save(*args, **kwargs)
        if changed:
            row_cache.rows_changed([self.pk], using=self._state.db or "default")

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        sandbox_id = self.pk
        deleted = super().delete(*args, **kwargs)
        row_cache.rows_changed([sandbox_id], using=self._state.db or "default")
        return deleted

    @property
    def is_live(self) -> bool:
        return self.state in LIVE_STATES


def new_template_id() -> str:
    return "tpl_" + secrets.token_hex(10)


def new_snapshot_id() -> str:
    return "snp_" + secrets.token_hex(10)


class BuildState(models.TextChoices):
    QUEUED = "queued", "Queued"
    BUILDING = "building", "Building"
    READY = "ready", "Ready"
    FAILED = "failed", "Failed"


class Template(models.Model):
    """An environment sandboxes start from: a Dockerfile built into an image (docker) and
    exported as a read-only root filesystem (local). Built-in templates have no organization."""

    id = models.CharField(primary_key=True, max_length=40, default=new_template_id, editable=False)
    organization = models.ForeignKey(
        Organization, on_delete=models.CASCADE, null=True, blank=True, related_name="templates"
    )
    name = models.CharField(max_length=64)
    description = models.CharField(max_length=200, blank=True, default="")
    dockerfile = models.TextField()
    state = models.CharField(
        max_length=12, choices=BuildState.choices, default=BuildState.QUEUED, db_index=True
    )
    image = models.CharField(max_length=200, blank=True, default="")
    rootfs = models.CharField(max_length=500, blank=True, default="")
    languages = models.JSONField(default=list, blank=True)
    size_bytes = models.BigIntegerField(default=0)
    build_log = models.TextField(blank=True, default="")
    build_seconds = models.FloatField(null=True, blank=True)
    error_message = models.TextField(blank=True, default="")
    created_by = models.ForeignKey(
        User, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    built_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["organization", "name"], name="template_name_per_org"),
            models.UniqueConstraint(
                fields=["name"],
                condition=models.Q(organization__isnull=True),
                name="builtin_template_name",
            ),
        ]
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.state})"


class SnapshotState(models.TextChoices):
    CREATING = "creating", "Creating"
    READY = "ready", "Ready"
    FAILED = "failed", "Failed"


class Snapshot(models.Model):
    """A saved copy of a sandbox's writable filesystem; new sandboxes can start from it."""

    id = models.CharField(primary_key=True, max_length=40, default=new_snapshot_id, editable=False)
    organization = models.ForeignKey(
        Organization, on_delete=models.CASCADE, related_name="snapshots"
    )
    sandbox = models.ForeignKey(
        Sandbox, on_delete=models.SET_NULL, null=True, blank=True, related_name="snapshots"
    )
    source_sandbox_id = models.CharField(max_length=40)
    provider = models.CharField(max_length=30)
    template = models.CharField(max_length=100, default="default")
    name = models.CharField(max_length=100, blank=True, default="")
    kind = models.CharField(
        max_length=10,
        default="manual",
        help_text="'manual' (the API) or 'archive' (taken by the reaper from a paused sandbox).",
    )
    state = models.CharField(
        max_length=10, choices=SnapshotState.choices, default=SnapshotState.CREATING
    )
    location = models.CharField(
        max_length=500, blank=True, default="", help_text="Image tag (docker) or archive path."
    )
    size_bytes = models.BigIntegerField(default=0)
    error_message = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.id} of {self.source_sandbox_id} ({self.state})"
