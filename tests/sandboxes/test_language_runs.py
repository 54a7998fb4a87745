"""Every language of the table, run for real: compile then run, verdicts and limits.

The provider-level tests share one sandbox per provider (compilers take about a second a
program); the API tests cover the REST edges: the language list, /code, /run's verdicts,
refusals and counting."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sandboxes import languages as table
from sandboxes.code_runs import CodeRun, code_run, streamed_argv
from sandboxes.providers.base import ExecRequest, SandboxProvider, SandboxSpec
from tests.conftest import assert_error
from tests.requirements import missing_part

HELLO = b"Hello, world!\n"
# Programs of each compiled language that fail to compile, and what the compiler says.
BROKEN = {
    "c": ("int main(void) { return undefined_name; }\n", "undefined_name"),
    "cpp": ("int main() { std::vector<int> v; }\n", "vector"),
    "java": ('public class Main { void f() { int x = "s"; } }\n', "incompatible types"),
    "go": ("package main\n\nfunc main() { x := 1 }\n", "declared"),
    "rust": ('fn main() { let x: i32 = "s"; }\n', "mismatched types"),
    "typescript": ("const n: number = 'not a number';\nconsole.log(n);\n", "number"),
}
# Programs reading one line of stdin and printing it reversed: input reaches compiled ones.
ECHO_REVERSED = {
    "c": "#include <stdio.h>\n#include <string.h>\nint main(void){char b[64];"
    'if(!fgets(b,64,stdin))return 1;int n=strcspn(b,"\\n");'
    "for(int i=n-1;i>=0;i--)putchar(b[i]);putchar(10);return 0;}\n",
    "java": "import java.util.Scanner;\npublic class Rev { public static void main(String[] a)"
    " { String s = new Scanner(System.in).nextLine();"
    " System.out.println(new StringBuilder(s).reverse()); } }\n",
    "go": 'package main\n\nimport (\n\t"bufio"\n\t"fmt"\n\t"os"\n)\n\nfunc main() {\n'
    "\ts, _ := bufio.NewReader(os.Stdin).ReadString('\\n')\n\tr := []rune(s[:len(s)-1])\n"
    "\tfor i, j := 0, len(r)-1; i < j; i, j = i+1, j-1 {\n\t\tr[i], r[j] = r[j], r[i]\n\t}\n"
    "\tfmt.Println(string(r))\n}\n",
    "rust": "use std::io::Read;\nfn main() { let mut s = String::new();"
    " std::io::stdin().read_to_string(&mut s).unwrap();"
    ' println!("{}", s.trim_end().chars().rev().collect::<String>()); }\n',
}


class Box:
    """One sandbox of a provider and what the probe found in it."""

    def __init__(self, provider: SandboxProvider, provider_id: str) -> None:
        self.provider = provider
        self.id = provider_id
        argv = table.probe_argv()
        probe = provider.exec(provider_id, ExecRequest(command=argv[0], args=argv[1:]))
        self.present = table.present_binaries(probe.stdout.decode())
        self.languages = table.languages_in(self.present.__contains__)

    def exec(self, request: ExecRequest) -> Any:
        return self.provider.exec(self.id, request)

    def run(self, name: str, code: str, **kw: Any) -> CodeRun:
        language = table.BY_NAME[name]
        toolchain = language.toolchain(self.present.__contains__)
        assert toolchain is not None, f"{name} is not in this sandbox"
        options: dict[str, Any] = {
            "timeout_s": 20.0,
            "compile_timeout_s": 60.0,
            "stdin": None,
            "max_output_bytes": 1 << 20,
        }
        options.update(kw)
        return code_run(self.exec, language=language, toolchain=toolchain, code=code, **options)


def _box(provider: SandboxProvider, name: str, **spec: Any) -> Iterator[Box]:
    handle = provider.create(SandboxSpec(sandbox_id=name, **spec))
    try:
        yield Box(provider, handle.provider_id)
    finally:
        provider.destroy(handle.provider_id)


@pytest.fixture(scope="module")
def local_box(local_provider: SandboxProvider) -> Iterator[Box]:
    yield from _box(local_provider, "sbx_languages_local")


@pytest.fixture(scope="module")
def docker_box(docker_provider: SandboxProvider) -> Iterator[Box]:
    yield from _box(docker_provider, "sbx_languages_docker")


@pytest.fixture(scope="module")
def polyglot_box(local_provider: SandboxProvider) -> Iterator[Box]:
    """A local jail on the built-in polyglot template (built here when missing: cached by
    content, seconds when only the agent changed)."""
    from sandboxes.templates import templates_builtin_build

    try:
        template = templates_builtin_build(["polyglot"], record=False)[0]
    except Exception as exc:  # noqa: BLE001 - any failure to build is a missing part here
        missing_part(f"the polyglot template could not be built: {exc}")
    if not template.rootfs:
        missing_part(f"the polyglot template is not built: {template.error_message}")
    yield from _box(
        local_provider, "sbx_languages_polyglot", template="polyglot", rootfs=template.rootfs
    )


def test_local_default_offers_the_hosts_toolchains(local_box: Box) -> None:
    """The default local jail uses the host's /usr: whatever of the table it holds."""
    assert {"python", "node", "bash"} <= set(local_box.languages)
    for name, binary in (("c", "gcc"), ("cpp", "g++"), ("java", "javac"), ("perl", "perl")):
        if binary not in local_box.present:
            missing_part(f"this host has no {binary}: the local default cannot offer {name}")
        assert name in local_box.languages


def test_every_local_language_says_hello(local_box: Box) -> None:
    for name in local_box.languages:
        run = local_box.run(name, table.BY_NAME[name].sample)
        assert (run.result.stdout, run.result.exit_code) == (HELLO, 0), (name, run)
        assert (run.compile is not None) == bool(
            table.BY_NAME[name].toolchain(local_box.present.__contains__).compile  # type: ignore[union-attr]
        )
        if name not in ("python", "c"):  # the streamed form of one of each kind
            continue
        streamed = streamed_argv(
            table.BY_NAME[name],
            table.BY_NAME[name].toolchain(local_box.present.__contains__),  # type: ignore[arg-type]
            table.BY_NAME[name].sample,
        )
        through_stream = local_box.exec(
            ExecRequest(command=streamed[0], args=streamed[1:], timeout_s=60)
        )
        assert through_stream.stdout == HELLO, (name, through_stream)
    leftovers = local_box.exec(ExecRequest(command="ls -A /tmp/.sandpit"))
    assert set(leftovers.stdout.decode().split()) <= {"go-cache", "go"}  # builds cleaned up


def test_compile_errors_end_the_run_with_the_compilers_output(local_box: Box) -> None:
    for name in ("c", "cpp", "java"):
        code, expected = BROKEN[name]
        run = local_box.run(name, code)
        assert run.compile_failed and run.result is run.compile, name
        assert run.compile.exit_code != 0 and not run.compile.timed_out  # type: ignore[union-attr]
        assert expected in run.compile.stderr.decode() + run.compile.stdout.decode(), name  # type: ignore[union-attr]


def test_compiled_programs_read_stdin_and_report_runtime_errors(local_box: Box) -> None:
    for name in ("c", "java"):
        run = local_box.run(name, ECHO_REVERSED[name], stdin=b"sandpit\n")
        assert run.result.stdout == b"tipdnas\n" and not run.compile_failed, (name, run)
    crash = local_box.run("c", "#include <stdlib.h>\nint main(void){ abort(); }\n")
    assert not crash.compile_failed and crash.result.exit_code not in (0, None)
    thrown = local_box.run(
        "java",
        'public class T { public static void main(String[] a) {\n throw new RuntimeException("boom"); } }\n',
    )
    assert thrown.result.exit_code == 1 and b"boom" in thrown.result.stderr


def test_limits_apply_to_compiled_programs_and_to_the_compiler(local_box: Box) -> None:
    spin = local_box.run("c", "int main(void){ for(;;); }\n", timeout_s=1.0)
    assert not spin.compile_failed and spin.result.timed_out
    flood = local_box.run(
        "c",
        '#include <stdio.h>\nint main(void){ for(int i=0;i<200000;i++) puts("0123456789"); }\n',
        max_output_bytes=65536,
    )
    assert flood.result.stdout_truncated and len(flood.result.stdout) <= 65536
    slow_compile = local_box.run("cpp", table.BY_NAME["cpp"].sample, compile_timeout_s=0.01)
    assert slow_compile.compile_failed and slow_compile.compile.timed_out  # type: ignore[union-attr]
    # The compiler's own output is bounded too (one error line per repeated statement).
    noisy = local_box.run("c", "int main(void){" + "undefined_x = 1;" * 1500 + "}\n")
    assert noisy.compile_failed and len(noisy.compile.stderr) <= 64 * 1024  # type: ignore[union-attr]


def test_long_interpreted_code_goes_through_a_file(local_box: Box) -> None:
    code = "x = 1\n" * 40_000 + "print(x)\n"  # 240 KB: more than one argument may hold
    run = local_box.run("python", code)
    assert run.result.stdout == b"1\n" and run.compile is None


def test_polyglot_template_compiles_go_rust_and_typescript(polyglot_box: Box) -> None:
    box = polyglot_box
    assert {"c", "cpp", "go", "rust", "java", "typescript", "ruby"} <= set(box.languages)
    for name in ("go", "rust", "typescript", "ruby"):  # the others run on the host's /usr above
        run = box.run(name, table.BY_NAME[name].sample)
        assert (run.result.stdout, run.result.exit_code) == (HELLO, 0), (name, run)
    for name in ("go", "rust", "typescript"):
        code, expected = BROKEN[name]
        run = box.run(name, code)
        assert (
            run.compile_failed
            and expected in run.result.stderr.decode() + run.result.stdout.decode()
        ), (name, run)
    for name in ("go", "rust"):
        run = box.run(name, ECHO_REVERSED[name], stdin=b"sandpit\n")
        assert run.result.stdout == b"tipdnas\n", (name, run)
    panic = box.run("rust", 'fn main() { panic!("boom"); }\n')
    assert panic.result.exit_code == 101 and b"boom" in panic.result.stderr
    spin = box.run("go", "package main\n\nfunc main() {\n\tfor {\n\t}\n}\n", timeout_s=1.0)
    assert not spin.compile_failed and spin.result.timed_out


def test_docker_default_image_languages(docker_box: Box) -> None:
    assert {"python", "node", "bash"} <= set(docker_box.languages)
    for name in docker_box.languages:
        run = docker_box.run(name, table.BY_NAME[name].sample)
        assert run.result.stdout == HELLO, (name, run)


# --- the REST edges -----------------------------------------------------------------------


def url(sandbox: dict, suffix: str = "") -> str:
    return f"/api/v1/sandboxes/{sandbox['id']}{suffix}"


@pytest.mark.django_db(transaction=True)
def test_language_list_and_its_refusals(api_a, api_b, anon_api, sandbox_a):  # type: ignore[no-untyped-def]
    listed = api_a.get(url(sandbox_a, "/languages"))
    assert listed.status_code == 200, listed.content
    names = [entry["name"] for entry in listed.json()["results"]]
    assert names[:3] == ["python", "node", "bash"] and "cobol" not in names
    python = listed.json()["results"][0]
    assert python["label"] == "Python" and python["compiled"] is False and "py" in python["aliases"]
    assert_error(api_b.get(url(sandbox_a, "/languages")), 404)
    assert_error(anon_api.get(url(sandbox_a, "/languages")), 401)
    assert_error(api_a.get("/api/v1/sandboxes/sbx_nothing/languages"), 404)
    api_a.delete(url(sandbox_a))
    # Known already (probed once per environment): still answered after the sandbox stopped.
    assert api_a.get(url(sandbox_a, "/languages")).status_code == 200


@pytest.mark.django_db(transaction=True)
def test_code_endpoint_compiles_and_counts_once(api_a, sandbox_a, monkeypatch):  # type: ignore[no-untyped-def]
    import sandboxes.caller as caller_module

    counted: list[str] = []
    monkeypatch.setattr(
        caller_module, "metering_record", lambda **kw: counted.append(kw["operation"])
    )
    names = [e["name"] for e in api_a.get(url(sandbox_a, "/languages")).json()["results"]]
    if "c" not in names:
        missing_part("the local default has no C compiler on this host")
    hello = api_a.post(url(sandbox_a, "/code"), {"code": table.BY_NAME["c"].sample}, format="json")
    body = hello.json()
    assert hello.status_code == 200, body
    assert body["language"] == "c" and body["stdout"] == HELLO.decode()
    assert body["compile"]["exit_code"] == 0 and body["compile_failed"] is False
    assert counted == ["code"]  # compile, run and clean-up are one operation
    broken = api_a.post(
        url(sandbox_a, "/code"), {"code": BROKEN["c"][0], "language": "gcc"}, format="json"
    ).json()
    assert broken["compile_failed"] is True and broken["exit_code"] != 0
    assert "undefined_name" in broken["stderr"] and broken["compile"]["stderr"] == broken["stderr"]
    python = api_a.post(url(sandbox_a, "/code"), {"code": "print(1)"}, format="json").json()
    assert python["compile"] is None and python["compile_failed"] is False


@pytest.mark.django_db(transaction=True)
def test_absent_and_unknown_languages_are_clear_400s(api_a, sandbox_a):  # type: ignore[no-untyped-def]
    names = [e["name"] for e in api_a.get(url(sandbox_a, "/languages")).json()["results"]]
    absent = next(name for name in table.names() if name not in names)
    error = assert_error(
        api_a.post(url(sandbox_a, "/code"), {"code": "x", "language": absent}, format="json"),
        400,
        "language_unavailable",
    )
    assert "python" in error["message"] and absent in error["message"].lower()
    if "go" not in names:  # detected, not asked for: the same answer
        assert_error(
            api_a.post(url(sandbox_a, "/code"), {"code": BROKEN["go"][0]}, format="json"),
            400,
            "language_unavailable",
        )
    for unknown in ("cobol", "PYTHON4", "../bash"):
        assert_error(
            api_a.post(url(sandbox_a, "/code"), {"code": "x", "language": unknown}, format="json"),
            400,
            "unknown_language",
        )
    assert_error(
        api_a.post(url(sandbox_a, "/code"), {"code": "x", "compile_timeout_s": 0}, format="json"),
        400,
    )


@pytest.mark.django_db(transaction=True)
def test_run_verdicts_for_compiled_languages(api_a, local_sandboxes):  # type: ignore[no-untyped-def]
    def run(code: str, language: str, **limits: float) -> dict:
        body = {"code": code, "language": language, "stdin": "sandpit\n", "limits": limits}
        response = api_a.post("/api/v1/run", body, format="json")
        assert response.status_code == 200, response.content
        return response.json()

    if not {"gcc", "javac"} <= local_box_binaries():
        missing_part("the local default needs gcc and javac on this host for these verdicts")
    ok = run(ECHO_REVERSED["c"], "c")
    assert (ok["verdict"], ok["stdout"], ok["compile"]["exit_code"]) == ("ok", "tipdnas\n", 0)
    for language in ("c", "java"):
        broken = run(BROKEN[language][0], language)
        assert broken["verdict"] == "compile_error", broken
        assert BROKEN[language][1] in broken["stderr"] + broken["stdout"]
    java = run(ECHO_REVERSED["java"], "java")
    assert (java["verdict"], java["stdout"]) == ("ok", "tipdnas\n"), java
    crash = run("int main(void){ return 3; }\n", "c")
    assert (crash["verdict"], crash["exit_code"]) == ("runtime_error", 3)
    flood = run(
        '#include <stdio.h>\nint main(void){ for(int i=0;i<200000;i++) puts("0123456789"); }\n',
        "c",
    )
    assert flood["verdict"] == "output_limit" and flood["truncated"] is True
    spin = run("int main(void){ for(;;); }\n", "c", timeout_s=1)
    assert spin["verdict"] == "timeout" and spin["compile"]["timed_out"] is False
    compile_limit = run(table.BY_NAME["cpp"].sample, "cpp", compile_timeout_s=0.01)
    assert compile_limit["verdict"] == "compile_error" and compile_limit["compile"]["timed_out"]
    assert_error(
        api_a.post(
            "/api/v1/run",
            {"code": "x", "limits": {"compile_timeout_s": 61}},
            format="json",
        ),
        400,
    )


def local_box_binaries() -> frozenset[str]:
    """What the host's /usr (the local default jail) holds of the table."""
    has = table.rootfs_has_binary("/")
    return frozenset(b for b in table.ALL_BINARIES if b != table.NODE_22 and has(b))


@pytest.mark.django_db(transaction=True)
def test_a_template_sandbox_offers_its_templates_languages(api_a, local_sandboxes):  # type: ignore[no-untyped-def]
    from sandboxes.templates import templates_builtin_build

    template = templates_builtin_build(["polyglot"])[0]  # cached: seconds when built
    if not template.rootfs:
        missing_part(f"the polyglot template is not built: {template.error_message}")
    created = api_a.post("/api/v1/sandboxes", {"template": "polyglot"}, format="json")
    assert created.status_code == 201, created.content
    sandbox = created.json()
    listed = api_a.get(url(sandbox, "/languages")).json()["results"]
    assert [entry["name"] for entry in listed] == template.languages
    assert {"go", "rust", "typescript"} <= set(template.languages)
    rust = api_a.post(
        url(sandbox, "/code"),
        {"code": table.BY_NAME["rust"].sample, "language": "rs"},
        format="json",
    ).json()
    assert (rust["language"], rust["stdout"], rust["compile_failed"]) == (
        "rust",
        "Hello, world!\n",
        False,
    )
