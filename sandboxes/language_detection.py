"""Which language a snippet is in, when the caller did not say (see detect_language).

The names are those of sandboxes/languages.py; this module only reads text.
"""

from __future__ import annotations

import re

DETECT_CHARS = 64 * 1024
"""Detection reads this much of the code: the markers sit near the top (shebang, package,
includes, class), and every pattern is a linear scan, so a 1 MiB snippet costs no more."""

_SHEBANG = re.compile(r"\A#![ \t]*(\S+)(?:[ \t]+(?:-\S+[ \t]+)*(\S+))?")
_SHEBANG_PROGRAMS = {
    "python": "python",
    "python3": "python",
    "node": "node",
    "nodejs": "node",
    "bash": "bash",
    "sh": "bash",
    "dash": "bash",
    "zsh": "bash",
    "tsx": "typescript",
    "ts-node": "typescript",
    "deno": "typescript",
    "ruby": "ruby",
    "perl": "perl",
    "php": "php",
    "lua": "lua",
    "luajit": "lua",
}
# (language, patterns) in order: strong, line-anchored markers first, so a Python program
# that merely mentions `fn main()` in a string or comment is not taken for Rust. All the
# patterns of an entry must match (each searched on its own: one pattern spanning lines
# would rescan the rest of the text from every candidate line). No pattern crosses a line.
_CPP_HEADERS = (
    "iostream|vector|string|map|bits/stdc\\+\\+\\.h|algorithm|cstdio|cstdlib|set|unordered_map|"
    "memory|sstream|fstream|iomanip|queue|array|utility"
)
_MARKERS: tuple[tuple[str, tuple[re.Pattern[str], ...]], ...] = (
    ("php", (re.compile(r"\A\s*<\?php\b"),)),
    (
        "go",
        (
            re.compile(r"^package[ \t]+main\b", re.M),
            re.compile(r"^func[ \t]+main[ \t]*\(", re.M),
        ),
    ),
    (
        "go",
        (
            re.compile(r"^package[ \t]+\w+[ \t]*$", re.M),
            re.compile(r"^import[ \t]+(\(|\")", re.M),
        ),
    ),
    ("rust", (re.compile(r"^[ \t]*(pub[ \t]+)?fn[ \t]+main[ \t]*\(\)", re.M),)),
    ("rust", (re.compile(r"^[ \t]*use[ \t]+std::[\w:{}, ]+;[ \t]*$", re.M),)),
    ("java", (re.compile(r"^[ \t]*(public[ \t]+)?(final[ \t]+)?class[ \t]+\w+[^\n]*\{", re.M),)),
    ("java", (re.compile(r"public[ \t]+static[ \t]+void[ \t]+main[ \t]*\([ \t]*String"),)),
    ("cpp", (re.compile(rf"^[ \t]*#[ \t]*include[ \t]*<({_CPP_HEADERS})>", re.M),)),
    ("cpp", (re.compile(r"^[ \t]*using[ \t]+namespace[ \t]+std[ \t]*;", re.M),)),
    ("c", (re.compile(r"^[ \t]*#[ \t]*include[ \t]*[<\"]", re.M),)),
    ("c", (re.compile(r"^[ \t]*int[ \t]+main[ \t]*\([^)\n]*\)[ \t]*\{?[ \t]*$", re.M),)),
)
_CPP_HINTS = re.compile(r"\bstd::|\bcout\b|\bcin\b|\btemplate[ \t]*<|\bnamespace\b|\bclass\b")
_TYPESCRIPT = re.compile(
    r"^[ \t]*(export[ \t]+)?(interface|type)[ \t]+[A-Z]\w*(<[^>\n]*>)?[ \t]*(=|\{)"
    r"|^[ \t]*(const|let|var)[ \t]+\w+[ \t]*:[ \t]*(string|number|boolean|any|unknown|\w+\[\])\b"
    # a parameter with a type: up to the first ':' or ')' of the line, nothing to backtrack
    r"|^[ \t]*(export[ \t]+)?function[ \t]+\w+[ \t]*\([^):\n]*\w[ \t]*:[ \t]*\w",
    re.M,
)
_RUBY = re.compile(
    r"^[ \t]*puts[ \t(]|^[ \t]*require[ \t]+['\"]|\.each[ \t]+do[ \t]*\||^[ \t]*end[ \t]*$",
    re.M,
)
_PERL = re.compile(
    r"^[ \t]*use[ \t]+(strict|warnings)[ \t]*;|^[ \t]*my[ \t]+[$@%]\w+"
    r"|^[ \t]*print[ \t]+\"[^\"\n]*\"[ \t]*;[ \t]*$",
    re.M,
)
_LUA = re.compile(r"^[ \t]*local[ \t]+(function[ \t]+)?\w+|^[ \t]*--\[\[|\bthen[ \t]*$", re.M)
_BASH = re.compile(
    r"^[ \t]*(echo|printf|cd|ls|cat|export|for[ \t]+\w+[ \t]+in|if[ \t]+\[|while[ \t]+\[|fi|done|"
    r"grep|sed|awk|set[ \t]+-\w+|source|mkdir|rm|cp|mv|pwd|uname|apt(-get)?|pip3?|npm)\b"
    r"(?![ \t]*[(=.:])",
    re.M,
)
_PYTHON = re.compile(
    r"^[ \t]*(def[ \t]+\w+[ \t]*\(.*\)[ \t]*(->[^:]+)?:|class[ \t]+\w+[ \t]*(\(.*\))?:|"
    r"import[ \t]+\w+(\.\w+)*([ \t]+as[ \t]+\w+)?[ \t]*(,[ \t]*\w+)*[ \t]*$|"
    r"from[ \t]+[\w.]+[ \t]+import[ \t]|print[ \t]*\(|if[ \t]+__name__|for[ \t]+\w+[ \t]+in[ \t]+.*:[ \t]*$)",
    re.M,
)
# The seeds' rule, kept as the last resort: Python indicators anywhere, else Node.
_PYTHON_HINTS = ("print(", "import ", "def ", 'f"', "f'", "__", "sys.", "json.")
_NODE = re.compile(r"\bconsole\.\w+\(|\brequire\([\"']|\bconst\b|\blet\b|=>|\bfunction\b")


def _shebang(code: str) -> str | None:
    match = _SHEBANG.match(code)
    if match is None:
        return None
    program = match.group(1).rsplit("/", 1)[-1]
    if program == "env" and match.group(2):
        program = match.group(2)
    program = re.sub(r"[\d.]+$", "", program) or program  # python3.11, lua5.4
    return _SHEBANG_PROGRAMS.get(program) or _SHEBANG_PROGRAMS.get(program + "3")


def detect_language(code: str) -> str:
    """The language `code` is most likely in: a shebang names it; else the first strong,
    line-anchored marker (`<?php`, `package main` + `func main(`, `fn main()`, a Java
    class, `#include`); else TypeScript type annotations, Python statements, Node idioms,
    Ruby, Perl or shell commands; else the seeds' rule (Python indicators, else node)."""
    code = code[:DETECT_CHARS]
    by_shebang = _shebang(code)
    if by_shebang is not None:
        return by_shebang
    for name, patterns in _MARKERS:
        if all(pattern.search(code) for pattern in patterns):
            if name == "c" and _CPP_HINTS.search(code):
                return "cpp"
            return name
    if _TYPESCRIPT.search(code):
        return "typescript"
    python = _PYTHON.search(code) is not None
    node = _NODE.search(code) is not None
    if not node and _LUA.search(code):
        return "lua"
    if python and not node:
        return "python"
    if node and not python:
        return "node"
    if _PERL.search(code):
        return "perl"
    if not python and _RUBY.search(code) and not _BASH.search(code):
        return "ruby"
    if not python and not node and _BASH.search(code):
        return "bash"
    if any(hint in code for hint in _PYTHON_HINTS):
        return "python"
    return "node"
