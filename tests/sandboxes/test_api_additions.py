"""API details a client SDK needs: an existence check, background commands with their
output, binary-safe output, one meaning of timeout_s, network permission, paths outside
the workspace. Real local provider, real Postgres."""

from __future__ import annotations

import base64
import shutil
from datetime import UTC, datetime, timedelta

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from accounts.models import Membership, Role
from sandboxes.models import Sandbox
from sandboxes.providers.base import Capability
from tests.cloud.conftest import e2b_provider, fake_e2b_cloud  # noqa: F401, F811 - fixtures
from tests.conftest import assert_error
from tests.requirements import missing_part

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


# --- timeout_s: an idle timeout on every provider, and a separate lifetime -----------------


@pytest.fixture
def cloud_fakes(settings, fake_e2b_cloud, e2b_provider, tmp_path):  # type: ignore[no-untyped-def]  # noqa: F811
    """The e2b adapter on its fake SDK and the shell layer on its local stand-in, enabled
    as providers "e2b" and "local-shell"."""
    from sandboxes import providers
    from tests.cloud.local_shell import LocalShellProvider

    if shutil.which("unshare") is None:
        missing_part("the shell stand-in needs unshare (util-linux)")
    settings.SANDPIT_PROVIDERS = ["e2b", "local-shell"]
    providers.reset_providers()
    shell = LocalShellProvider(tmp_path)
    providers._instances.update({"e2b": e2b_provider, "local-shell": shell})
    yield {"e2b": e2b_provider, "local-shell": shell}
    for sandbox in Sandbox.objects.filter(provider__in=["e2b", "local-shell"]).exclude(
        provider_id=""
    ):
        providers._instances[sandbox.provider].destroy(sandbox.provider_id)
    # Not closed by reset_providers: the e2b adapter is the session's.
    providers._instances.pop("e2b", None)
    providers._instances.pop("local-shell", None)
    providers.reset_providers()


def _lifetime_left_s(name: str, fakes: dict, cloud, provider_id: str) -> float:  # type: ignore[no-untyped-def]
    """How long the provider itself would let the sandbox live, from now."""
    if name == "e2b":
        return (cloud.sandboxes[provider_id].end_at - datetime.now(UTC)).total_seconds()
    return float(fakes[name].specs[provider_id].lifetime_s)


@pytest.mark.parametrize("name", ["e2b", "local-shell"])
def test_cloud_timeout_is_idle_and_the_provider_timer_is_the_lifetime(  # type: ignore[no-untyped-def]
    name,
    api_a,
    cloud_fakes,
    fake_e2b_cloud,  # noqa: F811
):
    lifetime_s = settings.SANDPIT_MAX_LIFETIME_S
    created = api_a.post("/api/v1/sandboxes", {"provider": name, "timeout_s": 60}, format="json")
    assert created.status_code == 201, created.content
    sandbox = Sandbox.objects.get(pk=created.json()["id"])
    assert sandbox.timeout_s == 60
    # The provider's own kill timer is the lifetime, not the 60 s idle timeout.
    assert (
        _lifetime_left_s(name, cloud_fakes, fake_e2b_cloud, sandbox.provider_id) > lifetime_s - 60
    )

    # A keep-alive changes the idle timeout only; the provider's timer is renewed to the
    # sandbox's end of life.
    assert (
        api_a.post(url(created.json(), "/timeout"), {"timeout_s": 30}, format="json").status_code
        == 200
    )
    sandbox.refresh_from_db()
    if name == "e2b":
        end_at = fake_e2b_cloud.sandboxes[sandbox.provider_id].end_at
        assert abs((end_at - sandbox.expires_at).total_seconds()) < 5

    # The reaper owns the idle timeout: kept while active, reaped once idle past it.
    from sandboxes.operations import reap_sandboxes

    active = sandbox.last_activity_at + timedelta(seconds=20)
    assert sandbox.id not in reap_sandboxes(now=active, sweep_leftovers=False).reaped_idle
    idle = sandbox.last_activity_at + timedelta(seconds=31)
    assert reap_sandboxes(now=idle, sweep_leftovers=False).reaped_idle == [sandbox.id]
    sandbox.refresh_from_db()
    assert (sandbox.state, sandbox.destroy_reason) == ("destroyed", "idle")


# --- network permission -------------------------------------------------------------------


def _session(user) -> APIClient:  # type: ignore[no-untyped-def]
    client = APIClient()
    client.force_login(user)
    return client


def test_owner_allows_network_and_a_networked_create_passes_the_policy(
    api_a, alice, org_a, local_sandboxes, monkeypatch
):
    refused = assert_error(
        api_a.post("/api/v1/sandboxes", {"network": True}, format="json"),
        403,
        "network_not_allowed",
    )
    assert "Team page" in refused["message"] and "allow_network" in refused["message"]

    owner = _session(alice)
    changed = owner.patch("/api/v1/organization", {"allow_network": True}, format="json")
    assert changed.status_code == 200, changed.content
    assert changed.json()["allow_network"] is True
    org_a.refresh_from_db()
    assert org_a.allow_network is True
    assert api_a.get("/api/v1/organization").json()["allow_network"] is True

    # Allowed by the organization, but a provider without the capability says so.
    monkeypatch.setattr(
        local_sandboxes, "capabilities", frozenset(Capability) - {Capability.NETWORK}
    )
    lacking = assert_error(
        api_a.post("/api/v1/sandboxes", {"network": True}, format="json"), 501, "not_supported"
    )
    assert "GET /api/v1/providers" in lacking["message"]

    assert owner.patch("/api/v1/organization", {"allow_network": False}, format="json").json() == {
        **changed.json(),
        "allow_network": False,
    }


def test_only_owners_change_the_network_setting(api_a, anon_api, alice, bob, org_a, charlie, org_b):
    Membership.objects.filter(user=bob, organization=org_a).update(role=Role.ADMIN)
    body = {"allow_network": True}
    assert_error(
        _session(bob).patch("/api/v1/organization", body, format="json"), 403, "role_required"
    )
    assert_error(api_a.patch("/api/v1/organization", body, format="json"), 403)
    assert_error(anon_api.patch("/api/v1/organization", body, format="json"), 401)
    # Charlie owns another organization: his change lands there, never on org A.
    assert _session(charlie).patch("/api/v1/organization", body, format="json").status_code == 200
    org_a.refresh_from_db()
    org_b.refresh_from_db()
    assert (org_a.allow_network, org_b.allow_network) == (False, True)
    for bad in ({"allow_network": "yes"}, {"allow_network": 1}, {}):
        assert_error(_session(alice).patch("/api/v1/organization", bad, format="json"), 400)


def test_team_page_offers_owners_the_network_switch(client, alice, bob, org_a):  # type: ignore[no-untyped-def]
    client.force_login(alice)
    page = client.get("/team/").content.decode()
    assert 'id="network-toggle"' in page
    client.force_login(bob)
    page = client.get("/team/").content.decode()
    assert 'id="network-toggle"' not in page and "Ask an owner" in page


# --- paths: /workspace and /tmp ---------------------------------------------------------------


def _put(api, sandbox: dict, path: str, data: bytes):  # type: ignore[no-untyped-def]
    return api.put(
        url(sandbox, f"/files/content?path={path}"), data, content_type="application/octet-stream"
    )


def _run(api, sandbox: dict, command: str) -> dict:  # type: ignore[no-untyped-def]
    response = api.post(url(sandbox, "/commands"), {"command": command}, format="json")
    assert response.status_code == 200, response.content
    return response.json()


def test_files_in_tmp_work_through_the_file_api(api_a, sandbox_a):
    written = _put(api_a, sandbox_a, "/tmp/hello.py", b"print('hi from tmp')")
    assert written.status_code == 201, written.content
    assert written.json()["path"] == "/tmp/hello.py"
    assert _run(api_a, sandbox_a, "python3 /tmp/hello.py")["stdout"] == "hi from tmp\n"
    _run(api_a, sandbox_a, "echo made-inside > /tmp/inside.txt")
    read = api_a.get(url(sandbox_a, "/files/content"), {"path": "/tmp/inside.txt"})
    assert read.content == b"made-inside\n"
    listed = api_a.get(url(sandbox_a, "/files"), {"path": "/tmp"}).json()["entries"]
    assert {"/tmp/hello.py", "/tmp/inside.txt"} <= {e["path"] for e in listed}
    assert api_a.get(url(sandbox_a, "/files/stat"), {"path": "/tmp"}).json()["type"] == "dir"
    moved = api_a.post(
        url(sandbox_a, "/files/move"), {"from": "/tmp/hello.py", "to": "back.py"}, format="json"
    )
    assert moved.status_code == 200, moved.content
    assert moved.json()["path"] == "back.py"
    assert api_a.get(url(sandbox_a, "/files/exists"), {"path": "/tmp/hello.py"}).json() == {
        "exists": False
    }
    assert api_a.delete(url(sandbox_a, "/files?path=/tmp/inside.txt")).status_code == 204
    assert_error(api_a.delete(url(sandbox_a, "/files?path=/tmp")), 400, "path_not_allowed")


def test_links_resolve_as_the_jail_sees_them(api_a, sandbox_a, tmp_path_factory):
    # A host file at the same /tmp path the link names: the link must reach the sandbox's
    # /tmp, never the host's.
    host_dir = tmp_path_factory.getbasetemp()
    host_file = host_dir / "host-secret.txt"
    host_file.write_text("host secret")
    _run(
        api_a,
        sandbox_a,
        f"echo sandbox-tmp > /tmp/t.txt; ln -s /tmp/t.txt abs; ln -s ../tmp/t.txt rel; "
        f"ln -s {host_file} host; ln -s /etc/passwd etc; ln -s /workspace/abs /tmp/back",
    )
    for link in ("abs", "rel", "/tmp/back"):
        read = api_a.get(url(sandbox_a, "/files/content"), {"path": link})
        assert read.content == b"sandbox-tmp\n", link
    # Writing through a link lands in the sandbox's /tmp.
    assert _put(api_a, sandbox_a, "rel", b"via link").status_code == 201
    assert _run(api_a, sandbox_a, "cat /tmp/t.txt")["stdout"] == "via link"
    # The host path a link names is looked up in the sandbox's own /tmp only.
    if str(host_file).startswith("/tmp/"):
        assert_error(
            api_a.get(url(sandbox_a, "/files/content"), {"path": "host"}), 404, "file_not_found"
        )
    else:
        assert_error(
            api_a.get(url(sandbox_a, "/files/content"), {"path": "host"}), 400, "path_not_allowed"
        )
    assert host_file.read_text() == "host secret"
    for path in ("etc", "/etc/passwd", "/tmp/../etc/passwd", "/", "..", "../..", "/proc/1/root"):
        assert_error(
            api_a.get(url(sandbox_a, "/files/content"), {"path": path}), 400, "path_not_allowed"
        )


def test_a_link_to_the_root_reaches_tmp_but_nothing_else(api_a, sandbox_a):
    _run(api_a, sandbox_a, "echo in-tmp > /tmp/x.txt; ln -s / top")
    assert api_a.get(url(sandbox_a, "/files/content"), {"path": "top/tmp/x.txt"}).content == (
        b"in-tmp\n"
    )
    assert_error(
        api_a.get(url(sandbox_a, "/files/content"), {"path": "top/etc/passwd"}),
        400,
        "path_not_allowed",
    )
