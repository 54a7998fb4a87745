"""mypy (with the django and DRF plugins) reports no error on the packages pyproject.toml's
[tool.mypy] lists: the whole application (sandboxes, playground, accounts, billing,
e2bcompat), interfaces included.

Runs in the suite so CI runs it; the cache under var/ keeps reruns to seconds, and a fresh
clone builds it on the first run.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_mypy_reports_no_errors() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(ROOT / "var" / "mypy_cache")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
