"""Templates: environments an organization builds from a Dockerfile and starts sandboxes from.

A template is a Docker image (what the docker provider runs) and the same image exported as
a read-only root file system directory (what local jails bind at /, see
providers/local/rootfs.py), so the local provider needs no daemon at run time; building
needs the Docker engine. Built-in templates (organization null) are defined here and built
by `manage.py build_templates`, cached by content hash.

Builds run in the background: a Celery task (`sandboxes.tasks.build_template`) or, with
SANDPIT_TEMPLATE_BUILDER=thread (tests, a single-process setup), a thread of the web
process; both run `template_build`, which is idempotent (only a queued template is built).
Each build is counted once (operation 'template.build') when it is asked for, limited per
organization (count, one build at a time, image size, build time), and runs without network
unless an owner asked for it.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import re
import tarfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from celery import current_app
from django.conf import settings
from django.db import IntegrityError, close_old_connections, transaction
from django.db.models import F, Q, QuerySet
from django.db.models.signals import post_delete
from django.dispatch import receiver
from django.utils import timezone

from accounts.authentication import Principal
from accounts.models import Organization, Role
from playground.errors import ApplicationError, Conflict, Forbidden, NotFound, QuotaExceeded

from .caller import Caller, metered
from .dockerfiles import CheckedDockerfile, DockerfileRefused, dockerfile_check
from .languages import languages_in_rootfs
from .models import BuildState, Sandbox, SandboxState, Template
from .providers import agent_bundle
from .providers.base import ProviderError
from .providers.docker import images
from .providers.local import rootfs as rootfs_module

logger = logging.getLogger(__name__)

TEMPLATE_PROVIDERS = frozenset({"local", "docker"})
"""Providers that start sandboxes from Sandpit templates."""
DEFAULT_NAMES = frozenset({"", "default"})
"""What a sandbox create without a template says: the provider's own environment."""
BASE_NAMES = ("sandpit", "sandpit-sandbox")
"""FROM names standing for the installation's sandbox image (SANDPIT_DOCKER_IMAGE)."""
IMAGE_REPOSITORY = "sandpit-template"
MAX_LOG_CHARS = 256 * 1024
"""A build log keeps its first this many characters, then says it was cut: append-only, so
a reader's offset stays valid."""
LOG_FLUSH_S = 0.5
BUILTIN_BUILD_TIMEOUT_S = 3600
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
USING_STATES = (SandboxState.CREATING, SandboxState.RUNNING, SandboxState.PAUSED)

_APT_RUN = (
    "RUN echo 'deb http://deb.debian.org/debian bookworm main' > /etc/apt/sources.list \\\n"
    " && apt-get update \\\n"
    " && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends {packages} \\\n"
    " && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb /usr/share/doc/* "
    "/usr/share/man/*\n"
)


@dataclass(frozen=True)
class Builtin:
    """A template every organization sees: Debian packages on top of the sandbox image."""

    name: str
    description: str
    packages: str

    @property
    def dockerfile(self) -> str:
        """What it amounts to, as a user's Dockerfile would say it (shown in the API)."""
        return f"FROM sandpit\nUSER root\n{_APT_RUN.format(packages=self.packages)}USER 1000:1000\n"


BUILTINS: dict[str, Builtin] = {
    b.name: b
    for b in (
        Builtin("python", "Python 3.11 with pip and venv", "python3-pip python3-venv"),
        Builtin("node", "Node.js 18 with npm", "npm"),
        Builtin(
            "polyglot",
            "C, C++ (gcc/g++), Go, Rust, Java 17, TypeScript (tsc), Ruby, Python, Node.js",
            "gcc g++ libc6-dev golang-go rustc default-jdk-headless ruby node-typescript",
        ),
    )
}
RESERVED_NAMES = frozenset({*BUILTINS, *DEFAULT_NAMES, *BASE_NAMES, "base"})


# --- reads ---------------------------------------------------------------------------------


def templates_for_org(organization: Organization) -> QuerySet[Template]:
    """Built-in templates and the organization's own, built-ins first, then by name."""
    return Template.objects.filter(
        Q(organization__isnull=True) | Q(organization=organization)
    ).order_by(F("organization_id").asc(nulls_first=True), "name")


def template_get_for_org(*, organization: Organization, template_id: str) -> Template:
    """A template the organization may see (its own or a built-in); NotFound otherwise,
    never 403 (which would confirm another organization's id exists)."""
    template = templates_for_org(organization).filter(pk=template_id).first()
    if template is None:
        raise NotFound("No such template.", code="template_not_found")
    return template


def _by_name(organization: Organization, name: str) -> Template | None:
    return (
        templates_for_org(organization)
        .filter(Q(name=name) | Q(pk=name))
        .order_by(F("organization_id").asc(nulls_last=True))
        .first()
    )


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


def _resolver(organization: Organization | None) -> Callable[[str], str | None]:
    def resolve(name: str) -> str | None:
        if name.split(":", 1)[0] in BASE_NAMES:
            return str(settings.SANDPIT_DOCKER_IMAGE)
        found = (
            Template.objects.filter(organization__isnull=True, name=name).first()
            if organization is None
            else _by_name(organization, name)
        )
        if found is None or found.state != BuildState.READY or not found.image:
            return None
        return found.image

    return resolve


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
    checked = dockerfile_check(dockerfile, resolve_base=_resolver(organization))
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


def template_artifacts_remove(*, image: str, rootfs: str) -> None:
    """Remove an image and a root file system; failures are logged, not raised."""
    try:
        if image:
            images.image_remove(settings.DOCKER_HOST, image)
    except ProviderError:
        logger.exception("template image removal failed", extra={"image": image})
    if rootfs and Path(rootfs).resolve().is_relative_to(Path(settings.SANDPIT_TEMPLATE_ROOT)):
        rootfs_module.rootfs_remove(rootfs)


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
    template = _by_name(organization, name)
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


# --- building ------------------------------------------------------------------------------


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


def _artifact_names(key: str) -> tuple[str, Path]:
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
    tag, root = _artifact_names(template.pk.replace("_", "-"))
    try:
        checked = dockerfile_check(
            template.dockerfile, resolve_base=_resolver(template.organization)
        )
    except ApplicationError as exc:  # a base deleted or failed since the template was asked for
        outcome = BuildOutcome(error=exc.message)
    else:
        outcome = _run_build(
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


def _run_build(
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


# --- built-ins -----------------------------------------------------------------------------


DEBIAN_BASE = "sandpit-base:bookworm"
"""The debootstrap image scripts/build-sandbox-image.sh imports (the sandbox image's FROM)."""
SANDBOX_DOCKERFILE = Path(settings.BASE_DIR) / "docker" / "sandbox" / "Dockerfile"


def _packages_stage(builtin: Builtin, *, build: bool, echo: Callable[[str], None] | None) -> str:
    """The built-in's packages on the Debian base, as an image tag; built (on the host's
    network: apt needs Debian's mirror) only when its content key is new. Kept apart from
    the sandbox image's own layers so a new agent does not download the packages again."""
    base = images.image_id(settings.DOCKER_HOST, DEBIAN_BASE)
    if base is None:
        raise ApplicationError(
            f"{DEBIAN_BASE} is not on this machine: run scripts/build-sandbox-image.sh first."
        )
    dockerfile = f"FROM {DEBIAN_BASE}\n{_APT_RUN.format(packages=builtin.packages)}"
    digest = hashlib.sha256(f"{dockerfile}\0{base}".encode()).hexdigest()[:12]
    tag = f"{IMAGE_REPOSITORY}-packages:{builtin.name}-{digest}"
    if images.image_exists(settings.DOCKER_HOST, tag):
        return tag
    if not build:
        return ""
    log = _Log(None, echo=echo)
    images.image_build(
        settings.DOCKER_HOST,
        dockerfile=dockerfile,
        tag=tag,
        network="host",
        timeout_s=BUILTIN_BUILD_TIMEOUT_S,
        on_output=log.write,
    )
    return tag


def _final_stage(packages_tag: str) -> tuple[str, dict[str, bytes]]:
    """The sandbox image's own Dockerfile (user, agent, entrypoint) on top of the packages,
    and its context (the agent bundle)."""
    text = SANDBOX_DOCKERFILE.read_text()
    text = text.replace(f"FROM {DEBIAN_BASE}\n", f"FROM {packages_tag}\n", 1)
    return text, {agent_bundle.file_name(): agent_bundle.bundle()}


def _final_key(builtin: Builtin, packages_tag: str, dockerfile: str) -> str:
    digest = hashlib.sha256(
        f"{packages_tag}\0{dockerfile}\0{agent_bundle.file_name()}".encode()
    ).hexdigest()[:12]
    return f"builtin-{builtin.name}-{digest}"


def _builtin_fields(
    builtin: Builtin, *, build: bool, on_output: Callable[[str], None] | None
) -> dict[str, object]:
    """The row fields of a built-in, built first (with `build`) when its content key is new.
    One process at a time per built-in (a file lock beside the root file systems): two
    test runs starting together would otherwise build the same thing into the same place."""
    name = builtin.name
    fields: dict[str, object] = {
        "description": builtin.description,
        "dockerfile": builtin.dockerfile,
    }
    started = time.monotonic()
    log = _Log(None, echo=on_output)
    try:
        packages = _packages_stage(builtin, build=build, echo=on_output)
    except ProviderError as exc:
        fields.update(BuildOutcome(error=exc.message).row_fields(log))
        packages = ""
    if packages:
        dockerfile, context = _final_stage(packages)
        tag, root = _artifact_names(_final_key(builtin, packages, dockerfile))
        if _artifacts_ready(tag, root):
            log.write(f"==> {name}: {tag} is up to date\n")
            fields.update(
                BuildOutcome(
                    error="",
                    image=tag,
                    rootfs=str(root),
                    size_bytes=images.image_size(settings.DOCKER_HOST, tag),
                    languages=tuple(template_languages(root)),
                ).row_fields(log)
            )
        elif build:
            log.write(f"==> {name}: building {tag}\n")
            outcome = _run_build(
                log,
                checked=CheckedDockerfile(text=dockerfile, bases=(packages,)),
                tag=tag,
                root=root,
                network="none",
                timeout_s=BUILTIN_BUILD_TIMEOUT_S,
                max_bytes=None,
                context=context,
            )
            fields.update(outcome.row_fields(log))
            fields["build_seconds"] = time.monotonic() - started
            if not outcome.error:
                _builtin_prune(name)
    return fields


@contextmanager
def _builtin_lock(name: str) -> Iterator[None]:
    root = Path(settings.SANDPIT_TEMPLATE_ROOT)
    root.mkdir(mode=0o755, parents=True, exist_ok=True)
    with open(root / f".builtin-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def templates_builtin_build(
    names: list[str],
    *,
    build: bool = True,
    record: bool = True,
    on_output: Callable[[str], None] | None = None,
) -> list[Template]:
    """Make the built-in templates `names` ready: (with `build`) their image and root file
    system, reused when their content key is on this machine already (a second run takes
    about a second), and (with `record`) their rows. Without `build` a missing one is left
    as it is; without `record` nothing is read or written in the database and the returned
    rows are unsaved. Raises ApplicationError for an unknown name or a missing base image.

    Two stages, each cached by content: the packages on the Debian base (minutes: apt), then
    the sandbox image's Dockerfile on top (seconds: user, agent); a changed agent redoes
    only the second."""
    out: list[Template] = []
    for name in names:
        builtin = BUILTINS.get(name)
        if builtin is None:
            raise ApplicationError(f"No built-in template '{name}' ({', '.join(BUILTINS)}).")
        with _builtin_lock(name):
            fields = _builtin_fields(builtin, build=build, on_output=on_output)
        if not record:
            out.append(Template(organization=None, name=name, **fields))
            continue
        template, _ = Template.objects.update_or_create(
            organization=None, name=name, defaults=fields
        )
        out.append(template)
    return out


KEEP_BUILTIN_BUILDS = 3
"""Built-ins of older trees kept per name: other checkouts on the machine may test theirs."""


def _builtin_prune(name: str) -> None:
    """Remove all but the newest KEEP_BUILTIN_BUILDS builds of a built-in (image and root
    file system) and of its packages stage; one still in use stays (and is logged)."""
    for repository, prefix, root in (
        (IMAGE_REPOSITORY, f"builtin-{name}-", Path(settings.SANDPIT_TEMPLATE_ROOT)),
        (f"{IMAGE_REPOSITORY}-packages", f"{name}-", None),
    ):
        tags = [
            tag
            for tag in images.image_tags(settings.DOCKER_HOST, repository)
            if tag.split(":", 1)[1].startswith(prefix)
        ]
        for tag in tags[KEEP_BUILTIN_BUILDS:]:
            try:
                images.image_remove(settings.DOCKER_HOST, tag)
            except ProviderError as exc:
                logger.warning("old built-in template kept: %s", exc.message)
                continue
            if root is not None:
                template_artifacts_remove(image="", rootfs=str(root / tag.split(":", 1)[1]))


def _artifacts_ready(tag: str, root: Path) -> bool:
    if not images.image_exists(settings.DOCKER_HOST, tag):
        return False
    try:
        rootfs_module.rootfs_check(root)
    except rootfs_module.RootfsInvalid:
        return False
    return True


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
