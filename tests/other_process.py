"""Code run in another process on the test's database and Redis prefix (`manage.py shell`),
as a second web process, a worker or an operator's shell would run it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parents[1]


def run_in_another_process(code: str) -> None:
    """Run `code` there; the test's data must be committed (a transactional test)."""
    parts = urlsplit(os.environ["DATABASE_URL"])
    env = {
        **os.environ,
        "DATABASE_URL": urlunsplit(parts._replace(path="/" + connection.settings_dict["NAME"])),
        "SANDPIT_REDIS_PREFIX": settings.CACHES["default"]["KEY_PREFIX"],
    }
    subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code], cwd=ROOT, env=env, check=True
    )
