"""The async client has the sync client's surface and talks to the same live server."""

from __future__ import annotations

import asyncio
import inspect

import pytest
from sandpit import AsyncSandbox, AsyncSandpit, NotFoundError, Sandbox, aio, client

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(
    ("sync_cls", "async_cls"),
    [
        (client.Sandpit, aio.AsyncSandpit),
        (client.Sandbox, aio.AsyncSandbox),
        (client.Commands, aio.AsyncCommands),
        (client.Files, aio.AsyncFiles),
        (client.Processes, aio.AsyncProcesses),
        (client.Terminals, aio.AsyncTerminals),
    ],
)
def test_async_twin_has_the_same_methods_and_parameters(sync_cls, async_cls):  # type: ignore[no-untyped-def]
    sync_names = {n for n in dir(sync_cls) if not n.startswith("_")}
    async_names = {n for n in dir(async_cls) if not n.startswith("_")}
    assert sync_names - async_names == set()
    for name in sync_names:
        sync_attr, async_attr = getattr(sync_cls, name), getattr(async_cls, name)
        if not callable(sync_attr):
            continue
        assert list(inspect.signature(sync_attr).parameters) == list(
            inspect.signature(async_attr).parameters
        ), name


def test_async_lifecycle_commands_and_files(sdk_env):  # type: ignore[no-untyped-def]
    async def scenario() -> str:
        async with AsyncSandpit() as sandpit:
            sandbox = await sandpit.create(provider="local", metadata={"suite": "async"})
            async with sandbox:
                assert (await sandbox.info()).state == "running"
                result = await sandbox.commands.run("echo async-$((6*7))")
                assert (result.exit_code, result.stdout) == (0, "async-42\n")
                streamed: list[str] = []
                result = await sandbox.commands.run(
                    "echo one; echo two >&2", on_stdout=streamed.append, on_stderr=streamed.append
                )
                assert "one\n" in streamed and "two\n" in streamed and result.exit_code == 0
                await sandbox.files.write("a/b.txt", b"async bytes")
                assert await sandbox.files.read("a/b.txt", format="text") == "async bytes"
                assert await sandbox.files.exists("a/b.txt")
                assert not await sandbox.files.exists("a/nope.txt")
                assert [s.id for s in await AsyncSandbox.list(metadata={"suite": "async"})] == [
                    sandbox.id
                ]
                handle = await sandbox.commands.run("cat", background=True)
                await handle.send_stdin("piped\n", eof=True)
                assert (await handle.wait(30)).stdout == "piped\n"
            assert await sandbox.kill() is False
            with pytest.raises(NotFoundError):
                await sandpit.connect("sbx_missing")
            return sandbox.id

    sandbox_id = asyncio.run(scenario())
    assert Sandbox.connect(sandbox_id).info().state == "destroyed"


def test_async_files_processes_terminals_and_watch(sdk_env, tmp_path):  # type: ignore[no-untyped-def]
    """The rest of the async surface, each operation once (their requests are _calls.py's,
    shared with the sync client; their sockets _async_realtime.py's)."""

    async def scenario() -> None:
        async with AsyncSandpit() as sandpit:
            sandbox = await sandpit.create(provider="local")
            async with sandbox:
                await sandbox.files.make_dir("w")
                events: list[str] = []
                watcher = await sandbox.files.watch("w", on_event=lambda e: events.append(e.path))
                source = tmp_path / "up.bin"
                source.write_bytes(b"x" * 200_000)
                progress: list[int] = []
                with source.open("rb") as stream:
                    entry = await sandbox.files.write(
                        "w/up.bin", stream, on_progress=lambda done, total: progress.append(done)
                    )
                assert entry.size_bytes == 200_000 and progress[-1] == 200_000
                for _ in range(100):  # before the rename: the watcher may fold the two
                    if "w/up.bin" in events:
                        break
                    await asyncio.sleep(0.05)
                assert "w/up.bin" in events
                chunks = [c async for c in await sandbox.files.read("w/up.bin", format="stream")]
                assert b"".join(chunks) == b"x" * 200_000
                assert (await sandbox.files.make_dir("w/d")).type == "dir"
                moved = await sandbox.files.rename("w/up.bin", "w/d/up.bin")
                assert moved.path == "w/d/up.bin"
                assert (await sandbox.files.stat("w/d/up.bin")).size_bytes == 200_000
                listed = await sandbox.files.list("w", recursive=True)
                assert {e.path for e in listed} >= {"w/d", "w/d/up.bin"}
                await sandbox.files.remove("w/d", recursive=True)
                assert not await sandbox.files.exists("w/d")
                await watcher.stop()

                process = await sandbox.processes.start("sleep", ["60"])
                assert process.pid in [p.pid for p in await sandbox.processes.list()]
                assert await sandbox.processes.kill(process.pid) is True
                await asyncio.sleep(0.2)
                assert await sandbox.processes.kill(process.pid) is False
                started = await sandbox.commands.start("echo detached")
                for _ in range(100):
                    output = await sandbox.commands.output(started.pid)
                    if output.stdout:
                        break
                    await asyncio.sleep(0.05)
                assert output.stdout == "detached\n"

                terminal = await sandbox.terminals.create(cols=100, rows=30)
                assert terminal.id in [t.id for t in await sandbox.terminals.list()]
                await sandbox.terminals.resize(terminal.id, 120, 40)
                await terminal.send("echo term-$((6*7))\n")
                seen = b""
                for _ in range(100):
                    seen += terminal.output()
                    if b"term-42" in seen:
                        break
                    await asyncio.sleep(0.05)
                assert b"term-42" in seen
                await terminal.close()  # kills it
                assert await sandbox.terminals.kill(terminal.id) is False
            assert await sandpit.delete_snapshot("snp_missing") is False

    asyncio.run(scenario())
