"""Building one template: the engine's build, the size check, the root file system for local
jails, the language probe, and the row that records it (sandboxes/templates.py asks for builds;
template_builtins.py builds the built-ins with the same steps).

A build runs in the background: a Celery task (`sandboxes.tasks.build_template`) or, with
SANDPIT_TEMPLATE_BUILDER=thread (tests, a single-process setup), a thread of the web process;
both run `template_build`, which builds only a queued template (idempotent).
"""

from __future__ import annotations

import logging
import tarfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from celery import current_app
from django.conf import settings
from django.db import close_old_connections
from django.utils import timezone

from accounts.models import Organization
from common.errors import ApplicationError

from .dockerfiles import CheckedDockerfile, dockerfile_check
from .languages import languages_in_rootfs
from .models import BuildState, Template
from .providers.base import ProviderError
from .providers.docker import images
from .providers.local import rootfs as rootfs_module
from .selectors import template_by_name

logger = logging.getLogger(__name__)

BASE_NAMES = ("sandpit", "sandpit-sandbox")
"""FROM names standing for the installation's sandbox image (SANDPIT_DOCKER_IMAGE)."""
IMAGE_REPOSITORY = "sandpit-template"
MAX_LOG_CHARS = 256 * 1024
"""A build log keeps its first this many characters, then says it was cut: append-only, so
a reader's offset stays valid."""
LOG_FLUSH_S = 0.5


def base_resolver(organization: Organization | None) -> Callable[[str], str | None]:
    """What a FROM name stands for when `organization` builds (None: the platform): the
    sandbox image, or the image of a ready template it may see; None for anything else."""

    def resolve(name: str) -> str | None:
        if name.split(":", 1)[0] in BASE_NAMES:
            return str(settings.SANDPIT_DOCKER_IMAGE)
        found = (
            Template.objects.filter(organization__isnull=True, name=name).first()
            if organization is None
            else template_by_name(organization, name)
        )
        if found is None or found.state != BuildState.READY or not found.image:
            return None
        return found.image

    return resolve


def template_artifacts_remove(*, image: str, rootfs: str) -> None:
    """Remove an image and a root file system; failures are logged, not raised."""
    try:
        if image:
            images.image_remove(settings.DOCKER_HOST, image)
    except ProviderError:
        logger.exception("template image removal failed", extra={"image": image})
    if rootfs and Path(rootfs).resolve().is_relative_to(Path(settings.SANDPIT_TEMPLATE_ROOT)):
        rootfs_module.rootfs_remove(rootfs)


def template_build_dispatch(template_id: str, *, network: bool = False) -> None:
    """Start `template_build` in the background: a Celery task, or a thread of this
    process with SANDPIT_TEMPLATE_BUILDER=thread."""
    if settings.SANDPIT_TEMPLATE_BUILDER == "thread":
        threading.Thread(
            target=_build_in_thread, args=(template_id, network), daemon=True, name="tpl-build"
        ).start()
        return
    current_app.send_task(
        "sandboxes.tasks.build_template", args=[template_id], kwargs={"network": network}
    )


def _build_in_thread(template_id: str, network: bool) -> None:
    try:
        template_build(template_id, network=network)
    except Exception:
        logger.exception("template build failed", extra={"template_id": template_id})
    finally:
        close_old_connections()


class _Log:
    """The build log, bounded, and written to the template's row (when there is one) at
    most every LOG_FLUSH_S."""

    def __init__(
        self, template_id: str | None, text: str = "", echo: Callable[[str], None] | None = None
    ) -> None:
        self.template_id = template_id
        self.text = text
        self.echo = echo
        self.flushed = time.monotonic()
        self.cut = False

    def write(self, chunk: str) -> None:
        if self.cut:
            return
        room = MAX_LOG_CHARS - len(self.text)
        if len(chunk) > room:
            chunk = chunk[:room] + f"\n[log cut at {MAX_LOG_CHARS} characters]\n"
            self.cut = True
        self.text += chunk
        if self.echo is not None:
            self.echo(chunk)
        if time.monotonic() - self.flushed >= LOG_FLUSH_S:
            self.flush()

    def flush(self) -> None:
        if self.template_id is not None:
            Template.objects.filter(pk=self.template_id).update(build_log=self.text)
        self.flushed = time.monotonic()


@dataclass(frozen=True)
class BuildOutcome:
    """What one build produced: `error` empty when it succeeded."""

    error: str
    image: str = ""
    rootfs: str = ""
    size_bytes: int = 0
    languages: tuple[str, ...] = ()
    seconds: float = 0.0

    def row_fields(self, log: _Log) -> dict[str, object]:
        """The Template fields recording it."""
        if self.error:
            return {
                "state": BuildState.FAILED,
                "error_message": self.error[:2000],
                "build_log": log.text,
                "build_seconds": self.seconds,
            }
        return {
            "state": BuildState.READY,
            "image": self.image,
            "rootfs": self.rootfs,
            "size_bytes": self.size_bytes,
            "languages": list(self.languages),
            "build_log": log.text,
            "build_seconds": self.seconds,
            "built_at": timezone.now(),
            "error_message": "",
        }


def artifact_names(key: str) -> tuple[str, Path]:
    return f"{IMAGE_REPOSITORY}:{key}", Path(settings.SANDPIT_TEMPLATE_ROOT) / key


def template_build(template_id: str, *, network: bool = False) -> Template | None:
    """Build a queued template: image, size check, root file system, languages; then
    ready, or failed with the reason in error_message and the log. Idempotent: a template
    that is not queued (built, building elsewhere, deleted) is left alone (returns None)."""
    if not Template.objects.filter(pk=template_id, state=BuildState.QUEUED).update(
        state=BuildState.BUILDING
    ):
        return None
    template = Template.objects.get(pk=template_id)
    log = _Log(template.pk, template.build_log)
    tag, root = artifact_names(template.pk.replace("_", "-"))
    try:
        checked = dockerfile_check(
            template.dockerfile, resolve_base=base_resolver(template.organization)
        )
    except ApplicationError as exc:  # a base deleted or failed since the template was asked for
        outcome = BuildOutcome(error=exc.message)
    else:
        outcome = run_build(
            log,
            checked=checked,
            tag=tag,
            root=root,
            network="bridge" if network else "none",
            timeout_s=settings.SANDPIT_TEMPLATE_BUILD_TIMEOUT_S,
            max_bytes=settings.SANDPIT_TEMPLATE_MAX_IMAGE_MB * 1024 * 1024,
        )
    Template.objects.filter(pk=template.pk).update(**outcome.row_fields(log))
    if not Template.objects.filter(pk=template.pk).exists():
        template_artifacts_remove(image=tag, rootfs=str(root))  # deleted meanwhile
        return None
    template.refresh_from_db()
    return template


def run_build(
    log: _Log,
    *,
    checked: CheckedDockerfile,
    tag: str,
    root: Path,
    network: str,
    timeout_s: int,
    max_bytes: int | None,
    context: Mapping[str, bytes] | None = None,
) -> BuildOutcome:
    """Build, check the size, export for local, probe; on failure nothing is left behind."""
    started = time.monotonic()
    try:
        built = images.image_build(
            settings.DOCKER_HOST,
            dockerfile=checked.text,
            tag=tag,
            network=network,
            timeout_s=timeout_s,
            on_output=log.write,
            context=context,
        )
        if max_bytes is not None and built.size_bytes > max_bytes:
            raise ProviderError(
                f"The image is {built.size_bytes // (1024 * 1024)} MiB; templates are limited "
                f"to {max_bytes // (1024 * 1024)} MiB (SANDPIT_TEMPLATE_MAX_IMAGE_MB)."
            )
        log.write("==> exporting the root file system for local sandboxes\n")
        log.flush()
        size = rootfs_module.rootfs_install(images.image_export(settings.DOCKER_HOST, tag), root)
        log.write("==> probing languages\n")
        languages = template_languages(root)
        log.write(f"==> ready: {', '.join(languages) or 'no languages found'}\n")
        log.flush()
    except Exception as exc:  # whatever it was, the template must not stay 'building'
        if not isinstance(exc, ProviderError | OSError | ValueError | tarfile.TarError):
            logger.exception("template build crashed")
        message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
        log.write(f"==> failed: {message}\n")
        template_artifacts_remove(image=tag, rootfs=str(root))
        return BuildOutcome(error=message, seconds=time.monotonic() - started)
    return BuildOutcome(
        error="",
        image=tag,
        rootfs=str(root),
        size_bytes=max(built.size_bytes, size),
        languages=tuple(languages),
        seconds=time.monotonic() - started,
    )


def template_languages(root: Path) -> list[str]:
    """The languages a template's root file system runs (the language table's probe)."""
    return sorted(languages_in_rootfs(root))
