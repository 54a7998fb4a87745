"""Running a snippet on a bare provider the way the services do: sandboxes/code_runs.py over
the provider's exec, the toolchain chosen from sandboxes/languages.py by probing the sandbox.
`run_code` is no provider method: the services build it once from the language table, and
provider-level tests (which have no Sandbox row) use this instead."""

from __future__ import annotations

from sandboxes import languages
from sandboxes.code_runs import COMPILE_TIMEOUT_S, code_run
from sandboxes.providers.base import ExecRequest, ExecResult, InvalidRequest, SandboxProvider


def run_code(
    provider: SandboxProvider,
    provider_id: str,
    code: str,
    language: str,
    timeout_s: float = 30.0,
    stdin: bytes | None = None,
) -> ExecResult:
    """The program's run (or the compile step's when that failed). InvalidRequest for a
    language the table does not know or the sandbox cannot run."""
    found = languages.lookup(language)
    if found is None:
        raise InvalidRequest(f"unknown language {language!r}")
    toolchain = found.toolchains[0]
    if len(found.toolchains) > 1:
        argv = languages.probe_argv()
        probe = provider.exec(provider_id, ExecRequest(command=argv[0], args=argv[1:]))
        present = languages.present_binaries(probe.stdout.decode(errors="replace"))
        chosen = found.toolchain(present.__contains__)
        if chosen is None:
            raise InvalidRequest(f"the sandbox has no {found.label} toolchain")
        toolchain = chosen

    def exec_(request: ExecRequest) -> ExecResult:
        return provider.exec(provider_id, request)

    return code_run(
        exec_,
        language=found,
        toolchain=toolchain,
        code=code,
        timeout_s=timeout_s,
        compile_timeout_s=COMPILE_TIMEOUT_S,
        stdin=stdin,
        max_output_bytes=ExecRequest.max_output_bytes,
    ).result
