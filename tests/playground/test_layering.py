"""The layering rules, read from the imports (ast), so a shortcut fails here and not in review.

* Sandbox interfaces (REST views, the realtime package, the preview proxy, routing, tasks,
  page views) never import a provider or billing's metering and idempotency: they resolve
  tenancy with a selector and call one service, which meters (sandboxes/caller.py).
* Providers never import Django models (they receive dataclasses and return dataclasses).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INTERFACES = [
    "sandboxes/apis.py",
    "sandboxes/realtime_apis.py",
    "sandboxes/realtime",
    "sandboxes/preview",
    "sandboxes/routing.py",
    "sandboxes/tasks.py",
    "sandboxes/urls.py",
    "playground/views.py",
]
FORBIDDEN_IN_INTERFACES = (
    "sandboxes.providers",
    "billing.metering",
    "billing.idempotency",
)


def _files(entry: str) -> list[Path]:
    path = ROOT / entry
    return sorted(path.rglob("*.py")) if path.is_dir() else [path]


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def imported_modules(path: Path) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import in `path`, relative ones resolved;
    `from x import y` yields both x and x.y (y may be a module)."""
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            yield node.lineno, module
            for alias in node.names:
                yield node.lineno, f"{module}.{alias.name}"


def _violations(paths: list[Path], forbidden: tuple[str, ...]) -> list[str]:
    found = []
    for path in paths:
        for line, module in imported_modules(path):
            if any(module == f or module.startswith(f + ".") for f in forbidden):
                found.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    return sorted(set(found))


def test_sandbox_interfaces_reach_providers_and_billing_only_through_services() -> None:
    paths = [p for entry in INTERFACES for p in _files(entry)]
    assert len(paths) > len(INTERFACES)  # the realtime package was found
    assert _violations(paths, FORBIDDEN_IN_INTERFACES) == []


def test_providers_never_import_django_models() -> None:
    paths = _files("sandboxes/providers")
    forbidden = ("django.db", "sandboxes.models", "accounts.models", "billing.models")
    assert _violations(paths, forbidden) == []


def test_the_checker_sees_relative_and_from_imports(tmp_path: Path) -> None:
    """The rule above is only as good as the parser: a relative import of a provider from
    an interface module must be caught."""
    package = ROOT / "sandboxes" / "realtime"
    probe = package / "_layering_probe.py"
    probe.write_text("from ..providers.base import ProviderError\nfrom billing import metering\n")
    try:
        assert _violations([probe], FORBIDDEN_IN_INTERFACES) == [
            "sandboxes/realtime/_layering_probe.py:1 imports sandboxes.providers.base",
            "sandboxes/realtime/_layering_probe.py:1 imports sandboxes.providers.base.ProviderError",
            "sandboxes/realtime/_layering_probe.py:2 imports billing.metering",
        ]
    finally:
        probe.unlink()


APPS = ("accounts", "billing", "e2bcompat", "playground", "sandboxes")


def test_common_imports_no_app() -> None:
    """common/ is the base every app stands on (errors, inputs, metrics, logging): an import
    of an app from it would make a circle."""
    paths = _files("common")
    assert len(paths) >= 8
    assert _violations(paths, APPS) == []
