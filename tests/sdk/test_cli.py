"""The `sandpit` command end to end: a subprocess against the live server, and `shell`
through a real PTY (pexpect)."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.requirements import require_module

from .conftest import cli_env

pytestmark = pytest.mark.django_db(transaction=True)

SANDPIT = shutil.which("sandpit", path=str(Path(sys.executable).parent)) or "sandpit"


def sandpit(
    env: dict[str, str], *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SANDPIT, *args],
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_login_stores_url_and_key_privately_and_env_overrides(sdk_env, server):  # type: ignore[no-untyped-def]
    env = cli_env(sdk_env)
    key = env.pop("SANDPIT_API_KEY")
    url = env.pop("SANDPIT_URL")
    bad = sandpit(env, "--url", url, "login", stdin="sp_0000000000000000wrong\n")
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert bad.stderr.startswith("sandpit: ") and bad.stderr.count("\n") == 1
    done = sandpit(env, "--url", url, "login", stdin=key + "\n")
    assert done.returncode == 0, done.stderr
    path = Path(env["XDG_CONFIG_HOME"]) / "sandpit" / "config.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text()) == {"url": url, "api_key": key}
    # The stored login is used, and an environment variable beats it.
    assert sandpit(env, "sandbox", "list", "--json").returncode == 0
    wrong = sandpit({**env, "SANDPIT_API_KEY": "sp_0000000000000000wrong"}, "sandbox", "list")
    assert wrong.returncode == 1 and "authentication_failed" in wrong.stderr


def test_sandbox_commands_exec_ps_and_cp(sdk_env, tmp_path):  # type: ignore[no-untyped-def]
    env = cli_env(sdk_env)
    created = sandpit(
        env,
        "sandbox",
        "create",
        "--provider",
        "local",
        "--metadata",
        "cli=yes",
        "--timeout-s",
        "300",
    )
    assert created.returncode == 0, created.stderr
    sandbox_id = created.stdout.strip()
    assert re.fullmatch(r"sbx_\w+", sandbox_id)
    try:
        listed = json.loads(
            sandpit(env, "sandbox", "list", "--json", "--metadata", "cli=yes").stdout
        )
        assert [s["id"] for s in listed] == [sandbox_id]
        assert sandbox_id in sandpit(env, "sandbox", "list").stdout
        info = json.loads(sandpit(env, "sandbox", "info", sandbox_id, "--json").stdout)
        assert (info["state"], info["timeout_s"]) == ("running", 300)
        assert "600" in sandpit(env, "sandbox", "timeout", sandbox_id, "600").stdout

        run = sandpit(env, "exec", sandbox_id, "--", "sh", "-c", "echo out; echo err >&2; exit 7")
        assert (run.returncode, run.stdout, run.stderr) == (7, "out\n", "err\n")
        piped = sandpit(env, "exec", sandbox_id, "--", "tr a-z A-Z", stdin="shout\n")
        assert (piped.returncode, piped.stdout) == (0, "SHOUT\n")

        started = subprocess.run(
            [SANDPIT, "exec", sandbox_id, "--", "true"],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert started.returncode == 0
        ps = json.loads(sandpit(env, "ps", sandbox_id, "--json").stdout)
        assert isinstance(ps, list)

        bg = sandpit(env, "start", sandbox_id, "--", "sh", "-c", "echo one; echo two >&2; exit 3")
        assert bg.returncode == 0, bg.stderr
        pid = bg.stdout.strip()
        followed = sandpit(env, "logs", sandbox_id, pid, "--follow", "--interval-s", "0.1")
        assert (followed.returncode, followed.stdout, followed.stderr) == (3, "one\n", "two\n")

        big = tmp_path / "big.bin"
        big.write_bytes(os.urandom(3 * 1024 * 1024))
        up = sandpit(env, "cp", "--progress", str(big), f"{sandbox_id}:data/")
        assert up.returncode == 0, up.stderr
        assert "100%" in up.stderr and "[" in up.stderr
        back = tmp_path / "back.bin"
        down = sandpit(env, "cp", f"{sandbox_id}:data/big.bin", str(back))
        assert down.returncode == 0, down.stderr
        assert back.read_bytes() == big.read_bytes()
        missing = sandpit(env, "cp", f"{sandbox_id}:nope.bin", str(tmp_path))
        assert missing.returncode == 1 and "file_not_found" in missing.stderr
        assert "Traceback" not in missing.stderr

        assert "destroyed" in sandpit(env, "sandbox", "kill", sandbox_id).stdout
        assert "already" in sandpit(env, "sandbox", "kill", sandbox_id).stdout
    finally:
        sandpit(env, "sandbox", "kill", sandbox_id)


def test_unknown_sandbox_is_one_clear_line(sdk_env):  # type: ignore[no-untyped-def]
    done = sandpit(cli_env(sdk_env), "sandbox", "info", "sbx_missing")
    assert done.returncode == 1
    assert done.stderr == "sandpit: No such sandbox. (sandbox_not_found)\n"


def test_run_prints_the_verdict(sdk_env, tmp_path):  # type: ignore[no-untyped-def]
    env = cli_env(sdk_env)
    ok = tmp_path / "ok.py"
    ok.write_text("print(input()[::-1])\n")
    stdin = tmp_path / "in.txt"
    stdin.write_text("abc\n")
    done = sandpit(env, "run", str(ok), "--stdin", str(stdin))
    assert (done.returncode, done.stdout) == (0, "cba\n"), done.stderr
    assert "verdict: ok" in done.stderr
    bad = tmp_path / "bad.py"
    bad.write_text("raise SystemExit(3)\n")
    failed = sandpit(env, "run", str(bad), "--json")
    assert failed.returncode == 3
    assert json.loads(failed.stdout)["verdict"] == "runtime_error"


def test_shell_through_a_pty(sdk_env, client):  # type: ignore[no-untyped-def]
    pexpect = require_module("pexpect", "pexpect is in the dev extras")
    sandbox = client.create(provider="local")
    try:
        env = cli_env(sdk_env)
        # The shell is followed by `stty -a`, so the test sees the local terminal's modes after.
        child = pexpect.spawn(
            "/bin/sh",
            ["-c", f"{SANDPIT} shell {sandbox.id} --shell /bin/sh; echo cli-exit=$?; stty -a"],
            env=env,
            dimensions=(30, 100),
            timeout=30,
            encoding="utf-8",
        )
        # Typing before the shell is up would be flushed when the client enters raw mode.
        child.expect(r"\$ ")
        child.send("stty size\r")
        child.expect("30 100")
        child.setwinsize(40, 120)  # SIGWINCH to the client, forwarded as a resize
        child.send("stty size\r")
        child.expect("40 120")
        child.send("sh -c 'echo sleeping-$((6*7)); exec sleep 100'\r")
        child.expect("sleeping-42")
        child.sendcontrol("c")
        child.send("echo after-$((40+2))\r")
        child.expect("after-42")
        child.send("exit 5\r")
        child.expect(r"cli-exit=5")
        child.expect(pexpect.EOF)
        modes = child.before
        assert re.search(r"(?<!-)icanon", modes) and re.search(r"(?<![-\w])echo\b", modes), modes
        assert "Traceback" not in modes
    finally:
        sandbox.kill()
