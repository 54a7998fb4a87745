"""The unmodified e2b SDK (sync) against a live Sandpit, on the local and docker providers."""

from __future__ import annotations

import threading
import time
from collections import Counter

import httpx
import pytest

from .conftest import usage

pytestmark = pytest.mark.django_db(transaction=True)

PROVIDERS = ["local", pytest.param("docker", marks=pytest.mark.docker)]


def _template(provider: str) -> str:
    if provider == "docker":
        from django.conf import settings

        from tests.docker_support import docker_provider_or_skip
        from tests.requirements import missing_part

        if "docker" not in settings.SANDPIT_PROVIDERS:
            missing_part("SANDPIT_PROVIDERS does not enable docker")
        docker_provider_or_skip()
    return provider


def _wait_for(predicate, what: str, timeout: float = 15.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _waiting(wait, ended: list[BaseException]):  # type: ignore[no-untyped-def]
    """A reader thread's target: `wait()`, keeping how it ended for the test to check."""

    def target() -> None:
        try:
            wait()
        except Exception as exc:  # noqa: BLE001 - checked by the test, not lost in a thread
            ended.append(exc)

    return target


def _killed(ended: list[BaseException]) -> bool:
    """The SDK's handle ended as E2B's does for a killed command: CommandExitException with
    exit code -1."""
    return (
        len(ended) == 1
        and type(ended[0]).__name__ == "CommandExitException"
        and getattr(ended[0], "exit_code", None) == -1
    )


@pytest.mark.parametrize("provider", PROVIDERS)
def test_every_call_of_the_sync_sdk(e2b_env, org_a, provider):  # type: ignore[no-untyped-def]
    from e2b import Sandbox
    from e2b.exceptions import NotFoundException
    from e2b.sandbox.commands.command_handle import CommandExitException, PtySize

    before = usage(org_a)
    sbx = Sandbox.create(
        template=_template(provider),
        timeout=120,
        metadata={"suite": "e2b"},
        envs={"GREETING": "hi"},
    )
    try:
        # lifecycle
        assert sbx.is_running()
        assert sbx.sandbox_id in [s.sandbox_id for s in Sandbox.list().next_items()]
        info = sbx.get_info()
        assert info.metadata == {"suite": "e2b"} and info.state.value == "running"
        sbx.set_timeout(300)
        same = Sandbox.connect(sbx.sandbox_id)
        assert same.commands.run("echo again").stdout == "again\n"

        # commands: streaming output, envs, cwd, exit codes
        out: list[str] = []
        err: list[str] = []
        result = sbx.commands.run(
            "echo $GREETING $EXTRA; pwd; echo oops >&2",
            envs={"EXTRA": "there"},
            cwd="/home/user",
            on_stdout=out.append,
            on_stderr=err.append,
        )
        assert result.stdout == "hi there\n/workspace\n" and "".join(out) == result.stdout
        assert result.stderr == "oops\n" and "".join(err) == "oops\n"
        with pytest.raises(CommandExitException) as failed:
            sbx.commands.run("exit 3")
        assert failed.value.exit_code == 3

        # background command, stdin, list, connect, kill
        handle = sbx.commands.run("cat", background=True, stdin=True)
        assert handle.pid in [p.pid for p in sbx.commands.list()]
        # connect() returns once the server listens: output from then on reaches it.
        attached = sbx.commands.connect(handle.pid)
        seen: list[str] = []
        ended: list[BaseException] = []
        reader = threading.Thread(
            target=_waiting(lambda: attached.wait(on_stdout=seen.append), ended), daemon=True
        )
        reader.start()
        sbx.commands.send_stdin(handle.pid, "line one\n")
        _wait_for(lambda: "line one\n" in "".join(seen) or None, "the echoed stdin", 15)
        assert sbx.commands.kill(handle.pid) is True
        reader.join(10)
        assert _killed(ended)
        assert handle.pid not in [p.pid for p in sbx.commands.list()]
        assert sbx.commands.kill(handle.pid) is False

        # PTY
        data = bytearray()
        pty = sbx.pty.create(PtySize(rows=24, cols=80))
        pty_ended: list[BaseException] = []
        pty_reader = threading.Thread(
            target=_waiting(lambda: pty.wait(on_pty=data.extend), pty_ended), daemon=True
        )
        pty_reader.start()
        sbx.pty.resize(pty.pid, PtySize(rows=33, cols=111))
        sbx.pty.send_stdin(pty.pid, b"stty size; echo pty-$((6*7))\n")
        try:
            _wait_for(lambda: b"pty-42" in data, "PTY output")
        except AssertionError as timed_out:  # once in a full run under load: say what came
            raise AssertionError(
                f"{timed_out}: got {bytes(data)!r}, reader alive: {pty_reader.is_alive()}"
            ) from None
        assert b"33 111" in data
        assert sbx.pty.kill(pty.pid) is True
        pty_reader.join(10)
        assert _killed(pty_ended)

        # files
        sbx.files.write("/home/user/dir/a.txt", "hello")
        assert sbx.files.read("/home/user/dir/a.txt") == "hello"
        assert sbx.files.read("dir/a.txt", format="bytes") == b"hello"
        assert sbx.files.exists("dir/a.txt") and not sbx.files.exists("nope.txt")
        assert sbx.files.get_info("dir/a.txt").size == 5
        assert [e.name for e in sbx.files.list("/home/user/dir")] == ["a.txt"]
        assert sbx.files.make_dir("made") is True
        assert sbx.files.make_dir("made") is False
        moved = sbx.files.rename("dir/a.txt", "made/b.txt")
        assert moved.path == "/workspace/made/b.txt"
        sbx.files.remove("made/b.txt")
        with pytest.raises(NotFoundException):
            sbx.files.read("made/b.txt")
        assert (
            sbx.commands.run("cat /workspace/made/b.txt 2>/dev/null || echo gone").stdout
            == "gone\n"
        )

        # file watch (the sync SDK polls)
        watcher = sbx.files.watch_dir("/home/user/made")
        sbx.files.write("made/new.txt", "x")
        names = _wait_for(
            lambda: {e.name for e in watcher.get_new_events()} & {"new.txt"}, "a watch event"
        )
        assert names == {"new.txt"}
        watcher.stop()

        # get_host: an HTTP server in the sandbox, through the preview proxy by host name
        sbx.files.write("site/index.html", "served from the sandbox")
        server = sbx.commands.run(
            "cd /workspace/site && exec python3 -m http.server 8000", background=True
        )
        host = sbx.get_host(8000)
        assert host == f"8000-{sbx.sandbox_id}.e2b.sandpit.test"

        def fetch():  # type: ignore[no-untyped-def]
            response = httpx.get(
                f"{e2b_env.http}/index.html",
                headers={"Host": host, "Authorization": f"Bearer {sbx.connection_config.api_key}"},
            )
            return response if response.status_code == 200 else None

        page = _wait_for(fetch, "the sandbox's web server", 20)
        assert page.text == "served from the sandbox"
        server.kill()
    finally:
        assert sbx.kill() is True
    assert not sbx.is_running()
    assert sbx.kill() is False

    counted = usage(org_a) - before
    expected = Counter(
        {
            "sandbox.create": 1,
            "sandbox.timeout": 1,
            "token.mint": 1,  # connect
            "exec.command": 6,  # again, the env run, exit 3, cat, the cat check, the server
            "exec.stdin": 1,
            "process.signal": 2,  # kill cat, kill the server
            "terminal.create": 1,
            "terminal.resize": 1,
            "terminal.line": 1,  # one Enter typed in the PTY
            "terminal.kill": 1,
            "files.write": 3,
            # What failed counts nothing: exists() on a missing file, the read of the
            # removed file, make_dir on an existing directory.
            "files.read": 2,
            "files.stat": 2,  # exists(), get_info()
            "files.list": 1,
            "files.mkdir": 1,
            "files.move": 1,
            "files.remove": 1,
            "watch.create": 1,
            "ports.request": counted["ports.request"] or 1,
            "sandbox.destroy": 1,
        }
    )
    assert counted == expected


def test_other_organizations_sandbox_is_not_found(e2b_env, org_a, key_b, monkeypatch):  # type: ignore[no-untyped-def]
    from e2b import Sandbox
    from e2b.exceptions import NotFoundException, SandboxNotFoundException

    mine = Sandbox.create()
    try:
        monkeypatch.setenv("E2B_API_KEY", key_b)
        with pytest.raises(SandboxNotFoundException):
            Sandbox.connect(mine.sandbox_id)
        with pytest.raises(SandboxNotFoundException):
            Sandbox.get_info(mine.sandbox_id)
        assert Sandbox.kill(mine.sandbox_id) is False
        assert mine.sandbox_id not in [s.sandbox_id for s in Sandbox.list().next_items()]
        # Their envd token for my sandbox id: the same 404 as Sandpit's own API.
        theirs = Sandbox.create()
        try:
            theirs.connection_config.sandbox_headers  # noqa: B018
            forged = Sandbox(
                sandbox_id=mine.sandbox_id,
                sandbox_domain=None,
                envd_version=theirs._envd_version,
                envd_access_token=theirs._envd_access_token,
                traffic_access_token=None,
                connection_config=type(theirs.connection_config)(
                    extra_sandbox_headers={
                        "E2b-Sandbox-Id": mine.sandbox_id,
                        "X-Access-Token": theirs._envd_access_token,
                    }
                ),
            )
            with pytest.raises(NotFoundException):
                forged.files.read("anything")
            with pytest.raises(NotFoundException):
                forged.commands.list()
        finally:
            theirs.kill()
    finally:
        monkeypatch.undo()
        mine.kill()


def test_what_sandpit_lacks_answers_not_supported(e2b_env, org_a):  # type: ignore[no-untyped-def]
    from e2b import Sandbox
    from e2b.exceptions import SandboxException

    with pytest.raises(SandboxException, match="404.*template"):
        Sandbox.create(template="my-custom-template")
    sbx = Sandbox.create(template="base")
    try:
        with pytest.raises(SandboxException, match="501.*not supported"):
            sbx.get_metrics()
    finally:
        sbx.kill()


def test_pause_then_connect_resumes(e2b_env, org_a):  # type: ignore[no-untyped-def]
    from e2b import Sandbox, SandboxQuery, SandboxState

    sbx = Sandbox.create(template="base")
    try:
        sbx.files.write("/home/user/kept.txt", "kept")
        assert sbx.pause() is True
        assert sbx.pause() is False  # already paused: E2B's 409
        assert Sandbox.get_info(sbx.sandbox_id).state.value == "paused"
        listed = Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED])).next_items()
        assert [s.sandbox_id for s in listed] == [sbx.sandbox_id]
        again = Sandbox.connect(sbx.sandbox_id)  # resumes it
        assert Sandbox.get_info(sbx.sandbox_id).state.value == "running"
        assert again.files.read("/home/user/kept.txt") == "kept"
    finally:
        sbx.kill()


def test_a_wrong_key_is_refused(e2b_env, monkeypatch):  # type: ignore[no-untyped-def]
    from e2b import Sandbox
    from e2b.exceptions import AuthenticationException

    monkeypatch.setenv("E2B_API_KEY", "sp_not_a_key")
    with pytest.raises(AuthenticationException):
        Sandbox.create()
