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
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


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


# --- function-level imports ---------------------------------------------------------------------

IMPORT_CHECKED = ("common", *APPS)
AGENT_FIRST_USE = (
    "the in-sandbox agent starts on every sandbox boot: what only some requests need is "
    "imported when first needed (ctypes alone costs 10-40 ms there, sandboxes/agent/spawn.py)"
)
FUNCTION_LEVEL_IMPORTS_ALLOWED: dict[tuple[str, str], str] = {
    ("sandboxes/apps.py", "sandboxes.templates"): (
        "AppConfig.ready(), Django's place to connect signal receivers"
    ),
    ("accounts/apps.py", "accounts.keycache"): (
        "AppConfig.ready(), Django's place to connect signal receivers"
    ),
    ("accounts/apps.py", "accounts.orgcache"): (
        "AppConfig.ready(), Django's place to connect signal receivers and register extensions"
    ),
    ("billing/apps.py", "billing.metering"): (
        "AppConfig.ready(), Django's place to register extensions (what authentication reads)"
    ),
    ("playground/apps.py", "playground.schema"): (
        "AppConfig.ready(), Django's place to register extensions (drf-spectacular's)"
    ),
    ("sandboxes/providers/__init__.py", "sandboxes.providers.e2b"): (
        "an optional provider (the e2b extra): its adapter loads when the provider is built"
    ),
    ("sandboxes/providers/cloud/codesandbox.py", "httpx"): (
        "an optional SDK (the codesandbox extra)"
    ),
    ("playground/webserver.py", "sandboxes.services"): (
        "daphne's ready callable: the models load once daphne has imported the application"
    ),
    ("sandboxes/agent/spawn.py", "ctypes"): AGENT_FIRST_USE,
    ("sandboxes/agent/inotify.py", "ctypes"): AGENT_FIRST_USE,
    ("sandboxes/agent/wire.py", "socket"): AGENT_FIRST_USE,
    ("sandboxes/agent/server.py", "sandboxes.agent.inotify"): AGENT_FIRST_USE,
    ("sandboxes/agent/server.py", "sandboxes.agent.sessions"): AGENT_FIRST_USE,
    ("sandboxes/agent/server.py", "sandboxes.agent.files"): AGENT_FIRST_USE,
    ("sandboxes/agent/server.py", "sandboxes.agent.ports"): AGENT_FIRST_USE,
    ("sandboxes/agent/server.py", "sandboxes.agent.terminal"): AGENT_FIRST_USE,
    ("sandboxes/agent/procs.py", "fcntl"): AGENT_FIRST_USE,
    ("sandboxes/agent/procs.py", "termios"): AGENT_FIRST_USE,
    ("sandboxes/agent/terminal.py", "fcntl"): AGENT_FIRST_USE,
    ("sandboxes/agent/terminal.py", "struct"): AGENT_FIRST_USE,
    ("sandboxes/agent/terminal.py", "termios"): AGENT_FIRST_USE,
}
"""(file, module) -> why it is imported inside a function. Anything else is imported at the
top of its module: a function-level import hides an import circle or a heavy dependency
from the reader, and moves an ImportError from start-up to the first request."""


def function_level_imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import statement inside a function or method
    of `path` (relative imports resolved; `from x import y` names x, `from . import y` y)."""
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    functions = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
    for outer in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(outer, functions):
            continue
        for node in ast.walk(outer):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield node.lineno, alias.name
            elif isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                if node.module:
                    yield node.lineno, ".".join([*base, node.module])
                else:  # `from . import x`: x is a module
                    for alias in node.names:
                        yield node.lineno, ".".join([*base, alias.name])


def _app_files() -> list[Path]:
    return [
        path
        for entry in IMPORT_CHECKED
        for path in _files(entry)
        if "migrations" not in path.relative_to(ROOT).parts
    ]


def _function_level_imports(paths: list[Path]) -> set[tuple[str, int, str]]:
    # A nested function is walked again inside its enclosing one: the set keeps one of each.
    return {
        (str(path.relative_to(ROOT)), line, module)
        for path in paths
        for line, module in function_level_imports(path)
    }


def test_no_function_level_imports_outside_the_allowlist() -> None:
    paths = _app_files()
    assert len(paths) > 100  # the apps were found
    found = _function_level_imports(paths)
    unexplained = sorted(
        f"{name}:{line} imports {module}"
        for name, line, module in found
        if (name, module) not in FUNCTION_LEVEL_IMPORTS_ALLOWED
    )
    assert unexplained == [], "import these at the top of the module (or allow one, with why)"
    # An entry whose import went is removed too, so the list stays as short as the truth.
    used = {(name, module) for name, _, module in found}
    assert sorted(set(FUNCTION_LEVEL_IMPORTS_ALLOWED) - used) == []


def test_the_checker_sees_imports_in_methods_and_nested_functions() -> None:
    probe = ROOT / "sandboxes" / "realtime" / "_import_probe.py"
    probe.write_text(
        "import os\n"
        "class A:\n"
        "    def m(self):\n"
        "        from ..providers import base\n"
        "        def inner():\n"
        "            import json\n"
        "async def f():\n"
        "    from . import auth, exec\n"
    )
    try:
        assert sorted(_function_level_imports([probe])) == [
            ("sandboxes/realtime/_import_probe.py", 4, "sandboxes.providers"),
            ("sandboxes/realtime/_import_probe.py", 6, "json"),
            ("sandboxes/realtime/_import_probe.py", 8, "sandboxes.realtime.auth"),
            ("sandboxes/realtime/_import_probe.py", 8, "sandboxes.realtime.exec"),
        ]
    finally:
        probe.unlink()
