"""`sandpit`: the command line over the SDK.

Known errors print one line (`sandpit: <message> (<code>)`) and exit non-zero, without a
traceback; `--json` on read commands prints the API's data for scripts.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import getpass
import json
import os
import select
import shlex
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from .client import Sandbox, Sandpit
from .config import DEFAULT_URL, config_path, read_config_file, write_config_file
from .errors import SandpitError

PROGRESS_MIN_BYTES = 1024 * 1024
"""Files at least this large show a progress bar on a terminal (always with --progress)."""


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: _jsonable(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def _print_json(value: Any) -> None:
    print(json.dumps(_jsonable(value), indent=2, default=str))


def _pairs(items: Sequence[str] | None, what: str) -> dict[str, str]:
    result: dict[str, str] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SandpitError(f"{what} must look like KEY=VALUE, not '{item}'.", code="usage")
        result[key] = value
    return result


def _client(args: argparse.Namespace) -> Sandpit:
    return Sandpit(api_key=args.api_key, url=args.url)


def _table(rows: list[list[str]], header: list[str]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print(
            "  ".join(
                str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)
            ).rstrip()
        )


# --- login ------------------------------------------------------------------------------------


def cmd_login(args: argparse.Namespace) -> int:
    stored = read_config_file()
    url = args.url or os.environ.get("SANDPIT_URL") or stored.get("url") or DEFAULT_URL
    key = args.api_key or os.environ.get("SANDPIT_API_KEY")
    if not key:
        if not sys.stdin.isatty():
            key = sys.stdin.readline().strip()
        else:
            key = getpass.getpass("API key (sp_...): ").strip()
    with Sandpit(api_key=key, url=url) as client:
        client.list(state="running")  # proves the URL and the key before storing them
    path = write_config_file(url=url.rstrip("/"), api_key=key)
    print(f"Logged in to {url}; saved to {path}")
    return 0


# --- sandboxes --------------------------------------------------------------------------------


def cmd_sandbox_create(args: argparse.Namespace) -> int:
    resources: dict[str, Any] = {}
    if args.memory_mb:
        resources["memory_mb"] = args.memory_mb
    if args.cpu_count:
        resources["cpu_count"] = args.cpu_count
    with _client(args) as client:
        sandbox = client.create(
            provider=args.provider,
            template=args.template,
            timeout_s=args.timeout_s,
            env=_pairs(args.env, "--env"),
            metadata=_pairs(args.metadata, "--metadata"),
            resources=resources or None,
            network=True if args.network else None,
            snapshot=args.snapshot,
        )
        if args.json:
            _print_json(sandbox.info())
        else:
            print(sandbox.id)
    return 0


def cmd_sandbox_list(args: argparse.Namespace) -> int:
    with _client(args) as client:
        found = client.list(state=args.state, metadata=_pairs(args.metadata, "--metadata"))
    if args.json:
        _print_json(found)
        return 0
    _table(
        [
            [
                s.id,
                s.state,
                s.provider,
                s.template,
                s.created_at.isoformat(timespec="seconds") if s.created_at else "",
            ]
            for s in found
        ],
        ["ID", "STATE", "PROVIDER", "TEMPLATE", "CREATED"],
    )
    return 0


def cmd_sandbox_info(args: argparse.Namespace) -> int:
    with _client(args) as client:
        info = client.sandbox_info(args.id)
    if args.json:
        _print_json(info)
        return 0
    for key, value in dataclasses.asdict(info).items():
        print(f"{key:18} {value.isoformat() if isinstance(value, datetime) else value}")
    return 0


def cmd_sandbox_kill(args: argparse.Namespace) -> int:
    with _client(args) as client:
        killed = Sandbox(client, client.sandbox_info(args.id)).kill()
    print(f"{args.id} destroyed" if killed else f"{args.id} was already destroyed")
    return 0


def cmd_sandbox_pause(args: argparse.Namespace) -> int:
    with _client(args) as client:
        info = client.connect(args.id).pause()
    print(f"{info.id} {info.state}")
    return 0


def cmd_sandbox_resume(args: argparse.Namespace) -> int:
    with _client(args) as client:
        info = client.connect(args.id).resume()
    print(f"{info.id} {info.state}")
    return 0


def cmd_sandbox_snapshot(args: argparse.Namespace) -> int:
    with _client(args) as client:
        snapshot = client.connect(args.id).snapshot(args.name)
    print(snapshot.id)
    return 0


def cmd_sandbox_fork(args: argparse.Namespace) -> int:
    with _client(args) as client:
        print(client.connect(args.id).fork().id)
    return 0


def cmd_sandbox_timeout(args: argparse.Namespace) -> int:
    with _client(args) as client:
        info = client.connect(args.id).set_timeout(args.seconds)
    print(f"{info.id} idle timeout {info.timeout_s} s")
    return 0


# --- exec, ps, run ------------------------------------------------------------------------------


def _write_to(stream: Any) -> Any:
    def write(text: str) -> None:
        stream.write(text)
        stream.flush()

    return write


def cmd_exec(args: argparse.Namespace) -> int:
    argv = list(args.command)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise SandpitError(
            "exec needs a command after the sandbox id (sandpit exec ID -- CMD ...).", code="usage"
        )
    stdin = None if sys.stdin.isatty() else sys.stdin.read()
    cmd, rest = (argv[0], None) if len(argv) == 1 else (argv[0], argv[1:])
    with _client(args) as client:
        sandbox = Sandbox(client, client.sandbox_info(args.id))
        result = sandbox.commands.run(
            cmd,
            rest,
            cwd=args.cwd,
            env=_pairs(args.env, "--env"),
            stdin=stdin,
            timeout_s=args.timeout_s,
            on_stdout=_write_to(sys.stdout),
            on_stderr=_write_to(sys.stderr),
        )
    if result.timed_out:
        print(f"sandpit: the command timed out after {args.timeout_s} s", file=sys.stderr)
        return 124
    # A signal death (-N) becomes 128+N, as a shell reports it.
    return result.exit_code if result.exit_code >= 0 else 128 - result.exit_code


def cmd_ps(args: argparse.Namespace) -> int:
    with _client(args) as client:
        processes = client.connect(args.id).processes.list()
    if args.json:
        _print_json(processes)
        return 0
    _table(
        [
            [str(p.pid), "running" if p.running else f"exited {p.exit_code}", p.command]
            for p in processes
        ],
        ["PID", "STATE", "COMMAND"],
    )
    return 0


def cmd_start(args: argparse.Namespace) -> int:
    with _client(args) as client:
        command = shlex.join(args.command) if len(args.command) > 1 else args.command[0]
        process = client.connect(args.id).commands.start(command)
    print(process.pid)
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    """Print what a background command wrote; with --follow, keep printing until it exits
    (then exit with its code)."""
    with _client(args) as client:
        commands = client.connect(args.id).commands
        stdout_offset = stderr_offset = 0
        while True:
            out = commands.output(
                args.pid, stdout_offset=stdout_offset, stderr_offset=stderr_offset
            )
            sys.stdout.buffer.write(out.stdout_bytes)
            sys.stdout.flush()
            sys.stderr.buffer.write(out.stderr_bytes)
            sys.stderr.flush()
            stdout_offset, stderr_offset = out.stdout_offset, out.stderr_offset
            if not args.follow or not out.running:
                break
            time.sleep(args.interval_s)
    if args.follow and out.exit_code is not None:
        return out.exit_code if out.exit_code >= 0 else 128 - out.exit_code
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    path = Path(args.file)
    code = path.read_text()
    # The server knows every language by its file extensions too (py, rs, java, ...).
    language = args.language or path.suffix.lstrip(".").lower() or None
    stdin = Path(args.stdin).read_text() if args.stdin else None
    limits = {"timeout_s": args.timeout_s} if args.timeout_s else None
    with _client(args) as client:
        result = client.run(code=code, language=language, stdin=stdin, limits=limits)
    if args.json:
        _print_json(result)
    else:
        sys.stdout.write(result.stdout)
        sys.stderr.write(result.stderr)
        cpu = f", cpu {result.cpu_time_ms:.0f} ms" if result.cpu_time_ms is not None else ""
        print(
            f"verdict: {result.verdict} (exit {result.exit_code}, {result.duration_ms:.0f} ms{cpu})",
            file=sys.stderr,
        )
    if result.verdict == "ok":
        return 0
    return result.exit_code if result.exit_code > 0 else 1


# --- cp ---------------------------------------------------------------------------------------


def _remote(spec: str) -> tuple[str, str] | None:
    """`ID:/path` → (ID, path); a local path (no colon before any slash) → None."""
    head, sep, tail = spec.partition(":")
    if sep and head and "/" not in head and head.startswith("sbx_"):
        return head, tail or "."
    return None


class Progress:
    """A one-line bar on stderr: bytes done of total, redrawn in place."""

    def __init__(self, label: str, enabled: bool) -> None:
        self.label = label
        self.enabled = enabled
        self.shown = False

    def __call__(self, done: int, total: int | None) -> None:
        if not self.enabled:
            return
        if total:
            filled = int(30 * done / total)
            bar = "#" * filled + "-" * (30 - filled)
            text = f"\r{self.label} [{bar}] {done * 100 // total:3d}% {done}/{total} bytes"
        else:
            text = f"\r{self.label} {done} bytes"
        sys.stderr.write(text)
        sys.stderr.flush()
        self.shown = True

    def end(self) -> None:
        if self.shown:
            sys.stderr.write("\n")
            sys.stderr.flush()


def cmd_cp(args: argparse.Namespace) -> int:
    src, dst = _remote(args.src), _remote(args.dst)
    if (src is None) == (dst is None):
        raise SandpitError(
            "cp copies between this machine and a sandbox: one side is ID:/path.", code="usage"
        )
    with _client(args) as client:
        if dst is not None:
            sandbox_id, path = dst
            local = Path(args.src)
            size = local.stat().st_size
            if path.endswith("/") or path in (".", ""):
                path = path.rstrip("/") + "/" + local.name if path not in (".", "") else local.name
            progress = Progress(
                local.name, args.progress or (size >= PROGRESS_MIN_BYTES and sys.stderr.isatty())
            )
            with local.open("rb") as source:
                client.connect(sandbox_id).files.write(path, source, on_progress=progress)
            progress.end()
            return 0
        assert src is not None
        sandbox_id, path = src
        sandbox = client.connect(sandbox_id)
        size = sandbox.files.stat(path).size_bytes
        target = Path(args.dst)
        if target.is_dir():
            target = target / Path(path).name
        progress = Progress(
            Path(path).name, args.progress or (size >= PROGRESS_MIN_BYTES and sys.stderr.isatty())
        )
        done = 0
        partial = target.with_name(target.name + ".part")
        with partial.open("wb") as out:
            for chunk in sandbox.files.read(path, format="stream"):
                out.write(chunk)
                done += len(chunk)
                progress(done, size)
        partial.replace(target)
        progress.end()
    return 0


# --- shell ------------------------------------------------------------------------------------


@contextlib.contextmanager
def _raw_terminal(fd: int) -> Iterator[None]:
    """Raw mode while the shell runs (every key, Ctrl-C included, goes to the sandbox); the
    saved settings come back however the block ends."""
    import termios
    import tty

    if not os.isatty(fd):
        yield
        return
    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def cmd_shell(args: argparse.Namespace) -> int:
    stdin_fd, stdout_fd = sys.stdin.fileno(), sys.stdout.fileno()
    try:
        size = os.get_terminal_size(stdout_fd)
        cols, rows = size.columns, size.lines
    except OSError:
        cols, rows = 80, 24

    def on_data(data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(stdout_fd, view) :]

    with _client(args) as client:
        sandbox = client.connect(args.id)
        terminal = sandbox.terminals.create(cols, rows, shell=args.shell, on_data=on_data)  # noqa: S604
        previous = None

        def on_winch(signum: int, frame: Any) -> None:
            try:
                size = os.get_terminal_size(stdout_fd)
            except OSError:
                return
            terminal.resize(size.columns, size.lines)

        if hasattr(signal, "SIGWINCH"):
            previous = signal.signal(signal.SIGWINCH, on_winch)
        try:
            with _raw_terminal(stdin_fd):
                while not terminal.closed:
                    try:
                        ready, _, _ = select.select([stdin_fd], [], [], 0.1)
                    except InterruptedError:
                        continue
                    if not ready:
                        continue
                    data = os.read(stdin_fd, 65536)
                    if not data:
                        break
                    terminal.send(data)
        finally:
            if previous is not None:
                signal.signal(signal.SIGWINCH, previous)
            code = terminal.exit_code
            terminal.close(kill=True)
    return code if isinstance(code, int) and code >= 0 else 0


# --- parser -------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sandpit", description="Sandpit sandboxes from the command line."
    )
    parser.add_argument("--url", help="server URL (default: SANDPIT_URL, then `sandpit login`)")
    parser.add_argument(
        "--api-key", help="API key (default: SANDPIT_API_KEY, then `sandpit login`)"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    login = sub.add_parser("login", help=f"store the URL and API key in {config_path()}")
    login.set_defaults(func=cmd_login)

    sandbox = sub.add_parser("sandbox", help="create, list, inspect and destroy sandboxes")
    ssub = sandbox.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = ssub.add_parser("create", help="create a sandbox and print its id")
    create.add_argument("--provider")
    create.add_argument("--template")
    create.add_argument("--timeout-s", type=int, help="idle timeout in seconds")
    create.add_argument("--memory-mb", type=int)
    create.add_argument("--cpu-count", type=float)
    create.add_argument("--network", action="store_true")
    create.add_argument("--snapshot", help="start from this snapshot's files (snp_...)")
    create.add_argument("--env", action="append", metavar="KEY=VALUE")
    create.add_argument("--metadata", action="append", metavar="KEY=VALUE")
    create.add_argument("--json", action="store_true")
    create.set_defaults(func=cmd_sandbox_create)
    listing = ssub.add_parser("list", help="your organization's sandboxes")
    listing.add_argument("--state")
    listing.add_argument("--metadata", action="append", metavar="KEY=VALUE")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=cmd_sandbox_list)
    info = ssub.add_parser("info", help="one sandbox")
    info.add_argument("id")
    info.add_argument("--json", action="store_true")
    info.set_defaults(func=cmd_sandbox_info)
    kill = ssub.add_parser("kill", help="destroy a sandbox")
    kill.add_argument("id")
    kill.set_defaults(func=cmd_sandbox_kill)
    pause = ssub.add_parser("pause", help="freeze a sandbox's processes (memory kept)")
    pause.add_argument("id")
    pause.set_defaults(func=cmd_sandbox_pause)
    resume = ssub.add_parser("resume", help="thaw a paused sandbox or restart an archived one")
    resume.add_argument("id")
    resume.set_defaults(func=cmd_sandbox_resume)
    snap = ssub.add_parser("snapshot", help="save a sandbox's files; prints the snapshot id")
    snap.add_argument("id")
    snap.add_argument("--name", default="")
    snap.set_defaults(func=cmd_sandbox_snapshot)
    fork = ssub.add_parser("fork", help="a new sandbox with a copy of the files; prints its id")
    fork.add_argument("id")
    fork.set_defaults(func=cmd_sandbox_fork)
    timeout = ssub.add_parser("timeout", help="set the idle timeout (seconds)")
    timeout.add_argument("id")
    timeout.add_argument("seconds", type=int)
    timeout.set_defaults(func=cmd_sandbox_timeout)

    exe = sub.add_parser("exec", help="run a command, streaming its output; exits with its code")
    exe.add_argument("id")
    exe.add_argument("--cwd")
    exe.add_argument("--env", action="append", metavar="KEY=VALUE")
    exe.add_argument("--timeout-s", type=float)
    exe.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    exe.set_defaults(func=cmd_exec)

    shell = sub.add_parser("shell", help="an interactive terminal in the sandbox")
    shell.add_argument("id")
    shell.add_argument("--shell", help="e.g. /bin/sh (default: the server's)")
    shell.set_defaults(func=cmd_shell)

    cp = sub.add_parser("cp", help="copy a file to or from a sandbox (ID:/path on one side)")
    cp.add_argument("src")
    cp.add_argument("dst")
    cp.add_argument("--progress", action="store_true", help="show the progress bar for any size")
    cp.set_defaults(func=cmd_cp)

    run = sub.add_parser(
        "run", help="one-shot judge: run a file in a fresh sandbox, print the verdict"
    )
    run.add_argument("file")
    run.add_argument(
        "--language", help="python, node, c, go, rust, java, ... (default: from the extension)"
    )
    run.add_argument("--stdin", metavar="FILE", help="a file fed to the program's stdin")
    run.add_argument("--timeout-s", type=float)
    run.add_argument("--json", action="store_true")
    run.set_defaults(func=cmd_run)

    start = sub.add_parser("start", help="start a command in the background; prints its pid")
    start.add_argument("id")
    start.add_argument("command", nargs="+", help="after --: the command and its arguments")
    start.set_defaults(func=cmd_start)

    logs = sub.add_parser("logs", help="what a background command (sandpit start) wrote")
    logs.add_argument("id")
    logs.add_argument("pid", type=int)
    logs.add_argument("-f", "--follow", action="store_true", help="until it exits")
    logs.add_argument("--interval-s", type=float, default=0.5)
    logs.set_defaults(func=cmd_logs)

    ps = sub.add_parser("ps", help="processes started with the processes API")
    ps.add_argument("id")
    ps.add_argument("--json", action="store_true")
    ps.set_defaults(func=cmd_ps)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except SandpitError as exc:
        print(f"sandpit: {exc.message} ({exc.code})", file=sys.stderr)
        return 2 if exc.code == "usage" else 1
    except OSError as exc:
        print(f"sandpit: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
