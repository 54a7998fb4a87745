"""Sandbox rows: Sandpit's record of each sandbox a provider runs for an organization."""

from __future__ import annotations

import secrets

from django.db import models
from django.utils import timezone

from accounts.models import ApiKey, Organization, User


def new_sandbox_id() -> str:
    return "sbx_" + secrets.token_hex(10)


class SandboxState(models.TextChoices):
    CREATING = "creating", "Creating"
    RUNNING = "running", "Running"
    STOPPED = "stopped", "Stopped"
    ERROR = "error", "Error"
    DESTROYED = "destroyed", "Destroyed"


LIVE_STATES = (SandboxState.CREATING, SandboxState.RUNNING)

# creating → running → stopped | error → destroyed (error/stopped may also come from creating)
ALLOWED_TRANSITIONS: dict[str, set[str]] = {
    SandboxState.CREATING: {SandboxState.RUNNING, SandboxState.ERROR, SandboxState.DESTROYED},
    SandboxState.RUNNING: {SandboxState.STOPPED, SandboxState.ERROR, SandboxState.DESTROYED},
    SandboxState.STOPPED: {SandboxState.DESTROYED, SandboxState.ERROR},
    SandboxState.ERROR: {SandboxState.DESTROYED},
    SandboxState.DESTROYED: set(),
}


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
    destroyed_at = models.DateTimeField(null=True, blank=True)
    last_activity_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(help_text="Maximum lifetime; reaped after this.")

    class Meta:
        indexes = [models.Index(fields=["organization", "state"])]
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.id} ({self.provider}, {self.state})"

    @property
    def is_live(self) -> bool:
        return self.state in LIVE_STATES
