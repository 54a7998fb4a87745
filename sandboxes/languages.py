"""The one language table: every language Sandpit runs code in, how, and what it needs.

Detection (which language a snippet is in) lives in sandboxes/language_detection.py.
Everything that turns a language name into argv reads it from here: `/code` and `/run`
(sandboxes/code_runs.py, over a provider's exec: providers have no `run_code` of their
own), streamed runs (sandboxes/streaming.py), the language list of a sandbox and the template builder's probe.

A language has one or more toolchains, in order of preference; a sandbox runs the first
whose binaries it has. A toolchain either takes the code as one argument (`inline`, the
fast path of short snippets) or runs a source file written into a build directory inside
the sandbox (BUILD_ROOT/build-<id>), compiling it first when it has a `compile` step.
Argv templates use {dir} (the build directory), {src} (the source file), {exe} (the
compiled program) and {class} (Java's public class).

Pure Python, no Django: providers import it too.
"""

from __future__ import annotations

import os
import shutil
import subprocess  # noqa: S404 - the rootfs probe runs a template's node under bwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

# Re-exported: callers of the table ask it for a name too.
from .language_detection import detect_language as detect_language

BUILD_ROOT = "/tmp/.sandpit"
"""Where sources and compiled programs go inside a sandbox (its own /tmp, never the
workspace, so a run leaves no files behind for the user to trip over)."""

NODE_22 = "node>=22"
"""A pseudo-binary: node whose major version is 22 or later (it strips TypeScript types).
Probes answer it by running node (see PROBE_SCRIPT and rootfs_has_binary)."""


@dataclass(frozen=True)
class Toolchain:
    """One way to run a language."""

    needs: tuple[str, ...]
    """Binaries (names looked up on PATH) that must all be present."""
    run: tuple[str, ...]
    """argv of the run, on the source file ({src}) or the compiled program ({exe})."""
    compile: tuple[str, ...] = ()
    """argv of the compile step; empty when the language is interpreted."""
    inline: tuple[str, ...] = ()
    """argv that takes the code itself as its last argument (python3 -c); empty: never."""
    env: tuple[tuple[str, str], ...] = ()
    """Extra environment for both steps (templates as in argv)."""


@dataclass(frozen=True)
class Language:
    """A language people can ask for by name (or an alias), with its toolchains."""

    name: str
    label: str
    aliases: tuple[str, ...]
    extensions: tuple[str, ...]
    """File extensions, without the dot; the first names the source file."""
    toolchains: tuple[Toolchain, ...]
    compiled: bool = False
    """Compiled ahead of running (a failed compile is the 'compile_error' verdict)."""
    file_stem: str = "main"
    """The source file's name without extension (Java: the public class's name)."""
    sample: str = field(default="", compare=False)
    """A hello-world program (the playground's first scratch file, the tests)."""

    @property
    def binaries(self) -> tuple[str, ...]:
        """Every binary any of its toolchains may need."""
        seen: dict[str, None] = {}
        for toolchain in self.toolchains:
            seen.update(dict.fromkeys(toolchain.needs))
        return tuple(seen)

    def toolchain(self, has_binary: Callable[[str], bool]) -> Toolchain | None:
        """The first toolchain whose binaries are all present; None when none is."""
        for toolchain in self.toolchains:
            if all(has_binary(b) for b in toolchain.needs):
                return toolchain
        return None


_C_FLAGS = ("-O2", "-pipe", "-o", "{exe}", "{src}", "-lm")
_CPP_FLAGS = ("-O2", "-pipe", "-std=c++17", "-o", "{exe}", "{src}")
# The JVM sizes its heap and threads from the sandbox's cgroup; serial GC and the C1
# compiler start faster and stay under a 64-process pids limit.
_JVM = ("-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto")

LANGUAGES: tuple[Language, ...] = (
    Language(
        name="python",
        label="Python",
        aliases=("python3", "py"),
        extensions=("py",),
        toolchains=(
            Toolchain(
                needs=("python3",),
                run=("python3", "-u", "{src}"),
                inline=("python3", "-u", "-c"),
            ),
        ),
        sample='print("Hello, world!")\n',
    ),
    Language(
        name="node",
        label="Node.js",
        aliases=("javascript", "js", "nodejs"),
        extensions=("js", "mjs", "cjs"),
        toolchains=(Toolchain(needs=("node",), run=("node", "{src}"), inline=("node", "-e")),),
        sample='console.log("Hello, world!");\n',
    ),
    Language(
        name="typescript",
        label="TypeScript",
        aliases=("ts",),
        extensions=("ts", "mts"),
        toolchains=(
            Toolchain(needs=("tsx",), run=("tsx", "{src}")),
            Toolchain(
                needs=("tsc", "node"),
                compile=(
                    "tsc",
                    "--target",
                    "es2022",
                    "--module",
                    "commonjs",
                    "--skipLibCheck",
                    "--outDir",
                    "{dir}",
                    "{src}",
                ),
                run=("node", "{dir}/main.js"),
            ),
            Toolchain(
                needs=(NODE_22,),
                run=("node", "--experimental-strip-types", "--no-warnings", "{src}"),
            ),
        ),
        sample='const greeting: string = "Hello, world!";\nconsole.log(greeting);\n',
    ),
    Language(
        name="bash",
        label="Bash",
        aliases=("sh", "shell"),
        extensions=("sh", "bash"),
        toolchains=(Toolchain(needs=("bash",), run=("bash", "{src}"), inline=("bash", "-c")),),
        sample='echo "Hello, world!"\n',
    ),
    Language(
        name="c",
        label="C",
        aliases=("gcc",),
        extensions=("c",),
        compiled=True,
        toolchains=(
            Toolchain(needs=("gcc",), compile=("gcc", *_C_FLAGS), run=("{exe}",)),
            Toolchain(needs=("cc",), compile=("cc", *_C_FLAGS), run=("{exe}",)),
            Toolchain(needs=("clang",), compile=("clang", *_C_FLAGS), run=("{exe}",)),
        ),
        sample='#include <stdio.h>\n\nint main(void) {\n    printf("Hello, world!\\n");\n'
        "    return 0;\n}\n",
    ),
    Language(
        name="cpp",
        label="C++",
        aliases=("c++", "cxx", "g++"),
        extensions=("cpp", "cc", "cxx"),
        compiled=True,
        toolchains=(
            Toolchain(needs=("g++",), compile=("g++", *_CPP_FLAGS), run=("{exe}",)),
            Toolchain(needs=("clang++",), compile=("clang++", *_CPP_FLAGS), run=("{exe}",)),
        ),
        sample='#include <iostream>\n\nint main() {\n    std::cout << "Hello, world!" '
        "<< std::endl;\n    return 0;\n}\n",
    ),
    Language(
        name="go",
        label="Go",
        aliases=("golang",),
        extensions=("go",),
        compiled=True,
        toolchains=(
            Toolchain(
                needs=("go",),
                compile=("go", "build", "-o", "{exe}", "{src}"),
                run=("{exe}",),
                # The build cache outlives one run (the standard library is built once
                # per sandbox); no module download, no toolchain switch.
                env=(
                    ("GOCACHE", f"{BUILD_ROOT}/go-cache"),
                    ("GOPATH", f"{BUILD_ROOT}/go"),
                    ("GOTOOLCHAIN", "local"),
                    ("CGO_ENABLED", "0"),
                ),
            ),
        ),
        sample='package main\n\nimport "fmt"\n\nfunc main() {\n    fmt.Println("Hello, world!")'
        "\n}\n",
    ),
    Language(
        name="rust",
        label="Rust",
        aliases=("rs", "rustc"),
        extensions=("rs",),
        compiled=True,
        toolchains=(
            Toolchain(
                needs=("rustc",),
                compile=("rustc", "--edition", "2021", "-O", "-o", "{exe}", "{src}"),
                run=("{exe}",),
            ),
        ),
        sample='fn main() {\n    println!("Hello, world!");\n}\n',
    ),
    Language(
        name="java",
        label="Java",
        aliases=("javac",),
        extensions=("java",),
        compiled=True,
        file_stem="Main",
        toolchains=(
            Toolchain(
                needs=("javac", "java"),
                compile=(
                    "javac",
                    *(f"-J{flag}" for flag in _JVM),
                    "-encoding",
                    "UTF-8",
                    "-d",
                    "{dir}",
                    "{src}",
                ),
                run=("java", *_JVM, "-cp", "{dir}", "{class}"),
            ),
        ),
        sample="public class Main {\n    public static void main(String[] args) {\n"
        '        System.out.println("Hello, world!");\n    }\n}\n',
    ),
    Language(
        name="ruby",
        label="Ruby",
        aliases=("rb",),
        extensions=("rb",),
        toolchains=(Toolchain(needs=("ruby",), run=("ruby", "{src}"), inline=("ruby", "-e")),),
        sample='puts "Hello, world!"\n',
    ),
    Language(
        name="perl",
        label="Perl",
        aliases=("pl",),
        extensions=("pl", "pm"),
        toolchains=(Toolchain(needs=("perl",), run=("perl", "{src}"), inline=("perl", "-e")),),
        sample='print "Hello, world!\\n";\n',
    ),
    Language(
        name="php",
        label="PHP",
        aliases=(),
        extensions=("php",),
        toolchains=(Toolchain(needs=("php",), run=("php", "{src}")),),
        sample='<?php\necho "Hello, world!\\n";\n',
    ),
    Language(
        name="lua",
        label="Lua",
        aliases=(),
        extensions=("lua",),
        toolchains=(
            Toolchain(needs=("lua5.4",), run=("lua5.4", "{src}")),
            Toolchain(needs=("lua",), run=("lua", "{src}")),
            Toolchain(needs=("luajit",), run=("luajit", "{src}")),
        ),
        sample='print("Hello, world!")\n',
    ),
)

BY_NAME: dict[str, Language] = {language.name: language for language in LANGUAGES}
_BY_ALIAS: dict[str, Language] = {
    alias: language
    for language in LANGUAGES
    for alias in (*language.extensions, language.name, *language.aliases)
}
ALL_BINARIES: tuple[str, ...] = tuple(
    dict.fromkeys(b for language in LANGUAGES for b in language.binaries)
)


def lookup(name: str) -> Language | None:
    """The language called `name`, one of its aliases or file extensions (any case; `sandpit
    run x.rs` sends the extension); None when unknown."""
    return _BY_ALIAS.get(name.strip().lower())


def extension_of(language: str) -> str:
    """The source file extension of a language (no dot)."""
    return BY_NAME[language].extensions[0]


def languages_in(has_binary: Callable[[str], bool]) -> list[str]:
    """The languages (table order) that an environment can run: those with a toolchain
    whose binaries `has_binary` says are there. Works for a root filesystem directory
    (rootfs_has_binary) or a running sandbox (present_binaries of PROBE_SCRIPT's output)."""
    cache: dict[str, bool] = {}

    def known(binary: str) -> bool:
        if binary not in cache:
            cache[binary] = has_binary(binary)
        return cache[binary]

    return [language.name for language in LANGUAGES if language.toolchain(known) is not None]


# --- probes -----------------------------------------------------------------------------------

PROBE_SCRIPT = (
    'for b in "$@"; do command -v "$b" >/dev/null 2>&1 && echo "$b"; done; '
    "node -e 'process.exit(+process.versions.node.split(\".\")[0] >= 22 ? 0 : 1)' "
    f">/dev/null 2>&1 && echo '{NODE_22}'; exit 0"
)
"""`sh -c PROBE_SCRIPT probe <binary>...` prints the binaries present in a sandbox, one a
line, and NODE_22 when its node is new enough."""


def probe_argv() -> list[str]:
    """argv that probes a running sandbox for every binary of the table (see PROBE_SCRIPT)."""
    plain = [b for b in ALL_BINARIES if b != NODE_22]
    return ["sh", "-c", PROBE_SCRIPT, "sandpit-probe", *plain]


def present_binaries(probe_output: str) -> frozenset[str]:
    """The set PROBE_SCRIPT printed (names it was not asked about are ignored)."""
    return frozenset(line.strip() for line in probe_output.splitlines()) & set(ALL_BINARIES)


_PATH_DIRS = ("usr/local/bin", "usr/bin", "bin", "usr/local/sbin", "usr/sbin", "sbin")


def _inside(root: Path, path: str, hops: int = 40) -> Path | None:
    """`path` resolved as a process chrooted at `root` would see it (symlinks, absolute
    ones included, stay under root); None when it does not exist or loops."""
    current = root
    parts = [p for p in path.split("/") if p and p != "."]
    while parts:
        part = parts.pop(0)
        if part == "..":
            current = current.parent if current != root else root
            continue
        candidate = current / part
        if candidate.is_symlink():
            hops -= 1
            if hops < 0:
                return None
            target = os.readlink(candidate)
            if target.startswith("/"):
                current = root
            parts = [p for p in target.split("/") if p and p != "."] + parts
            continue
        if not candidate.exists():
            return None
        current = candidate
    return current


def rootfs_has_binary(root: Path | str) -> Callable[[str], bool]:
    """A `has_binary` for a root filesystem directory (a template's rootfs, or "/" for the
    host's /usr that local jails use): an executable file in a PATH directory, links
    resolved inside `root`. NODE_22 runs that node under bubblewrap (False without it)."""
    base = Path(root)

    def find(binary: str) -> Path | None:
        for directory in _PATH_DIRS:
            found = _inside(base, f"{directory}/{binary}")
            if found is not None and found.is_file() and os.access(found, os.X_OK):
                return found
        return None

    def has_binary(binary: str) -> bool:
        if binary == NODE_22:
            return find("node") is not None and _node_major(base) >= 22
        return find(binary) is not None

    return has_binary


def languages_in_rootfs(root: Path | str) -> list[str]:
    """The languages a root filesystem directory runs (a template's, at build time)."""
    return languages_in(rootfs_has_binary(root))


def _node_major(root: Path) -> int:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return 0
    argv = [bwrap, "--ro-bind", str(root), "/", "--proc", "/proc", "--dev", "/dev"]
    argv += ["--unshare-all", "node", "-p", "process.versions.node.split('.')[0]"]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=20, check=False)  # noqa: S603
        return int(done.stdout.strip() or 0)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return 0


def names() -> list[str]:
    """Every language name, in table order."""
    return [language.name for language in LANGUAGES]
