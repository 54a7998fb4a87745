"""Request ids (playground/middleware.py): echoed when safe, generated otherwise, unique
within a process and across forked ones."""

from __future__ import annotations

import os
import re

import pytest
from django.test import Client

from playground.middleware import REQUEST_IDS, RequestIds

GENERATED = re.compile(r"^[0-9a-f]{32}$")


def test_generated_ids_are_32_hex_digits_and_never_repeat() -> None:
    ids = RequestIds()
    seen = [ids.next() for _ in range(10_000)]
    assert all(GENERATED.match(one) for one in seen)
    assert len(set(seen)) == len(seen)
    assert seen[0][:16] != RequestIds().next()[:16]  # each process draws its own prefix


def test_a_forked_child_draws_a_prefix_of_its_own() -> None:
    before = REQUEST_IDS.next()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its next id and leave at once
        os.write(write_end, REQUEST_IDS.next().encode())
        os._exit(0)
    os.close(write_end)
    child = os.read(read_end, 64).decode()
    os.close(read_end)
    os.waitpid(pid, 0)
    after = REQUEST_IDS.next()
    assert GENERATED.match(child)
    assert child[:16] != before[:16]  # not the parent's sequence continued
    assert after[:16] == before[:16]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("sent", "echoed"),
    [
        ("trace-42.a_b", "trace-42.a_b"),  # a caller's own id is kept
        ("bad id\r\nX-Evil: 1", None),  # anything else is replaced
        ("x" * 65, None),
        ("", None),
    ],
)
def test_a_safe_incoming_id_is_echoed_any_other_is_replaced(sent: str, echoed: str | None) -> None:
    response = Client().get("/health/live", headers={"X-Request-ID": sent} if sent else {})
    got = response["X-Request-ID"]
    if echoed is not None:
        assert got == echoed
    else:
        assert GENERATED.match(got), got
