"""common/inputs.py: an input serializer's fields are built once per class and shared, and
validation still keeps each request's data, errors and defaults to itself."""

from __future__ import annotations

import threading
from typing import Any

from rest_framework import serializers

from common.inputs import InputSerializer
from sandboxes.serializers import CommandInput, MoveInput, SandboxCreateInput


def _outcome(serializer_class: type[serializers.Serializer], data: Any) -> tuple[bool, Any]:
    serializer = serializer_class(data=data)
    if serializer.is_valid():
        return True, dict(serializer.validated_data)
    return False, serializer.errors


def test_instances_share_one_set_of_fields_bound_to_no_requests_data():
    first, second = CommandInput(data={"command": "secret-one"}), CommandInput(data={})
    assert first.fields is second.fields
    for field in first.fields.values():
        assert field.parent is not first and field.parent is not second
        assert not hasattr(field.parent, "initial_data")  # holds no request's body
    assert MoveInput().fields is MoveInput().fields
    assert list(MoveInput().fields) == ["to", "from"]  # its get_fields() still applies


def test_a_context_partial_or_opted_out_class_gets_its_own_fields():
    shared = CommandInput().fields
    assert CommandInput(context={"request": None}).fields is not shared
    assert CommandInput(partial=True).fields is not shared

    class OwnFields(InputSerializer):
        share_fields = False
        name = serializers.CharField()

    assert OwnFields().fields is not OwnFields().fields


def test_a_partial_root_reaches_its_nested_inputs():
    """DRF skips a missing required field when the root is partial, nested ones included."""

    class Inner(InputSerializer):
        name = serializers.CharField()

    class Outer(InputSerializer):
        inner = Inner()

    Outer().fields  # noqa: B018 - the shared fields exist before the partial request
    partial = Outer(data={"inner": {}}, partial=True)
    assert partial.is_valid(), partial.errors
    whole = Outer(data={"inner": {}})
    assert not whole.is_valid() and "name" in whole.errors["inner"]


def test_a_mutable_default_is_never_shared():
    class WithList(InputSerializer):
        tags = serializers.ListField(child=serializers.CharField(), default=[])

    class WithNested(InputSerializer):
        inner = WithList(required=False)

    for cls in (WithList, WithNested):
        assert cls().fields is not cls().fields
    first = WithList(data={})
    assert first.is_valid()
    first.validated_data["tags"].append("changed by one request")
    second = WithList(data={})
    assert second.is_valid() and second.validated_data["tags"] == []


PAYLOADS: list[tuple[type[serializers.Serializer], Any]] = [
    (CommandInput, {"command": "echo", "args": ["a", "b"], "env": {"A": "1"}}),
    (CommandInput, {"command": 42}),
    (CommandInput, {"cmd": "ls"}),
    (CommandInput, {"command": "true", "timeout_s": "soon", "env": {"": "x"}}),
    (SandboxCreateInput, {"template": "python", "resources": {"memory_mb": 256}}),
    (SandboxCreateInput, {"memory_mb": 256}),
    (SandboxCreateInput, {"resources": {"memory_mb": "lots", "templat": 1}}),
    (SandboxCreateInput, {"metadata": [1]}),
    (SandboxCreateInput, []),
    (MoveInput, {"from": "a", "to": "b"}),
    (MoveInput, {"from_": "a"}),
]


def test_concurrent_validations_each_get_their_own_result():
    expected = [_outcome(cls, data) for cls, data in PAYLOADS]
    threads = 8
    rounds = 40
    barrier = threading.Barrier(threads)
    mismatches: list[tuple[int, Any, Any]] = []

    def validate(offset: int) -> None:
        barrier.wait()
        for n in range(rounds):
            index = (offset + n) % len(PAYLOADS)
            cls, data = PAYLOADS[index]
            got = _outcome(cls, data)
            if got != expected[index]:
                mismatches.append((index, got, expected[index]))

    workers = [threading.Thread(target=validate, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert mismatches == []
    assert expected[0][0] and not expected[1][0]  # the set holds passes and failures
    assert "did you mean command?" in str(expected[2][1])
    assert "belongs in resources" in str(expected[5][1])
