"""Cold local jail starts queue beyond `create_concurrency` (SANDPIT_LOCAL_CREATE_CONCURRENCY):
never more at once, every create still succeeds, and the queue's wait is not the start's."""

from __future__ import annotations

import threading
import uuid
from typing import Any

from sandboxes.providers.base import ExecRequest, SandboxSpec
from sandboxes.providers.local import LocalProvider
from tests.requirements import jail_root


def test_cold_starts_beyond_the_limit_wait_their_turn() -> None:
    provider = LocalProvider(root_dir=jail_root("create-queue"), create_concurrency=1)
    starting = 0
    most = 0
    lock = threading.Lock()
    real_start = provider._start

    def counted_start(*args: Any, **kwargs: Any) -> Any:
        nonlocal starting, most
        with lock:
            starting += 1
            most = max(most, starting)
        try:
            return real_start(*args, **kwargs)
        finally:
            with lock:
                starting -= 1

    provider._start = counted_start  # type: ignore[method-assign]
    ids = [f"q{uuid.uuid4().hex[:10]}" for _ in range(3)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(ids))

    def create(sandbox_id: str) -> None:
        barrier.wait()
        try:
            provider.create(SandboxSpec(sandbox_id=sandbox_id))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=create, args=(sid,)) for sid in ids]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not errors, errors
        assert most == 1
        for sandbox_id in ids:
            result = provider.exec(sandbox_id, ExecRequest(command="echo", args=["up"]))
            assert result.stdout == b"up\n"
    finally:
        for sandbox_id in ids:
            provider.destroy(sandbox_id)
