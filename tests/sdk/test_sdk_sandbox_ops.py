"""Commands, code, files, processes, terminals, watchers and previews through the sync SDK,
on every provider the live server enables."""

from __future__ import annotations

import io
import queue
import threading
import time

import httpx
import pytest
from sandpit import FileEvent, InvalidRequestError, NotFoundError

pytestmark = pytest.mark.django_db(transaction=True)


def test_commands_rest_streamed_and_background(sbx):  # type: ignore[no-untyped-def]
    result = sbx.commands.run("echo out; echo err >&2; exit 3")
    assert (result.stdout, result.stderr, result.exit_code) == ("out\n", "err\n", 3)
    assert result.duration_ms > 0 and not result.ok
    argv = sbx.commands.run("printf", ["%s|", "a b", "c"], cwd="/tmp", env={"X": "1"})
    assert argv.stdout == "a b|c|"
    assert sbx.commands.run("cat", stdin="fed\n").stdout == "fed\n"
    assert sbx.commands.run("sleep 5", timeout_s=0.5).timed_out

    chunks: list[tuple[str, str]] = []
    streamed = sbx.commands.run(
        "echo a; echo b >&2; echo c",
        on_stdout=lambda d: chunks.append(("out", d)),
        on_stderr=lambda d: chunks.append(("err", d)),
    )
    assert streamed.exit_code == 0 and streamed.stdout == "a\nc\n" and streamed.stderr == "b\n"
    assert ("err", "b\n") in chunks and streamed.pid
    # A program reading stdin gets EOF when no stdin was given, streamed or not.
    assert sbx.commands.run("cat; echo done", on_stdout=lambda d: None).stdout == "done\n"

    lines: queue.Queue[str] = queue.Queue()
    handle = sbx.commands.run(
        "while read line; do echo got-$line; done", background=True, on_stdout=lines.put
    )
    assert handle.pid
    handle.send_stdin("one\n")
    assert lines.get(timeout=20) == "got-one\n"
    handle.close_stdin()
    assert handle.wait(20).exit_code == 0
    assert handle.kill() is False

    sleeper = sbx.commands.run("sleep 60", background=True)
    assert sleeper.pid and sleeper.kill() is True
    killed = sleeper.wait(20)
    assert killed.cancelled and killed.exit_code != 0


def test_run_code(sbx):  # type: ignore[no-untyped-def]
    result = sbx.run_code("print(6 * 7)", language="python")
    assert (result.stdout, result.language) == ("42\n", "python")
    assert sbx.run_code("echo $((1+1))", language="bash").stdout == "2\n"
    seen: list[str] = []
    assert sbx.run_code("print('streamed')", on_stdout=seen.append).exit_code == 0
    assert "".join(seen) == "streamed\n"
    languages = {language.name: language for language in sbx.languages()}
    assert {"python", "node", "bash"} <= set(languages) and not languages["python"].compiled
    if "c" in languages:  # the local default on a host with gcc; docker's image has none
        hello = sbx.run_code('#include <stdio.h>\nint main(void){ puts("hi"); }\n')
        assert (hello.stdout, hello.language, hello.compile.exit_code) == ("hi\n", "c", 0)
        broken = sbx.run_code("int main(void){ return nope; }", language="c")
        assert broken.compile.exit_code != 0 and "nope" in broken.stderr
        streamed_out: list[str] = []
        c_code = '#include <stdio.h>\nint main(void){ puts("live"); }\n'
        assert sbx.run_code(c_code, on_stdout=streamed_out.append).stdout == "live\n"
    else:
        with pytest.raises(InvalidRequestError):
            sbx.run_code("int main(void){ return 0; }", language="c")
    if "cobol" not in languages:  # streamed or not, an unknown language is refused alike
        for callback in (None, streamed_none):
            with pytest.raises(InvalidRequestError):
                sbx.run_code("DISPLAY 1", language="cobol", on_stdout=callback)


def streamed_none(_: str) -> None:
    """An on_stdout callback that makes run_code stream."""


def test_binary_command_output_survives(sbx):  # type: ignore[no-untyped-def]
    result = sbx.commands.run("printf '\\377\\000ok'")
    assert result.stdout_bytes == b"\xff\x00ok" and result.stdout == "\ufffd\x00ok"
    code = sbx.run_code("import sys; sys.stderr.buffer.write(bytes([254, 10]))", language="python")
    assert code.stderr_bytes == b"\xfe\n"


def test_detached_command_keeps_its_output(sbx):  # type: ignore[no-untyped-def]
    sbx.files.write("go.sh", "echo one; while [ ! -e go ]; do sleep 0.05; done; echo two >&2")
    started = sbx.commands.start("sh", ["go.sh"])
    assert started.running and started.command == "sh go.sh"
    first = sbx.commands.output(started.pid)
    while first.stdout != "one\n":
        first = sbx.commands.output(started.pid)
    sbx.files.write("go", "")
    rest = sbx.commands.output(started.pid, stdout_offset=first.stdout_offset)
    while rest.running:
        rest = sbx.commands.output(started.pid, stdout_offset=first.stdout_offset)
    assert (rest.stdout, rest.stderr_bytes, rest.exit_code) == ("", b"two\n", 0)


def test_files_in_tmp(sbx):  # type: ignore[no-untyped-def]
    assert sbx.files.write("/tmp/hello.py", "print('hi from tmp')").path == "/tmp/hello.py"
    assert sbx.commands.run("python3 /tmp/hello.py").stdout == "hi from tmp\n"
    sbx.commands.run("echo linked > /tmp/t.txt && ln -s /tmp/t.txt link && ln -s /etc/hostname out")
    assert sbx.files.read("link") == b"linked\n"
    assert "/tmp/t.txt" in {e.path for e in sbx.files.list("/tmp")}
    assert sbx.files.exists("/tmp/t.txt") and not sbx.files.exists("/tmp/nope")
    assert sbx.files.rename("/tmp/hello.py", "moved.py").path == "moved.py"
    for path in ("out", "/etc/hostname", "/tmp/../etc/hostname"):
        with pytest.raises(InvalidRequestError) as refused:
            sbx.files.read(path)
        assert refused.value.code == "path_not_allowed"


def test_files(sbx):  # type: ignore[no-untyped-def]
    entry = sbx.files.write("dir/hello.txt", "hello")
    assert (entry.path, entry.size_bytes, entry.type) == ("dir/hello.txt", 5, "file")
    assert sbx.files.read("dir/hello.txt") == b"hello"
    assert sbx.files.read("dir/hello.txt", format="text") == "hello"
    blob = bytes(range(256)) * 4096  # 1 MiB, every byte value
    progress: list[tuple[int, int | None]] = []
    sbx.files.write("blob.bin", io.BytesIO(blob), on_progress=lambda d, t: progress.append((d, t)))
    assert progress[-1] == (len(blob), len(blob)) and len(progress) > 4
    assert b"".join(sbx.files.read("blob.bin", format="stream")) == blob
    assert sbx.files.exists("blob.bin") and not sbx.files.exists("nope.bin")
    assert sbx.files.stat("dir").is_dir
    assert {e.path for e in sbx.files.list("dir")} == {"dir/hello.txt"}
    assert "dir/hello.txt" in {e.path for e in sbx.files.list(".", recursive=True)}
    sbx.files.make_dir("made/deep")
    assert sbx.files.rename("dir/hello.txt", "made/deep/hi.txt").path == "made/deep/hi.txt"
    with pytest.raises(NotFoundError) as missing:
        sbx.files.read("dir/hello.txt")
    assert missing.value.code == "file_not_found"
    with pytest.raises(InvalidRequestError):
        sbx.files.remove("made")  # a non-empty directory without recursive
    sbx.files.remove("made", recursive=True)
    assert not sbx.files.exists("made")
    with pytest.raises(InvalidRequestError) as escape:
        sbx.files.read("../../etc/passwd")
    assert escape.value.code == "path_not_allowed"


def test_processes(sbx):  # type: ignore[no-untyped-def]
    started = sbx.processes.start("sleep", ["300"])
    assert started.running and started.pid
    assert started.pid in {p.pid for p in sbx.processes.list() if p.running}
    assert sbx.processes.kill(started.pid) is True
    deadline = time.monotonic() + 20
    while any(p.pid == started.pid and p.running for p in sbx.processes.list()):
        assert time.monotonic() < deadline, "the process survived SIGKILL"
        time.sleep(0.1)
    assert sbx.processes.kill(999999) is False


def test_terminal_send_resize_ctrl_c_and_close(sbx):  # type: ignore[no-untyped-def]
    output = bytearray()
    arrived = threading.Condition()

    def on_data(data: bytes) -> None:
        with arrived:
            output.extend(data)
            arrived.notify_all()

    def until(marker: bytes) -> None:
        with arrived:
            assert arrived.wait_for(lambda: marker in output, 20), bytes(output[-500:])

    terminal = sbx.terminals.create(100, 30, shell="/bin/sh", on_data=on_data)  # noqa: S604
    terminal.send("stty size\r")
    until(b"30 100")
    terminal.resize(120, 40)
    terminal.send("stty size\r")
    until(b"40 120")
    terminal.send("sh -c 'echo sleeping-$((6*7)); exec sleep 100'\r")
    until(b"sleeping-42")
    terminal.send(b"\x03")
    terminal.send("echo after-$((40+2))\r")
    until(b"after-42")
    assert terminal.id in {t.id for t in sbx.terminals.list()}
    terminal.send("exit 7\r")
    assert terminal.wait(20) == 7
    terminal.close()
    assert sbx.terminals.kill(terminal.id) is False


def test_watch_delivers_file_events(sbx):  # type: ignore[no-untyped-def]
    events: queue.Queue[FileEvent] = queue.Queue()
    with sbx.files.watch(".", on_event=events.put, debounce_ms=20):
        sbx.files.write("watched.txt", b"x")
        seen: set[str] = set()
        deadline = time.monotonic() + 20
        while "watched.txt" not in seen:
            seen.add(events.get(timeout=max(0.1, deadline - time.monotonic())).path)


def test_get_url_previews_a_server_without_other_credentials(local_sbx):  # type: ignore[no-untyped-def]
    local_sbx.files.write("index.html", "<h1>preview-ok</h1>")
    local_sbx.processes.start("python3", ["-m", "http.server", "8123"])
    url = local_sbx.get_url(8123)
    assert "token=" in url
    deadline = time.monotonic() + 20
    while True:
        response = httpx.get(url, follow_redirects=True, timeout=10)
        if response.status_code == 200:
            break
        assert time.monotonic() < deadline, response.text
        time.sleep(0.2)
    assert "preview-ok" in response.text
