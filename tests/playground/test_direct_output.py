"""common/outputs.py: an output read directly is what DRF's generic walk returns."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from datetime import timezone as fixed_zone
from zoneinfo import ZoneInfo

import pytest
from django.utils import timezone
from rest_framework import serializers

from common.outputs import DirectOutput
from sandboxes.models import Sandbox, Snapshot
from sandboxes.serializers import SandboxOutput

pytestmark = pytest.mark.django_db


def _walked(serializer: serializers.Serializer, instance: object) -> dict[str, object]:
    """DRF's own Serializer.to_representation, bypassing DirectOutput."""
    return dict(serializers.Serializer.to_representation(serializer, instance))


def _same(serializer: serializers.Serializer, instance: object) -> dict[str, object]:
    direct = serializer.to_representation(instance)
    walked = _walked(serializer, instance)
    assert direct == walked
    assert [type(v) for v in direct.values()] == [type(v) for v in walked.values()]
    assert list(direct) == list(walked)  # the same keys in the same order
    return direct


def _sandbox(org, **fields) -> Sandbox:
    now = timezone.now()
    return Sandbox.objects.create(
        organization=org, provider="local", timeout_s=60, expires_at=now, **fields
    )


def test_every_sandbox_field_reads_as_drf_reads_it(org_a):
    moment = datetime(2026, 12, 2, 13, 14, 15, 161718, tzinfo=UTC)
    full = _sandbox(
        org_a,
        started_at=moment,
        stopped_at=moment.replace(microsecond=0),  # isoformat drops zero microseconds
        paused_at=moment.astimezone(fixed_zone(timedelta(hours=5, minutes=30))),
        destroyed_at=moment.astimezone(ZoneInfo("America/New_York")),
        resources={"memory_mb": 512, "nested": {"list": [1, "two", None]}},
        metadata={"ünïcode": "✓ \u2028", "n": 1.5, "deep": [[{}]]},
        error_message="boom\nline two",
        destroy_reason="api",
        network=True,
    )
    fresh = _sandbox(org_a)  # Nones, empty strings and defaults
    serializer = SandboxOutput()
    for instance in (full, fresh, Sandbox.objects.get(pk=full.pk)):
        _same(serializer, instance)
    shown = serializer.to_representation(full)
    assert shown["started_at"] == "2026-12-02T13:14:15.161718Z"
    assert shown["stopped_at"] == "2026-12-02T13:14:15Z"
    assert shown["paused_at"] == shown["started_at"]  # shown in the current zone, UTC
    assert serializer.to_representation(fresh)["snapshot"] is None


def test_a_snapshot_is_its_primary_key_without_a_query(org_a, django_assert_num_queries):
    source = _sandbox(org_a)
    snapshot = Snapshot.objects.create(
        organization=org_a, sandbox=source, source_sandbox_id=source.pk, provider="local"
    )
    restored = Sandbox.objects.get(pk=_sandbox(org_a, snapshot=snapshot).pk)
    with django_assert_num_queries(0):
        shown = SandboxOutput().to_representation(restored)
    assert shown["snapshot"] == snapshot.pk
    _same(SandboxOutput(), restored)


def test_another_current_timezone_is_followed(org_a):
    moment = datetime(2026, 6, 1, 23, 30, tzinfo=UTC)
    sandbox = _sandbox(org_a, started_at=moment)
    with timezone.override(ZoneInfo("Asia/Tokyo")):
        shown = _same(SandboxOutput(), sandbox)
    assert shown["started_at"] == "2026-06-02T08:30:00+09:00"


def test_a_list_reuses_the_childs_plan_and_matches(org_a):
    sandboxes = [_sandbox(org_a, metadata={"i": i}) for i in range(3)]
    many = SandboxOutput(sandboxes, many=True).data
    assert [dict(item) for item in many] == [_walked(SandboxOutput(), s) for s in sandboxes]


class _Mixed(DirectOutput, serializers.ModelSerializer):
    """Fields DirectOutput must leave to DRF: a method, a dotted source, a model method."""

    organization_slug = serializers.CharField(source="organization.slug")
    summary = serializers.SerializerMethodField()
    whole = serializers.ReadOnlyField(source="__str__")
    state_label = serializers.CharField(source="get_state_display")
    custom_time = serializers.DateTimeField(format="%Y/%m/%d %H:%M")
    tokyo_time = serializers.DateTimeField(
        source="created_at", default_timezone=ZoneInfo("Asia/Tokyo")
    )

    class Meta:
        model = Sandbox
        fields = [
            "id",
            "organization_slug",
            "summary",
            "whole",
            "state_label",
            "custom_time",
            "tokyo_time",
            "timeout_s",
        ]

    def get_summary(self, obj: Sandbox) -> str:
        return f"{obj.provider}:{obj.template}"


def test_fields_that_are_not_plain_columns_are_walked_by_drf(org_a):
    sandbox = _sandbox(org_a, started_at=datetime(2026, 1, 2, 3, 4, tzinfo=UTC))
    sandbox.custom_time = datetime(2026, 1, 2, 3, 4, tzinfo=UTC)  # type: ignore[attr-defined]
    shown = _same(_Mixed(), sandbox)
    assert shown["organization_slug"] == org_a.slug
    assert shown["summary"] == "local:default"
    assert shown["custom_time"] == "2026/01/02 03:04"
    assert str(shown["tokyo_time"]).endswith("+09:00")


def test_a_mapping_is_read_by_key_as_drf_reads_it():
    row = {"id": "sb_x", "state": "running", "provider": "local", "template": "default",
           "resources": {}, "timeout_s": 60, "network": False, "isolation": "namespaces",
           "metadata": {}, "created_at": datetime(2026, 1, 1, tzinfo=UTC), "started_at": None,
           "stopped_at": None, "paused_at": None, "destroyed_at": None,
           "last_activity_at": datetime(2026, 1, 1, tzinfo=UTC),
           "expires_at": datetime(2026, 1, 2, tzinfo=UTC), "error_message": "",
           "destroy_reason": "", "snapshot": None}  # fmt: skip
    assert _same(SandboxOutput(), row)["created_at"] == "2026-01-01T00:00:00Z"


def _kinds(serializer: DirectOutput, instance: object) -> dict[str, str]:
    serializer.to_representation(instance)
    return {name: read.__qualname__.split(".")[0] for name, read in serializer._readers or []}


def test_columns_are_read_directly_and_the_rest_by_drf(org_a):
    sandbox = _sandbox(org_a)
    kinds = _kinds(SandboxOutput(), sandbox)
    assert {kinds[name] for name in ("created_at", "expires_at", "destroyed_at")} == {
        "_iso_datetime"
    }
    assert {kinds[name] for name in ("id", "state", "resources", "network", "timeout_s")} == {
        "_attribute"
    }
    assert kinds["snapshot"] == "_primary_key"
    sandbox.custom_time = timezone.now()  # type: ignore[attr-defined]
    mixed = _kinds(_Mixed(), sandbox)
    assert {mixed[name] for name in ("organization_slug", "summary", "whole", "state_label")} == {
        "_generic"
    }
    assert mixed["custom_time"] == "_generic"  # not a column
    assert mixed["tokyo_time"] == "_attribute"  # a column, in its own zone: the field renders it
