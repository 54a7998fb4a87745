"""API details a client SDK needs: an existence check, background commands with their
output, binary-safe output, one meaning of timeout_s, network permission, paths outside
the workspace. Real local provider, real Postgres."""

from __future__ import annotations

import base64

import pytest

from tests.conftest import assert_error

pytestmark = pytest.mark.django_db(transaction=True)


def url(sandbox: dict, suffix: str = "") -> str:
    return f"/api/v1/sandboxes/{sandbox['id']}{suffix}"


# --- exists -------------------------------------------------------------------------------


def test_exists_answers_true_and_false_without_an_error(api_a, sandbox_a):
    api_a.put(
        url(sandbox_a, "/files/content?path=here.txt"),
        b"x",
        content_type="application/octet-stream",
    )
    api_a.post(url(sandbox_a, "/commands"), {"command": "ln -s nowhere dangling"}, format="json")
    for path, expected in (("here.txt", True), (".", True), ("dangling", True), ("gone", False)):
        response = api_a.get(url(sandbox_a, "/files/exists"), {"path": path})
        assert response.status_code == 200, response.content
        assert response.json() == {"exists": expected}, path


def test_exists_refuses_paths_leaving_the_sandbox(api_a, sandbox_a):
    assert_error(
        api_a.get(url(sandbox_a, "/files/exists"), {"path": "../../etc/passwd"}),
        400,
        "path_not_allowed",
    )


def test_exists_other_org_and_anonymous(api_b, anon_api, sandbox_a):
    assert_error(api_b.get(url(sandbox_a, "/files/exists"), {"path": "x"}), 404)
    assert_error(anon_api.get(url(sandbox_a, "/files/exists"), {"path": "x"}), 401)


# --- binary-safe output ----------------------------------------------------------------------


def test_command_output_base64_is_the_exact_bytes(api_a, sandbox_a):
    # Every byte value on stdout, invalid UTF-8 on stderr: text would replace them.
    body = {
        "command": "printf '\\377\\000\\201ok'; printf '\\376' >&2",
        "encoding": "base64",
    }
    response = api_a.post(url(sandbox_a, "/commands"), body, format="json")
    assert response.status_code == 200, response.content
    data = response.json()
    assert data["encoding"] == "base64"
    assert base64.b64decode(data["stdout"]) == b"\xff\x00\x81ok"
    assert base64.b64decode(data["stderr"]) == b"\xfe"


def test_command_output_stays_text_by_default(api_a, sandbox_a):
    data = api_a.post(
        url(sandbox_a, "/commands"), {"command": "printf 'h\\351'"}, format="json"
    ).json()
    assert (data["stdout"], data["encoding"]) == ("h\ufffd", "utf-8")


def test_code_output_base64(api_a, sandbox_a):
    code = "import sys; sys.stdout.buffer.write(bytes([0, 255, 10]))"
    data = api_a.post(
        url(sandbox_a, "/code"),
        {"code": code, "language": "python", "encoding": "base64"},
        format="json",
    ).json()
    assert base64.b64decode(data["stdout"]) == b"\x00\xff\n" and data["language"] == "python"


def test_unknown_encoding_is_400(api_a, sandbox_a):
    for suffix, body in (("/commands", {"command": "true"}), ("/code", {"code": "1"})):
        response = api_a.post(
            url(sandbox_a, suffix), {**body, "encoding": "latin-1"}, format="json"
        )
        assert_error(response, 400, "validation_error")


# --- background commands -------------------------------------------------------------------


def _output(api, sandbox: dict, pid: int, **params) -> dict:  # type: ignore[no-untyped-def]
    response = api.get(url(sandbox, f"/processes/{pid}/output"), params)
    assert response.status_code == 200, response.content
    return response.json()


def test_background_command_answers_at_once_and_keeps_its_output(api_a, sandbox_a):
    # The command waits for a file the test writes after the answer: a foreground run
    # would never answer.
    script = "echo started; echo warn >&2; while [ ! -e go ]; do sleep 0.05; done; echo done"
    started = api_a.post(
        url(sandbox_a, "/commands"), {"command": script, "background": True}, format="json"
    )
    assert started.status_code == 202, started.content
    info = started.json()
    assert info["background"] is True and info["running"] is True
    assert info["command"] == script
    pid = info["pid"]
    listed = api_a.get(url(sandbox_a, "/processes")).json()["results"]
    assert script in [p["command"] for p in listed if p["pid"] == pid]

    first = _output(api_a, sandbox_a, pid)
    while "started" not in first["stdout"] or "warn" not in first["stderr"]:
        first = _output(api_a, sandbox_a, pid)
    assert first["running"] is True
    api_a.put(
        url(sandbox_a, "/files/content?path=go"), b"", content_type="application/octet-stream"
    )
    rest = _output(
        api_a,
        sandbox_a,
        pid,
        stdout_offset=first["stdout_offset"],
        stderr_offset=first["stderr_offset"],
    )
    while rest["running"]:
        rest = _output(
            api_a,
            sandbox_a,
            pid,
            stdout_offset=first["stdout_offset"],
            stderr_offset=first["stderr_offset"],
        )
    assert (rest["stdout"], rest["stderr"], rest["exit_code"]) == ("done\n", "", 0)


def test_background_command_with_args_and_binary_output(api_a, sandbox_a):
    body = {"command": "printf", "args": ["\\377%s", "x y"], "background": True}
    info = api_a.post(url(sandbox_a, "/commands"), body, format="json").json()
    assert info["command"] == "printf '\\377%s' 'x y'"
    out = _output(api_a, sandbox_a, info["pid"], encoding="base64")
    while out["running"]:
        out = _output(api_a, sandbox_a, info["pid"], encoding="base64")
    assert base64.b64decode(out["stdout"]) == b"\xffx y" and out["exit_code"] == 0


def test_background_can_be_killed(api_a, sandbox_a):
    info = api_a.post(
        url(sandbox_a, "/commands"), {"command": "sleep 300", "background": True}, format="json"
    ).json()
    killed = api_a.post(
        url(sandbox_a, f"/processes/{info['pid']}/signal"), {"signal": "SIGKILL"}, format="json"
    )
    assert killed.status_code == 200
    out = _output(api_a, sandbox_a, info["pid"])
    while out["running"]:
        out = _output(api_a, sandbox_a, info["pid"])
    assert out["exit_code"] == -9


def test_background_refuses_stdin_and_timeout(api_a, sandbox_a):
    for extra in ({"stdin": "x"}, {"timeout_s": 5}):
        body = {"command": "cat", "background": True, **extra}
        error = assert_error(
            api_a.post(url(sandbox_a, "/commands"), body, format="json"), 400, "validation_error"
        )
        assert "background" in error["message"]


def test_output_of_a_process_without_a_log_is_404(api_a, sandbox_a):
    started = api_a.post(url(sandbox_a, "/processes"), {"command": "sleep 300"}, format="json")
    assert_error(
        api_a.get(url(sandbox_a, f"/processes/{started.json()['pid']}/output")),
        404,
        "process_not_found",
    )


def test_output_other_org_and_anonymous(api_b, anon_api, sandbox_a):
    assert_error(api_b.get(url(sandbox_a, "/processes/2/output")), 404)
    assert_error(anon_api.get(url(sandbox_a, "/processes/2/output")), 401)
    assert_error(
        api_b.post(
            url(sandbox_a, "/commands"), {"command": "true", "background": True}, format="json"
        ),
        404,
    )
