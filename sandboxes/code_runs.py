"""Running a snippet in any language of sandboxes/languages.py, through a provider's exec.

Short code of an interpreted language with an inline form is one exec (`python3 -c code`).
Everything else goes through a build directory in the sandbox's /tmp: one exec writes the
source (from stdin) and, for a compiled language, runs the compiler in the same step; a
second runs the program; a last one removes the directory. Each step has its own time
limit and output bound; the sandbox's memory and process limits hold for all of them.

No Django here: the steps take an `exec` callable (the service passes the provider's,
wrapped in its error handling), so every step is part of the one counted operation.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import shlex
from collections.abc import Callable
from dataclasses import dataclass

from .languages import BUILD_ROOT, Language, Toolchain
from .providers.base import ExecRequest, ExecResult, ProviderError

INLINE_CODE_BYTES = 96 * 1024
"""Longer code goes through a file: one argument may not exceed 128 KiB on Linux."""
COMPILE_TIMEOUT_S = 30.0
"""The compile step's time limit when the caller gives none (separate from the run's)."""
COMPILE_OUTPUT_BYTES = 64 * 1024
"""At most this much of the compiler's stdout and of its stderr is kept."""
CLEANUP_TIMEOUT_S = 10.0
WRITE_FAILED = 125
"""The write step's exit status when it could not create the source file."""

# $1 the build directory, $2 the source file; stdin the source. Then exec the compiler,
# if any (the rest of the arguments), so its status and output are the step's.
_WRITE_THEN_COMPILE = (
    'umask 077 && mkdir -p -- "$1" && cat > "$2" || exit 125; shift 2; [ "$#" -eq 0 ] || exec "$@"'
)
_JAVA_PUBLIC_CLASS = re.compile(
    r"^[ \t]*public[ \t]+(?:final[ \t]+|abstract[ \t]+)*class[ \t]+([A-Za-z_$][\w$]*)", re.M
)
_JAVA_MAIN_CLASS = re.compile(
    r"^[ \t]*(?:final[ \t]+)?class[ \t]+([A-Za-z_$][\w$]*)[^{]*\{(?:(?!^[ \t]*class[ \t]).)*?"
    r"static[ \t]+void[ \t]+main[ \t]*\(",
    re.M | re.S,
)


@dataclass(frozen=True)
class CodeRun:
    """What running a snippet gave."""

    language: str
    result: ExecResult
    """The program's run; the compile step's when that failed (so its errors show)."""
    compile: ExecResult | None
    """The compile step; None when nothing was compiled."""

    @property
    def compile_failed(self) -> bool:
        """The compiler refused the code or ran out of its time (no run happened)."""
        return self.compile is not None and (self.compile.exit_code != 0 or self.compile.timed_out)


@dataclass(frozen=True)
class BuildPlan:
    """Where one run's files go and the argv of its steps (templates filled in)."""

    directory: str
    source: str
    compile: tuple[str, ...]
    run: tuple[str, ...]
    env: dict[str, str]


def java_class(code: str) -> str:
    """The class `java` must run: the public class, else the class declaring main, else
    Main (javac wants a public class in a file of its name)."""
    match = _JAVA_PUBLIC_CLASS.search(code) or _JAVA_MAIN_CLASS.search(code)
    return match.group(1) if match else "Main"


def build_plan(language: Language, toolchain: Toolchain, code: str, build_id: str) -> BuildPlan:
    """The paths and argv of a build-directory run of `code` (`build_id`: [0-9a-f]+)."""
    directory = f"{BUILD_ROOT}/build-{build_id}"
    stem = java_class(code) if language.name == "java" else language.file_stem
    values = {
        "dir": directory,
        "src": f"{directory}/{stem}.{language.extensions[0]}",
        "exe": f"{directory}/main",
        "class": stem,
    }

    def fill(argv: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(arg.format(**values) for arg in argv)

    return BuildPlan(
        directory=directory,
        source=values["src"],
        compile=fill(toolchain.compile),
        run=fill(toolchain.run),
        env={key: value.format(**values) for key, value in toolchain.env},
    )


def _inline(toolchain: Toolchain, code: str) -> bool:
    return (
        bool(toolchain.inline)
        and not toolchain.compile
        and len(code.encode(errors="surrogateescape")) <= INLINE_CODE_BYTES
        and "\x00" not in code
    )


def code_run(
    exec_: Callable[[ExecRequest], ExecResult],
    *,
    language: Language,
    toolchain: Toolchain,
    code: str,
    timeout_s: float,
    compile_timeout_s: float,
    stdin: bytes | None,
    max_output_bytes: int,
) -> CodeRun:
    """Run `code` with `toolchain` through `exec_`: compile (when the toolchain does, within
    `compile_timeout_s`; a failure ends the run), then run within `timeout_s` with `stdin`.
    The run's working directory is /workspace. Raises what `exec_` raises, and
    ProviderError when the source file could not be written."""
    if _inline(toolchain, code):
        argv = [*toolchain.inline, code]
        request = ExecRequest(
            command=argv[0],
            args=argv[1:],
            timeout_s=timeout_s,
            stdin=stdin,
            max_output_bytes=max_output_bytes,
            env=dict(toolchain.env),
        )
        return CodeRun(language=language.name, result=exec_(request), compile=None)
    plan = build_plan(language, toolchain, code, secrets.token_hex(8))
    try:
        written = exec_(
            ExecRequest(
                command="sh",
                args=["-c", _WRITE_THEN_COMPILE, "sandpit-build", plan.directory, plan.source]
                + list(plan.compile),
                env=plan.env,
                timeout_s=compile_timeout_s,
                stdin=code.encode(errors="surrogateescape"),
                max_output_bytes=min(max_output_bytes, COMPILE_OUTPUT_BYTES),
            )
        )
        if written.exit_code == WRITE_FAILED and not plan.compile:
            raise ProviderError("Could not write the code file: " + _tail(written.stderr))
        compiled = written if plan.compile else None
        if compiled is not None and (compiled.exit_code != 0 or compiled.timed_out):
            return CodeRun(language=language.name, result=compiled, compile=compiled)
        result = exec_(
            ExecRequest(
                command=plan.run[0],
                args=list(plan.run[1:]),
                env=plan.env,
                timeout_s=timeout_s,
                stdin=stdin,
                max_output_bytes=max_output_bytes,
            )
        )
        return CodeRun(language=language.name, result=result, compile=compiled)
    finally:
        with contextlib.suppress(Exception):  # best effort: the sandbox may be gone
            exec_(
                ExecRequest(
                    command="rm",
                    args=["-rf", "--", plan.directory],
                    timeout_s=CLEANUP_TIMEOUT_S,
                )
            )


def streamed_argv(language: Language, toolchain: Toolchain, code: str) -> list[str]:
    """One argv for a streamed run (its output arrives as it is made): the inline form, or
    a shell that writes the source, compiles (stdin closed; a failure ends it with the
    compiler's status and a line on stderr), runs the program on the stream's stdin and
    removes the build directory. The code travels as an argument (at most 128 KiB)."""
    if _inline(toolchain, code):
        return [*toolchain.inline, code]
    plan = build_plan(language, toolchain, code, secrets.token_hex(8))
    exports = "".join(f"export {k}={shlex.quote(v)}; " for k, v in plan.env.items())
    steps = [
        exports,
        'umask 077 && mkdir -p -- "$1" && printf %s "$2" > "$3" || exit 125; ',
    ]
    if plan.compile:
        steps.append(
            f'{shlex.join(plan.compile)} </dev/null || {{ s=$?; rm -rf -- "$1"; '
            'echo "sandpit: compilation failed (exit $s)" >&2; exit $s; }; '
        )
    steps.append(f'{shlex.join(plan.run)}; s=$?; rm -rf -- "$1"; exit $s')
    return ["sh", "-c", "".join(steps), "sandpit-run", plan.directory, code, plan.source]


def _tail(data: bytes, limit: int = 300) -> str:
    return data.decode(errors="replace")[-limit:]
