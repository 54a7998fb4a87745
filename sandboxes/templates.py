"""Templates: environments an organization builds from a Dockerfile and starts sandboxes from.

A template is a Docker image (what the docker provider runs) and the same image exported as
a read-only root file system directory (what local jails bind at /, see
providers/local/rootfs.py), so the local provider needs no daemon at run time; building
needs the Docker engine. This module asks for builds and deletes them, says how far one is,
and turns a sandbox create's template name into what its provider needs; the build itself
is template_builds.py, the built-ins template_builtins.py.

Each build is counted once (operation 'template.build') when it is asked for, limited per
organization (count, one build at a time, image size, build time), and runs without network
unless an owner asked for it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models.signals import post_delete
from django.dispatch import receiver
from django.utils import timezone

from accounts.authentication import Principal
from accounts.models import Organization, Role
from common.errors import ApplicationError, Conflict, Forbidden, QuotaExceeded

from .caller import Caller, metered
from .dockerfiles import CheckedDockerfile, DockerfileRefused, dockerfile_check
from .models import BuildState, Sandbox, SandboxState, Template
from .selectors import template_by_name, template_get_for_org, templates_for_org
from .template_builds import (
    BASE_NAMES,
    base_resolver,
    template_artifacts_remove,
    template_build,
    template_build_dispatch,
)
from .template_builtins import BUILTINS, templates_builtin_build

TEMPLATE_PROVIDERS = frozenset({"local", "docker"})
"""Providers that start sandboxes from Sandpit templates."""
DEFAULT_NAMES = frozenset({"", "default"})
"""What a sandbox create without a template says: the provider's own environment."""
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
USING_STATES = (SandboxState.CREATING, SandboxState.RUNNING, SandboxState.PAUSED)
RESERVED_NAMES = frozenset({*BUILTINS, *DEFAULT_NAMES, *BASE_NAMES, "base"})


@dataclass(frozen=True)
class TemplateProgress:
    """How far a build is: `percent` 0-100 and what it is doing."""

    percent: int
    step: int
    steps: int
    phase: str


_STEP = re.compile(r"^Step (\d+)/(\d+) :", re.MULTILINE)


def template_progress(template: Template) -> TemplateProgress:
    """Progress from the state and the log: the engine's 'Step n/m' lines make 0-80 %,
    exporting the root file system 85 %, probing languages 95 %, ready 100 %."""
    log = template.build_log
    steps = _STEP.findall(log)
    step, total = (int(steps[-1][0]), int(steps[-1][1])) if steps else (0, 0)
    if template.state == BuildState.READY:
        return TemplateProgress(100, total, total, "ready")
    if template.state == BuildState.QUEUED:
        return TemplateProgress(0, 0, 0, "queued")
    percent = int(80 * max(step - 1, 0) / total) if total else 2
    phase = "building"
    if "==> probing" in log:
        percent, phase = 95, "probing"
    elif "==> exporting" in log:
        percent, phase = 85, "exporting"
    if template.state == BuildState.FAILED:
        phase = "failed"
    return TemplateProgress(percent, step, total, phase)


# --- create and delete ---------------------------------------------------------------------


def template_create(
    *,
    caller: Caller,
    principal: Principal,
    name: str,
    dockerfile: str,
    description: str = "",
    network: bool = False,
) -> Template:
    """Check the Dockerfile, record the template (queued) and start its build in the
    background. Counted once ('template.build').

    Raises DockerfileRefused (400), ApplicationError 'validation_error' for a bad or
    reserved name, Forbidden 'role_required' for `network` asked by anyone but a signed-in
    owner, QuotaExceeded (429) past SANDPIT_TEMPLATE_MAX_PER_ORG, Conflict (409) for a
    name in use or while another build of the organization is under way, PaymentRequired."""
    organization = principal.organization
    if not NAME_RE.match(name):
        raise ApplicationError(
            "Template names are 1-64 lowercase letters, digits, '.', '_' or '-', starting "
            "with a letter or digit.",
            code="validation_error",
        )
    if name in RESERVED_NAMES:
        raise ApplicationError(
            f"'{name}' is reserved (a built-in template or a base image name).",
            code="validation_error",
        )
    if network and not (principal.user is not None and principal.role == Role.OWNER):
        raise Forbidden(
            "Builds with network access run code with this machine's network on the "
            "organization's behalf: only a signed-in owner may ask for one.",
            code="role_required",
        )
    checked = dockerfile_check(dockerfile, resolve_base=base_resolver(organization))
    templates_fail_stale(organization)
    limit = settings.SANDPIT_TEMPLATE_MAX_PER_ORG
    with metered(caller, feature="sandbox", operation="template.build"):
        with transaction.atomic():
            Organization.objects.select_for_update().filter(pk=organization.pk).first()
            own = Template.objects.filter(organization=organization)
            if own.count() >= limit:
                raise QuotaExceeded(
                    f"This organization has {limit} templates (the limit); delete one first.",
                    code="template_limit_reached",
                )
            if own.filter(state__in=(BuildState.QUEUED, BuildState.BUILDING)).exists():
                raise Conflict(
                    "Another template of this organization is building; one build at a time.",
                    code="template_build_in_progress",
                )
            try:
                with transaction.atomic():
                    template = Template.objects.create(
                        organization=organization,
                        name=name,
                        description=description,
                        dockerfile=dockerfile,
                        created_by=principal.user,
                        build_log=_header(checked, network),
                    )
            except IntegrityError:
                raise Conflict(
                    f"This organization already has a template named '{name}'.",
                    code="template_exists",
                ) from None
            transaction.on_commit(lambda: template_build_dispatch(template.pk, network=network))
    return template


STALE_MARGIN_S = 300


def templates_fail_stale(organization: Organization) -> int:
    """Mark failed the organization's builds still queued or building well past the build
    timeout: their worker stopped (a killed Celery worker, a restarted web process in thread
    mode). Otherwise one lost build would block the organization's builds and deletes for
    good. Returns how many were marked."""
    cutoff = timezone.now() - timedelta(
        seconds=settings.SANDPIT_TEMPLATE_BUILD_TIMEOUT_S + STALE_MARGIN_S
    )
    return Template.objects.filter(
        organization=organization,
        state__in=(BuildState.QUEUED, BuildState.BUILDING),
        created_at__lt=cutoff,
    ).update(
        state=BuildState.FAILED,
        error_message="The build did not finish: the process running it stopped. Delete the "
        "template and ask for it again.",
    )


def _header(checked: CheckedDockerfile, network: bool) -> str:
    return (
        f"==> building on {', '.join(checked.bases)}; network "
        f"{'on (asked by an owner)' if network else 'off'}\n"
    )


def template_delete(*, principal: Principal, template: Template) -> None:
    """Delete the organization's template, its image and its root file system.

    Raises Forbidden 'builtin_template' for a built-in, Conflict 'template_building' while
    it builds and 'template_in_use' while sandboxes of the organization run (or are paused)
    from it. Not counted (only builds are)."""
    if template.organization_id is None:
        raise Forbidden("Built-in templates cannot be deleted.", code="builtin_template")
    templates_fail_stale(principal.organization)
    template.refresh_from_db()
    if template.state == BuildState.BUILDING:
        raise Conflict(
            "The template is building; delete it once the build ends.", code="template_building"
        )
    using = Sandbox.objects.filter(
        organization_id=template.organization_id, template=template.name, state__in=USING_STATES
    ).count()
    if using:
        raise Conflict(
            f"{using} sandbox(es) run from this template; destroy them first.",
            code="template_in_use",
        )
    template.delete()  # the post_delete receiver removes image and root file system


@receiver(post_delete, sender=Template)
def _template_deleted(sender: type[Template], instance: Template, **kwargs: object) -> None:
    """Remove the build's artifacts once the deletion commits (also when an organization's
    deletion cascades here). Built-ins share theirs between checkouts: left alone."""
    if instance.organization_id is None:
        return
    image, root = instance.image, instance.rootfs
    transaction.on_commit(lambda: template_artifacts_remove(image=image, rootfs=root))


# --- sandboxes start from templates ---------------------------------------------------------


@dataclass(frozen=True)
class TemplateLaunch:
    """What a provider needs to start a sandbox from a template."""

    name: str
    image: str
    rootfs: str


def template_for_sandbox(
    *, organization: Organization, name: str, provider_name: str
) -> TemplateLaunch | None:
    """The template a sandbox create names, or None for the provider's own environment
    ('default'). On a provider that runs no Sandpit templates (cloud) a name that is not a
    Sandpit template goes to the provider as before.

    Raises ApplicationError 'template_not_found' (400) for an unknown name, Conflict
    'template_not_ready' (409) for one that is not built (queued, building, failed)."""
    if name in DEFAULT_NAMES:
        return None
    template = template_by_name(organization, name)
    if provider_name not in TEMPLATE_PROVIDERS:
        if template is not None:
            raise ApplicationError(
                f"Template '{name}' runs on the local and docker providers only.",
                code="template_not_supported",
            )
        return None
    if template is None:
        raise ApplicationError(
            f"No template named '{name}'. GET /api/v1/templates lists them; omit "
            '"template" for the default environment.',
            code="template_not_found",
        )
    if template.state != BuildState.READY:
        raise Conflict(
            f"Template '{name}' is {template.state}"
            + (f" ({template.error_message})" if template.error_message else "")
            + "; sandboxes start from ready templates only.",
            code="template_not_ready",
        )
    return TemplateLaunch(name=template.name, image=template.image, rootfs=template.rootfs)


__all__ = [
    "BUILTINS",
    "DockerfileRefused",
    "TemplateLaunch",
    "TemplateProgress",
    "template_build",
    "template_create",
    "template_delete",
    "template_for_sandbox",
    "template_get_for_org",
    "template_progress",
    "templates_builtin_build",
    "templates_for_org",
]
