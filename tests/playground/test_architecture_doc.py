"""docs/architecture.md is where a newcomer starts: every file or folder it names must exist,
so a move or a rename that forgets the page fails here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
TOP = "accounts|billing|clients|common|docs|e2bcompat|playground|sandboxes|tests"
NAMED_PATH = re.compile(r"(?<![\w/.])(?:" + TOP + r")/[\w./-]*")
PYTHON_FILE = re.compile(r"[\w./-]+\.py\b")


def named_paths(text: str) -> set[str]:
    """Paths from the repository root (`sandboxes/realtime/`, `common/errors.py`)."""
    return {match.rstrip(".,") for match in NAMED_PATH.findall(text)}


def test_every_path_the_architecture_page_names_exists() -> None:
    paths = named_paths(DOC.read_text())
    assert len(paths) > 40  # the page was read
    assert sorted(p for p in paths if not (ROOT / p).exists()) == []


def test_every_python_file_the_page_names_is_found() -> None:
    """A file named without its folder (`terminals.py` in the diagram, under a column that
    names sandboxes/) must be in a folder the page names, so a reader can find it."""
    text = DOC.read_text()
    named = [ROOT / p for p in named_paths(text)]
    folders = {p for p in named if p.is_dir()} | {p.parent for p in named if p.suffix == ".py"}
    bare = {name for name in PYTHON_FILE.findall(text) if "/" not in name}
    assert len(bare) > 10
    assert sorted(n for n in bare if not any((f / n).exists() for f in folders)) == []


def test_the_checker_sees_paths_in_prose_and_diagrams() -> None:
    text = "see sandboxes/caller.py, and (common/) plus `tests/playground/test_x.py`."
    assert named_paths(text) == {"sandboxes/caller.py", "common/", "tests/playground/test_x.py"}
