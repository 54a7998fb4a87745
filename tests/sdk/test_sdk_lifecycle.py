"""Sandbox lifecycle and errors through the sync SDK, against a live server."""

from __future__ import annotations

import pytest
from sandpit import (
    AuthError,
    InvalidRequestError,
    NotFoundError,
    Sandbox,
    SandboxInfo,
    Sandpit,
)

pytestmark = pytest.mark.django_db(transaction=True)


def test_create_info_stats_timeout_list_and_kill(client, provider):  # type: ignore[no-untyped-def]
    sandbox = client.create(
        provider=provider,
        timeout_s=120,
        env={"GREETING": "hello"},
        metadata={"owner": "sdk-test", "provider": provider},
        resources={"memory_mb": 256},
    )
    try:
        info = sandbox.info()
        assert isinstance(info, SandboxInfo)
        assert (info.state, info.provider, info.timeout_s) == ("running", provider, 120)
        assert info.metadata["owner"] == "sdk-test"
        assert info.resources["memory_mb"] == 256
        assert sandbox.commands.run("echo $GREETING").stdout == "hello\n"
        stats = sandbox.stats()
        assert stats.memory_bytes >= 0 and stats.uptime_s >= 0
        assert sandbox.set_timeout(600).timeout_s == 600
        listed = Sandbox.list(metadata={"owner": "sdk-test", "provider": provider})
        assert [s.id for s in listed] == [sandbox.id]
        assert Sandbox.list(metadata={"owner": "nobody"}) == []
        assert sandbox.id in {s.id for s in client.list(state="running")}
        same = Sandbox.connect(sandbox.id)
        assert same.info().id == sandbox.id
        same.close()
    finally:
        assert sandbox.kill() is True
    assert sandbox.kill() is False
    assert sandbox.info().state == "destroyed"


def test_context_manager_destroys_on_exit(sdk_env):  # type: ignore[no-untyped-def]
    with Sandbox.create(provider="local") as sandbox:
        assert sandbox.commands.run("true").exit_code == 0
    with Sandpit() as client:
        assert client.sandbox_info(sandbox.id).state == "destroyed"


def test_errors_carry_code_message_and_status(client, server):  # type: ignore[no-untyped-def]
    with pytest.raises(NotFoundError) as missing:
        client.connect("sbx_doesnotexist")
    assert (missing.value.code, missing.value.status) == ("sandbox_not_found", 404)
    with pytest.raises(InvalidRequestError) as invalid:
        client.create(provider="local", timeout_s=1)
    assert invalid.value.status == 400 and invalid.value.code == "validation_error"
    with pytest.raises(AuthError) as unauthenticated:
        Sandpit(api_key="sp_0000000000000000wrong", url=server.http).list()
    assert unauthenticated.value.status == 401


def test_other_organizations_sandbox_is_not_found(server, key_a, key_b):  # type: ignore[no-untyped-def]
    with Sandpit(api_key=key_a, url=server.http) as alice, Sandpit(key_b, server.http) as charlie:
        sandbox = alice.create(provider="local")
        try:
            with pytest.raises(NotFoundError):
                charlie.connect(sandbox.id)
            assert Sandbox(charlie, sandbox.info()).kill() is False
            assert sandbox.info().state == "running"
        finally:
            sandbox.kill()


def test_missing_key_is_a_clear_error(monkeypatch, tmp_path):  # type: ignore[no-untyped-def]
    monkeypatch.delenv("SANDPIT_API_KEY", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    with pytest.raises(AuthError, match="SANDPIT_API_KEY"):
        Sandpit()


def test_readme_quickstart_runs(sdk_env, capsys):  # type: ignore[no-untyped-def]
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = re.search(r"\*\*The same with the Python SDK\*\*.*?```python\n(.*?)```", readme, re.S)
    assert block, "the README's SDK quickstart is missing"
    exec(compile(block.group(1), "README.md", "exec"), {})  # noqa: S102 - our own README
    out = capsys.readouterr().out
    assert out.splitlines() == ["hello from Linux", "", 'print("hi")', "hi", "42", ""]
