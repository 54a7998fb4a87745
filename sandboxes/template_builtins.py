"""The built-in templates every organization sees, and how they are built and kept.

`python manage.py build_templates` (and `make test`'s set-up, and `make run` in the
background) call `templates_builtin_build`: two stages, each cached by content, so an
unchanged tree checks in about a second and a new agent rebuilds only the small second stage.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from common.errors import ApplicationError

from .dockerfiles import CheckedDockerfile
from .models import Template
from .providers import agent_bundle
from .providers.base import ProviderError
from .providers.docker import images
from .providers.local import rootfs as rootfs_module
from .template_builds import (
    IMAGE_REPOSITORY,
    BuildOutcome,
    _Log,
    artifact_names,
    run_build,
    template_artifacts_remove,
    template_languages,
)

logger = logging.getLogger(__name__)

BUILTIN_BUILD_TIMEOUT_S = 3600

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
        tag, root = artifact_names(_final_key(builtin, packages, dockerfile))
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
            outcome = run_build(
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
