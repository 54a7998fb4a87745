"""The product's imports against what a plain install gets.

`make run` on a fresh machine and the app image install only `[project].dependencies` (no
extras); the suite runs with the dev and cloud extras, where anything imports. This test
reads every product module's module-level imports and checks that a plain install provides
each one: the standard library, Sandpit's own packages, or a distribution the main
dependencies require (directly or through theirs). Imports inside functions (the cloud
SDKs, each adapter's own) and under TYPE_CHECKING are optional by design and not read."""

from __future__ import annotations

import ast
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
FIRST_PARTY = {"accounts", "billing", "common", "e2bcompat", "playground", "sandboxes"}


def _main_dependencies() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(spec) for spec in project["dependencies"]]


def _installed_closure(requirements: list[Requirement]) -> set[str]:
    """Canonical names of the distributions `requirements` bring in, with theirs (extras
    as each requirement names them; markers read on this machine)."""
    seen: set[str] = set()
    pending = [(requirement, frozenset(requirement.extras)) for requirement in requirements]
    while pending:
        requirement, extras = pending.pop()
        name = canonicalize_name(requirement.name)
        if name in seen:
            continue
        seen.add(name)
        for spec in metadata.distribution(name).requires or []:
            child = Requirement(spec)
            wanted = child.marker is None or any(
                child.marker.evaluate({"extra": extra}) for extra in {"", *extras}
            )
            if wanted:
                pending.append((child, frozenset(child.extras)))
    return seen


def _is_type_checking(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _module_level_imports(tree: ast.Module) -> set[str]:
    """Top-level names imported by the module's own statements (and those of its
    module-level ifs other than TYPE_CHECKING): what importing the module needs."""
    names: set[str] = set()
    statements = list(tree.body)
    while statements:
        node = statements.pop()
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.If) and not _is_type_checking(node):
            statements += node.body + node.orelse
    return names


def test_a_plain_install_provides_every_module_level_import():
    providers = metadata.packages_distributions()
    installed = _installed_closure(_main_dependencies())
    missing: dict[str, set[str]] = {}
    files = [p for package in FIRST_PARTY for p in (ROOT / package).rglob("*.py")]
    assert len(files) > 100
    for path in [*files, ROOT / "manage.py"]:
        for name in _module_level_imports(ast.parse(path.read_text(), str(path))):
            if name in sys.stdlib_module_names or name in FIRST_PARTY or name == "__future__":
                continue
            distributions = {canonicalize_name(d) for d in providers.get(name, [])}
            if not distributions & installed:
                missing.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    assert missing == {}, (
        f"imported at module level but not installed by [project].dependencies: {missing}"
    )


def test_the_closure_reads_requirements_as_pip_does():
    """The check's own footing: Django brings asgiref and sqlparse; the e2b package brings
    connectrpc and protobuf-py; nothing of the dev extras (pytest) is in a plain install."""
    installed = _installed_closure(_main_dependencies())
    assert {"django", "asgiref", "sqlparse", "e2b", "connectrpc", "protobuf-py"} <= installed
    assert "pytest" not in installed and "schemathesis" not in installed
    tree = ast.parse(
        "import os\nimport yaml.x\nfrom docker import errors\nif TYPE_CHECKING:\n"
        "    import modal\ndef f():\n    import daytona\nif True:\n    import redis\n"
    )
    assert _module_level_imports(tree) == {"os", "yaml", "docker", "redis"}
