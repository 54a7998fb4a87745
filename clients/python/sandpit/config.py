"""Where the SDK finds the server and the key: arguments, then SANDPIT_URL / SANDPIT_API_KEY,
then the file `sandpit login` writes ($XDG_CONFIG_HOME/sandpit/config.json, mode 0600)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from .errors import AuthError

DEFAULT_URL = "http://127.0.0.1:8000"


def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "sandpit" / "config.json"


def read_config_file() -> dict[str, str]:
    try:
        data = json.loads(config_path().read_text())
    except (OSError, ValueError):
        return {}
    return (
        {k: str(v) for k, v in data.items() if isinstance(v, str)} if isinstance(data, dict) else {}
    )


def write_config_file(*, url: str, api_key: str) -> Path:
    """Store the login; the file is created with mode 0600 (it holds a secret)."""
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump({"url": url, "api_key": api_key}, out)
    os.chmod(path, 0o600)
    return path


@dataclass(frozen=True)
class Config:
    url: str
    """The server's base URL, without /api/v1."""
    api_key: str
    """An organization API key (sp_...) or a sandbox token."""


def resolve_config(url: str | None = None, api_key: str | None = None) -> Config:
    """Arguments win, then the environment, then the login file. A missing key raises AuthError."""
    stored = read_config_file()
    url = url or os.environ.get("SANDPIT_URL") or stored.get("url") or DEFAULT_URL
    api_key = api_key or os.environ.get("SANDPIT_API_KEY") or stored.get("api_key")
    if not api_key:
        raise AuthError(
            "No API key: pass api_key=, set SANDPIT_API_KEY or run `sandpit login`.",
            code="not_authenticated",
        )
    return Config(url=url.rstrip("/"), api_key=api_key)
