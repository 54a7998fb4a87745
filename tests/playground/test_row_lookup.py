"""common/rows.py: a row read by a statement written once is the row the ORM reads."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.models import Model
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts.models import Organization
from accounts.principal import ORGANIZATION_BY_ID, Principal
from common.rows import RowLookup
from sandboxes.models import Sandbox

pytestmark = pytest.mark.django_db


def _same_fields(found: object, expected: object, model: type[Model]) -> None:
    for field in model._meta.concrete_fields:
        assert getattr(found, field.attname) == getattr(expected, field.attname), field.name
        assert type(getattr(found, field.attname)) is type(getattr(expected, field.attname))


def test_the_principals_organization_is_the_orms(org_a):
    org_a.spending_cap_cents = 12_345
    org_a.save()
    with CaptureQueriesContext(connection) as queries:
        found = Principal(organization_id=org_a.pk).organization
    assert len(queries) == 1
    _same_fields(found, Organization.objects.get(pk=org_a.pk), Organization)
    assert found._state.adding is False and found._state.db == "default"
    found.name = "renamed"  # an ordinary instance: it saves like one
    found.save(update_fields=["name"])
    assert Organization.objects.get(pk=org_a.pk).name == "renamed"


def test_a_miss_is_none_and_a_missing_organization_raises():
    assert ORGANIZATION_BY_ID.get(-1) is None
    with pytest.raises(Organization.DoesNotExist):
        Principal(organization_id=-1).organization  # noqa: B018 - the lookup is the test


def test_json_and_datetime_columns_convert_as_the_orm_converts(org_a, org_b):
    now = timezone.now()
    sandbox = Sandbox.objects.create(
        organization=org_a,
        provider="local",
        timeout_s=60,
        expires_at=now,
        started_at=now,
        resources={"memory_mb": 512, "nested": {"list": [1, "two", None]}},
        metadata={"ünïcode": "✓", "n": 1.5},
    )
    lookup = RowLookup(Sandbox, "pk", "organization")
    found = lookup.get(sandbox.pk, org_a.pk)
    _same_fields(found, Sandbox.objects.get(pk=sandbox.pk), Sandbox)
    assert found is not None and found.metadata == {"ünïcode": "✓", "n": 1.5}
    # Every condition applies: another organization's id is a miss.
    assert lookup.get(sandbox.pk, org_b.pk) is None
    assert lookup.sql().count("%s") == 2
