"""Code in many languages: which languages a sandbox can run, `/code` (sandbox_run_code)
and the one-shot judge `/run` (run_once).

The languages of a sandbox come from its environment, probed once: a built template's
`languages` when it has them, else one probe exec in the sandbox (which binaries of the
language table are on its PATH), cached per (provider, engine, template) for the life of
the process, never per request.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db.models import Q

from accounts.authentication import Principal
from common.errors import ApplicationError, Forbidden

from . import languages as table
from .activity import sandbox_touch
from .caller import Caller, metered
from .code_runs import COMPILE_TIMEOUT_S, CodeRun, code_run, streamed_argv
from .file_services import sandbox_file_write
from .models import BuildState, Sandbox, Template
from .provider_access import provider_call, provider_for, require_capability, require_running
from .providers.base import Capability, ExecRequest, ExecResult, ProviderError
from .services import sandbox_create, sandbox_destroy, sandbox_exec

CLASSIC = frozenset({"python3", "node", "bash"})
"""What a sandbox is assumed to have when it cannot be probed (no shell answers)."""
PROBE_TIMEOUT_S = 30.0

_probed: dict[tuple[str, str, str], frozenset[str]] = {}
_probe_lock = threading.Lock()


@dataclass(frozen=True)
class LanguageInfo:
    """One language a sandbox can run."""

    name: str
    label: str
    compiled: bool
    extensions: tuple[str, ...]
    aliases: tuple[str, ...]
    sample: str


def resolve_language(code: str, language: str | None) -> str:
    """The table's name for `language` (aliases and any case allowed), or the language
    detected from `code`. Raises ApplicationError 'unknown_language' (400)."""
    if not language:
        return table.detect_language(code)
    found = table.lookup(language)
    if found is None:
        raise ApplicationError(
            f"Unknown language '{language}'. Known: {', '.join(table.names())}.",
            code="unknown_language",
        )
    return found.name


def _template(sandbox: Sandbox) -> Template | None:
    """The sandbox's built template (its organization's before a built-in of that name);
    None for the provider's own environment."""
    if not sandbox.template or sandbox.template == "default":
        return None
    return (
        Template.objects.filter(state=BuildState.READY)
        .filter(Q(id=sandbox.template) | Q(name=sandbox.template))
        .filter(Q(organization_id=sandbox.organization_id) | Q(organization__isnull=True))
        .order_by("organization_id")  # the organization's own before a built-in one
        .first()
    )


def _environment(sandbox: Sandbox, template: Template | None) -> tuple[str, str, str]:
    """What the probe is cached by: the provider and engine, and the template's identity
    (its id and build time: two organizations' templates may share a name, and a name may
    be built again), or the template name the provider interprets itself."""
    if template is not None:
        built = template.built_at.isoformat() if template.built_at else ""
        identity = f"{template.pk}@{built}"
    else:
        identity = sandbox.template or "default"
    return (sandbox.provider, sandbox.engine or "", identity)


def sandbox_binaries(sandbox: Sandbox, template: Template | None = None) -> frozenset[str]:
    """The table's binaries present in the sandbox's environment: probed by one exec the
    first time an environment is seen by this process. Raises Conflict when the sandbox is
    not running and the environment was never probed."""
    key = _environment(sandbox, template if template is not None else _template(sandbox))
    found = _probed.get(key)
    if found is not None:
        return found
    require_running(sandbox)
    provider = provider_for(sandbox)
    present: frozenset[str] = frozenset()
    if Capability.EXEC in provider.capabilities:
        argv = table.probe_argv()
        request = ExecRequest(command=argv[0], args=argv[1:], timeout_s=PROBE_TIMEOUT_S)
        try:
            result = provider_call(sandbox, provider.exec, sandbox.provider_id, request)
            present = table.present_binaries(result.stdout.decode(errors="replace"))
        except ProviderError:
            present = frozenset()
    if not present:
        return CLASSIC  # not kept: the next request probes again
    with _probe_lock:
        _probed[key] = present
    return present


def sandbox_language_names(sandbox: Sandbox) -> list[str]:
    """The languages the sandbox can run, in table order (its template's list when the
    template recorded one, else the probe's)."""
    template = _template(sandbox)
    if template is not None and template.languages:
        return [name for name in template.languages if name in table.BY_NAME]
    return table.languages_in(sandbox_binaries(sandbox, template).__contains__)


def sandbox_languages(*, sandbox: Sandbox) -> list[LanguageInfo]:
    """The languages of a sandbox, for the API and the playground's menu. A read like the
    sandbox's detail: not counted (the probe runs at most once per environment). Raises
    Conflict when the sandbox is not running and its environment was never probed."""
    return [
        LanguageInfo(
            name=language.name,
            label=language.label,
            compiled=language.compiled,
            extensions=language.extensions,
            aliases=language.aliases,
            sample=language.sample,
        )
        for language in (table.BY_NAME[name] for name in sandbox_language_names(sandbox))
    ]


def _toolchain(sandbox: Sandbox, name: str) -> tuple[table.Language, table.Toolchain]:
    """The language and the toolchain the sandbox runs it with. Raises ApplicationError
    'language_unavailable' (400) naming what the sandbox has."""
    language = table.BY_NAME[name]
    available = sandbox_language_names(sandbox)
    toolchain = language.toolchain(sandbox_binaries(sandbox).__contains__)
    if name not in available or toolchain is None:
        raise ApplicationError(
            f"This sandbox has no {language.label} toolchain "
            f"(needs one of: {', '.join(' + '.join(t.needs) for t in language.toolchains)}). "
            f"It runs: {', '.join(available) or 'nothing the language table knows'}.",
            code="language_unavailable",
        )
    return language, toolchain


def _timeout(value: float | None, default: float) -> float:
    return min(value or default, settings.SANDPIT_MAX_COMMAND_TIMEOUT_S)


def sandbox_run_code(
    *,
    caller: Caller,
    sandbox: Sandbox,
    code: str,
    language: str | None = None,
    timeout_s: float | None = None,
    compile_timeout_s: float | None = None,
    stdin: bytes | None = None,
) -> CodeRun:
    """Run a snippet (compiled first when its language is), counted once whatever the
    steps. `timeout_s` (default 30) limits the run, `compile_timeout_s` (default 30) the
    compile step. Raises ApplicationError 'unknown_language' / 'language_unavailable'
    (400), Conflict when the sandbox is not running, and the provider's errors."""
    name = resolve_language(code, language)
    language_, toolchain = _toolchain(sandbox, name)
    with metered(caller, feature="exec", operation="code", scope="exec"):
        require_running(sandbox)
        provider = provider_for(sandbox)
        require_capability(provider, Capability.EXEC)  # code runs are built on exec

        def exec_(request: ExecRequest) -> ExecResult:
            result: ExecResult = provider_call(sandbox, provider.exec, sandbox.provider_id, request)
            return result

        run = code_run(
            exec_,
            language=language_,
            toolchain=toolchain,
            code=code,
            timeout_s=_timeout(timeout_s, 30.0),
            compile_timeout_s=_timeout(compile_timeout_s, COMPILE_TIMEOUT_S),
            stdin=stdin,
            max_output_bytes=settings.SANDPIT_MAX_OUTPUT_BYTES,
        )
    sandbox_touch(sandbox)
    return run


def code_stream_argv(sandbox: Sandbox, code: str, language: str | None) -> list[str]:
    """The argv of a streamed run of `code` in the sandbox (see code_runs.streamed_argv).
    Raises ApplicationError 'unknown_language' / 'language_unavailable' (400)."""
    language_, toolchain = _toolchain(sandbox, resolve_language(code, language))
    return streamed_argv(language_, toolchain, code)


# --- the one-shot judge -------------------------------------------------------------------


@dataclass(frozen=True)
class JudgeOutcome:
    verdict: str
    """'ok', 'compile_error', 'runtime_error', 'timeout', 'memory_limit' or 'output_limit'."""
    language: str | None
    result: ExecResult
    """The program's run, or the compile step's when it failed."""
    compile: ExecResult | None = None
    """The compile step of a compiled language; None otherwise."""


def judge_verdict(result: ExecResult, memory_limit_bytes: int) -> str:
    """The verdict of a run (the compile step is judged before: see run_once)."""
    if result.timed_out:
        return "timeout"
    near_limit = (
        result.peak_memory_bytes is not None
        and result.peak_memory_bytes >= memory_limit_bytes * 0.9
    )
    if result.oom_killed or (result.exit_code in (-9, 137) and near_limit):
        return "memory_limit"
    if result.truncated:
        return "output_limit"
    if result.exit_code != 0:
        return "runtime_error"
    return "ok"


def run_once(
    *,
    caller: Caller,
    code: str | None,
    command: str | None,
    language: str | None,
    files: Mapping[str, str],
    stdin: bytes | None,
    limits: Mapping[str, Any],
    provider_name: str | None = None,
) -> JudgeOutcome:
    """Create an ephemeral sandbox, write files, run (compiling first when the language
    is compiled), and always destroy it: one counted operation ('run', feature 'exec'); its
    steps are not counted on their own. Limits: `timeout_s` (default 10) for the run,
    `compile_timeout_s` (default 30) for the compile step, `memory_mb` and `pids` for the
    sandbox (both steps). A failed compile is the 'compile_error' verdict."""
    principal: Principal | None = caller.principal
    if principal is None:
        raise Forbidden("A one-shot run needs an organization.", code="token_not_allowed")
    resolved = resolve_language(code, language) if code is not None else None
    memory_mb = int(limits.get("memory_mb", 256))
    step = caller.unbilled()
    with metered(caller, feature="exec", operation="run"):
        sandbox = sandbox_create(
            principal=principal,
            provider_name=provider_name,
            resources={"memory_mb": memory_mb, "pids": int(limits.get("pids", 64))},
            ephemeral=True,
            timeout_s=120,
            caller=step,
        )
        try:
            for path, content in files.items():
                sandbox_file_write(caller=step, sandbox=sandbox, path=path, data=content.encode())
            timeout_s = float(limits.get("timeout_s", 10))
            compiled: ExecResult | None = None
            if code is not None:
                run = sandbox_run_code(
                    caller=step,
                    sandbox=sandbox,
                    code=code,
                    language=resolved,
                    timeout_s=timeout_s,
                    compile_timeout_s=limits.get("compile_timeout_s"),
                    stdin=stdin,
                )
                result, compiled = run.result, run.compile
                if run.compile_failed:
                    return JudgeOutcome("compile_error", resolved, result, compiled)
            else:
                result = sandbox_exec(
                    caller=step,
                    sandbox=sandbox,
                    command=command or "",
                    timeout_s=timeout_s,
                    stdin=stdin,
                )
        finally:
            sandbox_destroy(sandbox=sandbox, reason="ephemeral")
    return JudgeOutcome(judge_verdict(result, memory_mb * 1024 * 1024), resolved, result, compiled)
