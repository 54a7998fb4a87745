"""Template images on the local Docker engine: build, inspect, export, remove.

The only place templates touch Docker (the provider fence: nothing outside
sandboxes/providers/ imports `docker`). Builds use the classic builder (the Engine API's
default), which has no `RUN --mount` and so no way to bind a host path into a build; the
context is the Dockerfile alone, so COPY/ADD have no host files to read. `pull=False`:
every FROM must already be on this engine (sandboxes/templates.py allows only Sandpit's own
images there). Proxy settings of the engine's client configuration are not passed in.
"""

from __future__ import annotations

import io
import re
import tarfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import docker
import docker.errors
import requests.exceptions
import urllib3.exceptions

from sandboxes.providers.base import ProviderError, ProviderUnavailable

BUILD_MEMORY_BYTES = 2 * 1024 * 1024 * 1024
"""Memory (and memory+swap) of each container a build runs its steps in."""
BUILD_CPU_SHARES = 256
"""A quarter of a default container's CPU weight: a busy build gives way to sandboxes."""


class BuildFailed(ProviderError):
    """The build did not produce an image; the message says why (the log has the rest)."""


@dataclass(frozen=True)
class BuiltImage:
    """An image a build produced."""

    tag: str
    image_id: str
    size_bytes: int


def _client(base_url: str) -> Any:
    try:
        return docker.APIClient(base_url=base_url, version="auto", timeout=60)
    except docker.errors.DockerException as exc:
        raise ProviderUnavailable(f"The Docker engine is not reachable: {exc}") from exc


def image_exists(base_url: str, reference: str) -> bool:
    """Whether `reference` (a tag or id) names an image on the engine."""
    try:
        _client(base_url).inspect_image(reference)
    except docker.errors.ImageNotFound:
        return False
    except docker.errors.DockerException as exc:
        raise ProviderUnavailable(f"The Docker engine is not reachable: {exc}") from exc
    return True


def image_id(base_url: str, reference: str) -> str | None:
    """The image id of `reference`, None when the engine has no such image."""
    try:
        return str(_client(base_url).inspect_image(reference)["Id"])
    except docker.errors.ImageNotFound:
        return None
    except docker.errors.DockerException as exc:
        raise ProviderUnavailable(f"The Docker engine is not reachable: {exc}") from exc


def image_remove(base_url: str, reference: str) -> bool:
    """Remove the image tag (and its layers no other image uses). False when it was not
    there; ProviderError when a container still uses it."""
    try:
        _client(base_url).remove_image(reference, force=False, noprune=False)
    except docker.errors.ImageNotFound:
        return False
    except docker.errors.APIError as exc:
        raise ProviderError(f"Cannot remove image {reference}: {exc.explanation}") from exc
    return True


def image_build(
    base_url: str,
    *,
    dockerfile: str,
    tag: str,
    network: str,
    timeout_s: float,
    on_output: Callable[[str], None],
    context: Mapping[str, bytes] | None = None,
) -> BuiltImage:
    """Build `dockerfile` (its own text is the whole context) as `tag`.

    `network`: the network mode of its RUN steps: 'none' (no network at all), 'bridge'
    (Docker's NAT) or 'host' (the platform's own built-ins only). Output is handed to
    `on_output` as it arrives. Raises BuildFailed for a failed step, a missing base image
    or a build past `timeout_s` seconds (the connection is closed, which makes the engine
    cancel the build, and the running step's container is removed at once). `context`: files beside the
    Dockerfile (the platform's own builds only; a user's Dockerfile gets none)."""
    api = _client(base_url)
    deadline = time.monotonic() + timeout_s
    step_container = ""
    finished = False
    try:
        stream: Iterator[dict[str, Any]] = api.build(
            fileobj=_context_tar(dockerfile, context or {}),
            custom_context=True,
            tag=tag,
            rm=True,
            forcerm=True,
            pull=False,
            nocache=False,
            decode=True,
            network_mode=network,
            container_limits={
                "memory": BUILD_MEMORY_BYTES,
                "memswap": BUILD_MEMORY_BYTES,
                "cpushares": BUILD_CPU_SHARES,
            },
            use_config_proxy=False,
            timeout=max(1, int(timeout_s)),
        )
        for chunk in stream:
            if "stream" in chunk:
                text = str(chunk["stream"])
                running = _RUNNING_IN.search(text)
                step_container = running.group(1) if running else step_container
                on_output(text)
            if "error" in chunk:
                raise BuildFailed(_explain(str(chunk["error"])))
            if time.monotonic() > deadline:
                raise BuildFailed(f"The build took longer than {timeout_s:.0f} s.")
        finished = True
    except (
        requests.exceptions.ConnectionError,
        requests.exceptions.Timeout,
        urllib3.exceptions.HTTPError,
    ) as exc:
        if time.monotonic() >= deadline - 1:
            raise BuildFailed(f"The build took longer than {timeout_s:.0f} s.") from exc
        raise ProviderUnavailable(f"The Docker engine stopped answering: {exc}") from exc
    except docker.errors.APIError as exc:
        raise BuildFailed(_explain(str(exc.explanation or exc))) from exc
    finally:
        api.close()
        if not finished and step_container:
            # The engine cancels a build whose client went away, but in its own time: the
            # step's container is removed now, so nothing the build started outlives it.
            _remove_quietly(base_url, step_container)
    try:
        info = _client(base_url).inspect_image(tag)
    except docker.errors.ImageNotFound as exc:
        raise BuildFailed("The build finished without an image.") from exc
    return BuiltImage(tag=tag, image_id=str(info["Id"]), size_bytes=int(info.get("Size") or 0))


_RUNNING_IN = re.compile(r"---> Running in ([0-9a-f]{12,64})")


def _remove_quietly(base_url: str, container: str) -> None:
    try:
        _client(base_url).remove_container(container, force=True)
    except docker.errors.DockerException:
        pass  # already removed by the engine's own clean-up (forcerm)


def _context_tar(dockerfile: str, files: Mapping[str, bytes]) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in {"Dockerfile": dockerfile.encode(), **files}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            archive.addfile(info, io.BytesIO(data))
    buffer.seek(0)
    return buffer


def _explain(error: str) -> str:
    if "pull access denied" in error or "No such image" in error or "not found" in error:
        return (
            f"{error.strip()} — base images must already be on this machine (builds never "
            "pull from a registry)."
        )
    return error.strip()


def image_export(base_url: str, reference: str) -> Iterator[bytes]:
    """The image's file system as a tar stream (`docker create` + `docker export`); the
    stopped container it goes through is removed when the stream ends or is dropped."""
    api = _client(base_url)
    try:
        container = api.create_container(reference, command=["/bin/true"], network_disabled=True)
    except docker.errors.APIError as exc:
        raise ProviderError(f"Cannot export {reference}: {exc.explanation}") from exc
    cid = container["Id"]
    try:
        yield from api.export(cid, chunk_size=1024 * 1024)
    finally:
        try:
            api.remove_container(cid, force=True)
        except docker.errors.APIError:
            pass
        api.close()


def image_size(base_url: str, reference: str) -> int:
    """The image's size in bytes (0 when the engine has no such image)."""
    try:
        return int(_client(base_url).inspect_image(reference).get("Size") or 0)
    except docker.errors.ImageNotFound:
        return 0
    except docker.errors.DockerException as exc:
        raise ProviderUnavailable(f"The Docker engine is not reachable: {exc}") from exc


def image_tags(base_url: str, repository: str) -> list[str]:
    """The `repository:tag` names of the engine's images in `repository`, newest first."""
    try:
        rows = _client(base_url).images(name=repository)
    except docker.errors.DockerException as exc:
        raise ProviderUnavailable(f"The Docker engine is not reachable: {exc}") from exc
    rows.sort(key=lambda row: int(row.get("Created") or 0), reverse=True)
    return [
        tag for row in rows for tag in row.get("RepoTags") or () if tag.startswith(f"{repository}:")
    ]
