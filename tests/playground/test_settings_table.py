"""The README's configuration table and playground/settings.py name the same variables.

The table is the one place an operator looks; settings.py is the one place the environment is
read. This fails when a variable is added, renamed or removed on one side only, or when a
literal default in settings.py is not the one the table shows.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV_HELPERS = {"env_str", "env_int", "env_bool", "env_list"}
# Variables in the table that settings.py does not read, each with the program that does.
READ_ELSEWHERE = {
    "SANDPIT_WORKER_CONCURRENCY": "docker/app/entrypoint.sh",
}
# Literal defaults the table describes in words instead of printing.
DESCRIBED_DEFAULTS = {"DJANGO_SECRET_KEY"}


def settings_variables() -> dict[str, object]:
    """Every variable settings.py reads -> its literal default (None when computed)."""
    tree = ast.parse((ROOT / "playground" / "settings.py").read_text())
    found: dict[str, object] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        is_helper = isinstance(func, ast.Name) and func.id in ENV_HELPERS
        is_environ = isinstance(func, ast.Attribute) and ast.unparse(func) in {
            "os.environ.get",
            "os.getenv",
        }
        first = node.args[0]
        if not (is_helper or is_environ) or not isinstance(first, ast.Constant):
            continue
        default = node.args[1] if len(node.args) > 1 else None
        for keyword in node.keywords:
            if keyword.arg == "default":
                default = keyword.value
        literal = default.value if isinstance(default, ast.Constant) else None
        if found.get(first.value) is None:
            found[first.value] = literal
    return found


def readme_rows() -> dict[str, str]:
    """Every variable in the README's configuration table -> its default cell."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("\n## Configuration\n") :]
    section = section[: section.index("\n## ", 1)]
    rows: dict[str, str] = {}
    tables = 0
    for line in section.splitlines():
        if line.startswith("| variable |"):
            tables += 1
        if not line.startswith("| `"):
            continue
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        names = re.findall(r"`([A-Z][A-Z0-9_]+)`", cells[0])
        parts = cells[1].split(" / ")
        for index, name in enumerate(names):
            assert name not in rows, f"{name} appears twice in the table"
            rows[name] = parts[index] if len(parts) == len(names) else cells[1]
    assert tables == 1, "the Configuration section must hold exactly one table"
    return rows


def _shows(cell: str, value: object) -> bool:
    if isinstance(value, bool):
        return ("true" if value else "false") in cell.lower()
    if isinstance(value, int):
        return re.search(rf"(?<![\d.]){value}(?![\d.])", cell.replace(",", "")) is not None
    return str(value) in cell


def test_table_lists_exactly_what_settings_reads() -> None:
    in_settings = set(settings_variables())
    in_table = set(readme_rows())
    assert sorted(in_settings - in_table) == [], "read in settings.py, missing from the README"
    assert sorted(in_table - in_settings - set(READ_ELSEWHERE)) == [], "in the README only"


def test_table_shows_each_literal_default() -> None:
    rows = readme_rows()
    wrong = {
        name: (default, rows[name])
        for name, default in settings_variables().items()
        if default not in (None, "")
        and name not in DESCRIBED_DEFAULTS
        and name in rows
        and not _shows(rows[name], default)
    }
    assert wrong == {}


def test_no_second_configuration_table() -> None:
    text = (ROOT / "README.md").read_text()
    operations = text[text.index("\n## Operations\n") :]
    assert "| `DJANGO_ENV`" not in operations
