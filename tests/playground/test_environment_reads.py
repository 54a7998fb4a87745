"""playground/settings.py is the only server module that reads the environment.

Providers and services get their configuration from settings (cloud adapters in a
CloudConfig), so the README's configuration table, which tests/playground/test_settings_table.py
checks against settings.py, is the whole list of what the server reads.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVER_PACKAGES = ("accounts", "billing", "e2bcompat", "playground", "sandboxes")
# Programs that run inside a sandbox read the environment their caller gave them, not the
# server's; settings.py is the reader.
NOT_THE_SERVER = {
    "playground/settings.py",
    "sandboxes/agent",
    "sandboxes/programs",
}


def _reads(tree: ast.AST) -> list[int]:
    """Lines that read os.environ or call os.getenv. Setting the settings module's name
    (os.environ.setdefault, which Django's entry points need before settings exist) and
    setting a variable for child processes (os.environ[...] = ...) are not reads."""
    setdefaults = {
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "os.environ.setdefault"
    } | {
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Subscript)
        and isinstance(node.ctx, ast.Store)
        and ast.unparse(node.value) == "os.environ"
    }
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and ast.unparse(node) in {"os.environ", "os.getenv"}
        and node.lineno not in setdefaults
    ]


def test_only_settings_reads_the_environment() -> None:
    offenders = []
    for package in SERVER_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if any(relative == skip or relative.startswith(skip + "/") for skip in NOT_THE_SERVER):
                continue
            offenders += [f"{relative}:{line}" for line in _reads(ast.parse(path.read_text()))]
    assert offenders == []
