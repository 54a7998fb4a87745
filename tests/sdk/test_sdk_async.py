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
