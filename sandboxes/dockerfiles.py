"""Checking a template's Dockerfile before anything builds it, and pinning its bases.

A Dockerfile is the user's program for the build, run on this machine's Docker engine, so
what the classic builder could reach beyond the build's own containers is refused here:

* FROM only Sandpit's own images (the sandbox image as `sandpit`, a built-in template, or a
  ready template of the same organization, by name) or an earlier stage: never a registry
  (builds do not pull) and never another image that happens to be on the machine, such as
  another organization's template. The FROM is rewritten to the exact local image.
* `COPY/ADD --from` only an earlier stage; ADD never from a URL (the daemon, on the host's
  network, would fetch it); no VOLUME (anonymous volumes on the host's disk at run time),
  ONBUILD (code run by later builds), ENTRYPOINT (the sandbox runs under tini and the
  agent), RUN flags (`--mount` could bind host paths under BuildKit; the classic builder
  has none), FROM --platform (an emulated build) or parser directives (`# escape=` changes
  how every later line reads).

Continuation lines are joined and comments dropped, as Docker reads them; the result is one
instruction per line.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from common.errors import ApplicationError, PayloadTooLarge

MAX_DOCKERFILE_BYTES = 64 * 1024
"""A Dockerfile is a recipe, not a payload: larger ones are refused (413 at the API)."""
MAX_INSTRUCTIONS = 500

_REFUSED = {
    "VOLUME": "VOLUME is not allowed: a sandbox's writable places are /workspace and /tmp.",
    "ONBUILD": "ONBUILD is not allowed.",
    "ENTRYPOINT": "ENTRYPOINT is not allowed: sandboxes run under tini and Sandpit's agent.",
    "MAINTAINER": None,  # deprecated but harmless; kept out of the error list below
}
_KNOWN = {
    "FROM",
    "RUN",
    "CMD",
    "LABEL",
    "EXPOSE",
    "ENV",
    "ADD",
    "COPY",
    "USER",
    "WORKDIR",
    "ARG",
    "STOPSIGNAL",
    "HEALTHCHECK",
    "SHELL",
    *_REFUSED,
}
_DIRECTIVE = re.compile(r"#\s*([a-zA-Z][a-zA-Z0-9_-]*)\s*=")
_STAGE_NAME = re.compile(r"^[a-zA-Z][a-zA-Z0-9_.-]{0,62}$")


class DockerfileRefused(ApplicationError):
    """The Dockerfile asks for something templates may not do (400)."""

    code = "dockerfile_refused"
    status_code = 400


@dataclass(frozen=True)
class CheckedDockerfile:
    """A Dockerfile that passed, with every FROM pinned to a local image."""

    text: str
    """What the engine builds."""
    bases: tuple[str, ...]
    """The Sandpit image names its FROMs asked for, in order (not stages)."""


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first physical line number, instruction) pairs, continuations joined."""
    lines = text.splitlines()
    out: list[tuple[int, str]] = []
    current: list[str] = []
    start = 0
    at_top = True
    for number, raw in enumerate(lines, start=1):
        stripped = raw.strip()
        if at_top and _DIRECTIVE.match(stripped):
            raise DockerfileRefused(
                f"Line {number}: parser directives (# escape=, # syntax=, …) are not allowed."
            )
        if stripped.startswith("#") or (not stripped and current):
            continue  # comments, and blank lines inside a continuation
        if not stripped:
            continue
        at_top = False
        if not current:
            start = number
        if stripped.endswith("\\"):
            current.append(stripped[:-1].rstrip())
            continue
        current.append(stripped)
        out.append((start, " ".join(part for part in current if part)))
        current = []
    if current:
        out.append((start, " ".join(part for part in current if part)))
    return out


def _flags(words: list[str]) -> tuple[dict[str, str], list[str]]:
    flags: dict[str, str] = {}
    rest = list(words)
    while rest and rest[0].startswith("--"):
        name, _, value = rest.pop(0)[2:].partition("=")
        flags[name.lower()] = value
    return flags, rest


def dockerfile_check(text: str, *, resolve_base: Callable[[str], str | None]) -> CheckedDockerfile:
    """Check `text` and pin its bases. `resolve_base(name)` gives the local image a FROM
    name stands for, or None when it names nothing the caller may build on.

    Raises DockerfileRefused (400) naming the first offending line, PayloadTooLarge (413)
    past MAX_DOCKERFILE_BYTES."""
    if len(text.encode()) > MAX_DOCKERFILE_BYTES:
        raise PayloadTooLarge(
            f"Dockerfiles are limited to {MAX_DOCKERFILE_BYTES} bytes.", code="dockerfile_too_large"
        )
    if "\x00" in text:
        raise DockerfileRefused("The Dockerfile holds a NUL byte.")
    instructions = _logical_lines(text)
    if not instructions:
        raise DockerfileRefused("The Dockerfile is empty: start it with FROM python (or node,…).")
    if len(instructions) > MAX_INSTRUCTIONS:
        raise DockerfileRefused(f"Dockerfiles are limited to {MAX_INSTRUCTIONS} instructions.")
    stages: list[str] = []
    bases: list[str] = []
    out: list[str] = []
    for number, line in instructions:
        keyword, _, argument = line.partition(" ")
        keyword = keyword.upper()
        words = argument.split()
        if keyword not in _KNOWN:
            raise DockerfileRefused(f"Line {number}: unknown instruction {keyword}.")
        if not stages and keyword not in ("FROM", "ARG"):
            raise DockerfileRefused(f"Line {number}: a Dockerfile starts with FROM.")
        message = _REFUSED.get(keyword)
        if message:
            raise DockerfileRefused(f"Line {number}: {message}")
        if keyword == "FROM":
            flags, rest = _flags(words)
            if flags:
                raise DockerfileRefused(f"Line {number}: FROM takes no flags (--platform, …).")
            if len(rest) not in (1, 3) or (len(rest) == 3 and rest[1].upper() != "AS"):
                raise DockerfileRefused(f"Line {number}: FROM <image> [AS <stage>].")
            name = rest[0]
            if name.lower() in (s.lower() for s in stages):
                image = name
            else:
                if "$" in name:
                    raise DockerfileRefused(f"Line {number}: FROM cannot use build arguments.")
                resolved = resolve_base(name)
                if resolved is None:
                    raise DockerfileRefused(
                        f"Line {number}: FROM {name} is not available. Build on `sandpit` (the "
                        "sandbox image), a built-in template (python, node, polyglot) or one of "
                        "this organization's ready templates; builds never pull from a registry."
                    )
                bases.append(name)
                image = resolved
            stage = ""
            if len(rest) == 3:
                stage = rest[2]
                if not _STAGE_NAME.match(stage):
                    raise DockerfileRefused(f"Line {number}: invalid stage name {stage!r}.")
            stages.append(stage or f"#{len(stages)}")
            out.append(f"FROM {image}" + (f" AS {stage}" if stage else ""))
            continue
        if keyword in ("COPY", "ADD"):
            flags, rest = _flags(words)
            source = flags.get("from")
            if source is not None and source.lower() not in (
                *(s.lower() for s in stages[:-1]),
                *(str(i) for i in range(len(stages) - 1)),
            ):
                raise DockerfileRefused(
                    f"Line {number}: {keyword} --from may only name an earlier stage."
                )
            if keyword == "ADD" and "://" in argument:
                raise DockerfileRefused(
                    f"Line {number}: ADD from a URL is not allowed (use RUN with a "
                    "network-enabled build)."
                )
        if keyword == "RUN" and words and words[0].startswith("--"):
            raise DockerfileRefused(f"Line {number}: RUN takes no flags (--mount, --network, …).")
        out.append(f"{keyword} {argument}".rstrip())
    return CheckedDockerfile(text="\n".join(out) + "\n", bases=tuple(bases))
