"""The unmodified e2b SDK (async) against a live Sandpit, on the local and docker providers."""

from __future__ import annotations

import asyncio

import pytest

from .test_e2b_sdk_sync import PROVIDERS, _template

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_every_call_of_the_async_sdk(e2b_env, org_a, provider):  # type: ignore[no-untyped-def]
    template = _template(provider)
    asyncio.run(_exercise(template))


async def _exercise(template: str) -> None:
    from e2b import AsyncSandbox
    from e2b.sandbox.commands.command_handle import PtySize

    sbx = await AsyncSandbox.create(template=template, metadata={"suite": "async"})
    try:
        assert await sbx.is_running()
        assert (await sbx.get_info()).metadata == {"suite": "async"}
        await sbx.set_timeout(200)
        again = await AsyncSandbox.connect(sbx.sandbox_id)
        assert (await again.commands.run("echo again")).stdout == "again\n"
        listed = await AsyncSandbox.list().next_items()
        assert sbx.sandbox_id in [s.sandbox_id for s in listed]

        chunks: list[str] = []
        result = await sbx.commands.run("for i in 1 2 3; do echo $i; done", on_stdout=chunks.append)
        assert result.stdout == "1\n2\n3\n" and "".join(chunks) == result.stdout

        handle = await sbx.commands.run("cat", background=True, stdin=True)
        assert handle.pid in [p.pid for p in await sbx.commands.list()]
        await sbx.commands.send_stdin(handle.pid, "async stdin\n")
        await sbx.commands.close_stdin(handle.pid)
        done = await handle.wait()
        assert done.stdout == "async stdin\n" and done.exit_code == 0

        sleeper = await sbx.commands.run("sleep 60", background=True)
        assert await sbx.commands.kill(sleeper.pid) is True

        data = bytearray()
        pty = await sbx.pty.create(PtySize(rows=24, cols=80), on_data=data.extend)
        await sbx.pty.resize(pty.pid, PtySize(rows=40, cols=100))
        await sbx.pty.send_stdin(pty.pid, b"stty size; echo async-$((6*7))\n")
        for _ in range(300):
            if b"async-42" in data:
                break
            await asyncio.sleep(0.05)
        assert b"async-42" in data and b"40 100" in data
        assert await sbx.pty.kill(pty.pid) is True

        await sbx.files.make_dir("/home/user/w")
        events = []
        watch = await sbx.files.watch_dir("/home/user/w", on_event=events.append)
        await sbx.files.write("w/seen.txt", "x")
        for _ in range(300):
            if any(e.name == "seen.txt" for e in events):
                break
            await asyncio.sleep(0.05)
        assert any(e.name == "seen.txt" for e in events)
        await watch.stop()
        assert await sbx.files.read("w/seen.txt") == "x"
        assert [e.name for e in await sbx.files.list("w")] == ["seen.txt"]
    finally:
        assert await sbx.kill() is True
    assert not await sbx.is_running()
