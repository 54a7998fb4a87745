"""The unmodified e2b SDK (sync) on Sandpit's local provider."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db(transaction=True)


def test_smoke(e2b_env, org_a):  # type: ignore[no-untyped-def]
    from e2b import Sandbox

    sbx = Sandbox.create(metadata={"who": "smoke"}, envs={"GREETING": "hi"})
    try:
        assert sbx.is_running()
        result = sbx.commands.run("echo $GREETING; echo err >&2")
        assert result.stdout == "hi\n", result
        assert result.stderr == "err\n"
        sbx.files.write("/home/user/a.txt", "hello")
        assert sbx.files.read("a.txt") == "hello"
        assert [e.name for e in sbx.files.list("/home/user")] == ["a.txt"]
    finally:
        sbx.kill()
    assert not sbx.is_running()
