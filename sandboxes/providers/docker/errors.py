"""Error translation: the one place docker-py and Engine errors become ours."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import docker.errors
import requests.exceptions

from sandboxes.providers.base import (
    ProviderError,
    ProviderNotConfigured,
    ProviderUnavailable,
    ResourceExhausted,
    SandboxGone,
)


@contextmanager
def translate(provider_id: str | None = None) -> Iterator[None]:
    try:
        yield
    except ProviderError:
        raise
    except docker.errors.ImageNotFound as exc:
        raise ProviderNotConfigured(
            f"Sandbox image missing ({exc.explanation}); run scripts/build-sandbox-image.sh."
        ) from exc
    except docker.errors.NotFound as exc:
        if provider_id is None:
            raise ProviderError(str(exc.explanation)) from exc
        raise SandboxGone(f"Sandbox {provider_id} no longer exists.") from exc
    except docker.errors.APIError as exc:
        text = str(exc.explanation or exc)
        if exc.status_code == 409 and ("not running" in text or "paused" in text):
            raise SandboxGone(f"Sandbox {provider_id} is not running.") from exc
        if "no space left" in text:
            raise ResourceExhausted(text) from exc
        if exc.status_code is not None and exc.status_code >= 500 and "connect" in text:
            raise ProviderUnavailable(text) from exc
        raise ProviderError(f"Docker engine error: {text}") from exc
    except (requests.exceptions.ConnectionError, requests.exceptions.Timeout) as exc:
        raise ProviderUnavailable(f"The Docker engine cannot be reached: {exc}") from exc
    except docker.errors.DockerException as exc:
        raise ProviderUnavailable(f"The Docker engine cannot be reached: {exc}") from exc
    except (ConnectionError, TimeoutError) as exc:
        raise ProviderUnavailable(f"Lost the connection to the Docker engine: {exc}") from exc
