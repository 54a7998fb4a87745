"""common/rows.py: a row read by a statement written once is the row the ORM reads."""

from __future__ import annotations

import pytest
from django.contrib.sessions.models import Session
from django.core.exceptions import FieldDoesNotExist
from django.db import IntegrityError, connection, transaction
from django.db.models import Model
from django.db.models.signals import post_save
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts.backends import USER_BY_ID
from accounts.models import Membership, Organization, Role, User
from accounts.orgcache import ORGANIZATION_BY_ID
from accounts.principal import Principal
from accounts.selectors import FIRST_MEMBERSHIP_WITH_ORGANIZATION, MEMBERSHIP_WITH_ORGANIZATION
from accounts.sessions import SESSION_BY_KEY, SessionStore
from common.rows import RowInsert, RowLookup
from sandboxes.models import Sandbox
from sandboxes.services import SANDBOX_INSERT

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


def test_a_joined_lookup_reads_both_rows_as_select_related_does(org_a, org_b):
    org_a.spending_cap_cents = 4_321
    org_a.save()
    sandbox = Sandbox.objects.create(
        organization=org_a, provider="local", timeout_s=60, expires_at=timezone.now()
    )
    lookup = RowLookup(Sandbox, "pk", "organization", join="organization")
    with CaptureQueriesContext(connection) as queries:
        found = lookup.get(sandbox.pk, org_a.pk)
        assert found is not None
        organization = found.organization  # loaded with the sandbox: no query of its own
    assert len(queries) == 1 and " JOIN " in queries[0]["sql"]
    expected = Sandbox.objects.select_related("organization").get(pk=sandbox.pk)
    _same_fields(found, expected, Sandbox)
    _same_fields(organization, expected.organization, Organization)
    assert organization._state.adding is False and organization._state.db == "default"
    # The join does not widen the conditions: another organization's id is still a miss.
    assert lookup.get(sandbox.pk, org_b.pk) is None
    assert lookup.get("no-such-sandbox", org_a.pk) is None


def test_the_first_row_by_an_order_is_the_orms(alice, charlie, org_a, org_b):
    """`first_by` reads what ``order_by(...).first()`` reads, by the joined model's fields
    too; and the sessions', users' and memberships' lookups read what Django's ORM reads."""
    org_c = Organization.objects.create(name="Aardvark", slug="org-c", plan="free")
    Membership.objects.create(user=alice, organization=org_c, role=Role.MEMBER)
    Membership.objects.create(user=alice, organization=org_b, role=Role.ADMIN)
    first = FIRST_MEMBERSHIP_WITH_ORGANIZATION.get(alice.pk)
    expected = (
        Membership.objects.filter(user=alice)
        .select_related("organization")
        .order_by("organization__name", "organization_id")
        .first()
    )
    assert first is not None and expected is not None
    _same_fields(first, expected, Membership)
    _same_fields(first.organization, expected.organization, Organization)
    assert first.organization.name == "Aardvark"
    assert FIRST_MEMBERSHIP_WITH_ORGANIZATION.sql().endswith(" LIMIT 1")
    # Renamed: the order follows the joined column, not the row's id.
    Organization.objects.filter(pk=org_c.pk).update(name="Zebra")
    first = FIRST_MEMBERSHIP_WITH_ORGANIZATION.get(alice.pk)
    assert first is not None and first.organization.name == "Org A"
    # Ties on the name: the organization's id decides, as the ORM's order does.
    Organization.objects.filter(pk=org_b.pk).update(name="Org A")
    first = FIRST_MEMBERSHIP_WITH_ORGANIZATION.get(alice.pk)
    assert first is not None and first.organization_id == min(org_a.pk, org_b.pk)
    chosen = MEMBERSHIP_WITH_ORGANIZATION.get(alice.pk, org_b.pk)
    assert chosen is not None and chosen.role == Role.ADMIN
    assert MEMBERSHIP_WITH_ORGANIZATION.get(charlie.pk, org_a.pk) is None
    assert FIRST_MEMBERSHIP_WITH_ORGANIZATION.get(-1) is None
    _same_fields(USER_BY_ID.get(alice.pk), User.objects.get(pk=alice.pk), User)


def test_a_sessions_row_is_read_by_its_key_until_it_expires(alice):
    store = SessionStore()
    store["organization_id"] = 7
    store.create()
    loaded = SessionStore(store.session_key)
    assert loaded["organization_id"] == 7 and loaded.session_key == store.session_key
    _same_fields(
        SESSION_BY_KEY.get(store.session_key), Session.objects.get(pk=store.session_key), Session
    )
    Session.objects.filter(pk=store.session_key).update(expire_date=timezone.now())
    expired = SessionStore(store.session_key)
    assert expired.get("organization_id") is None  # an expired session is a new, empty one
    assert expired.session_key is None
    unknown = SessionStore("x" * 32)
    assert dict(unknown.items()) == {} and unknown.session_key is None


@pytest.mark.parametrize("join", ["created_by", "state", "no_such_field"])
def test_only_a_required_foreign_key_can_be_joined(join):
    # A nullable key would drop rows from an inner join; other fields are not keys at all.
    lookup = RowLookup(Sandbox, "pk", join=join)
    with pytest.raises((ValueError, FieldDoesNotExist)):
        lookup.sql()


def test_a_principal_adopts_only_its_own_organizations_row(org_a, org_b):
    principal = Principal(organization_id=org_a.pk)
    principal.adopt_organization(Organization.objects.get(pk=org_b.pk))  # ignored
    principal.adopt_organization(Organization.objects.get(pk=org_a.pk))
    with CaptureQueriesContext(connection) as queries:
        assert principal.organization.pk == org_a.pk
    assert len(queries) == 0
    loaded = Principal(organization=org_a)
    loaded.adopt_organization(Organization.objects.get(pk=org_a.pk))
    assert loaded.organization is org_a  # one already loaded is kept


def _stored(model: type[Model], pk: object) -> dict[str, object]:
    return model.objects.filter(pk=pk).values(*(f.attname for f in model._meta.concrete_fields))[0]


def _insert_where_true(sandbox: Sandbox) -> Sandbox:
    """SANDBOX_INSERT's conditional insert, its condition holding."""
    with connection.cursor() as cursor:
        cursor.execute(SANDBOX_INSERT.sql_where("1 = %s"), [*SANDBOX_INSERT.values(sandbox), 1])
        assert cursor.rowcount == 1
    return SANDBOX_INSERT.saved(sandbox)


@pytest.mark.parametrize("insert", [SANDBOX_INSERT.insert, _insert_where_true])
def test_an_insert_stores_what_the_orm_stores(org_a, alice, insert):  # type: ignore[no-untyped-def]
    now = timezone.now()
    given = {
        "organization": org_a,
        "created_by": alice,
        "provider": "local",
        "template": "python",
        "timeout_s": 60,
        "expires_at": now,
        "resources": {"memory_mb": 512, "nested": {"list": [1, "two", None]}},
        "metadata": {"ünïcode": "✓", "quote'd": 'a"b', "n": 1.5},
        "network": True,
    }
    ours = insert(Sandbox(**given))
    theirs = Sandbox.objects.create(**given)
    assert ours._state.adding is False and ours._state.db == "default"
    assert ours.pk != theirs.pk and ours.pk.startswith("sbx_")  # the key's default ran
    stored_ours, stored_theirs = _stored(Sandbox, ours.pk), _stored(Sandbox, theirs.pk)
    for name in ("id", "created_at", "last_activity_at"):  # defaults: each row its own
        assert stored_ours.pop(name) is not None
        stored_theirs.pop(name)
    assert stored_ours == stored_theirs
    for field in Sandbox._meta.concrete_fields:  # the instance is the ORM's, value and type
        if field.attname not in ("id", "created_at", "last_activity_at"):
            mine, orms = getattr(ours, field.attname), getattr(theirs, field.attname)
            assert mine == orms and type(mine) is type(orms), field.name
    ours.state = "running"  # an ordinary saved instance: it updates, it does not insert
    ours.save(update_fields=["state"])
    assert Sandbox.objects.get(pk=ours.pk).state == "running"


def test_an_insert_is_one_statement_and_a_duplicate_key_fails(org_a):
    sandbox = Sandbox(organization=org_a, provider="local", timeout_s=60, expires_at=timezone.now())
    with CaptureQueriesContext(connection) as queries:
        SANDBOX_INSERT.insert(sandbox)
    assert len(queries) == 1 and queries[0]["sql"].startswith("INSERT INTO")
    again = Sandbox(
        pk=sandbox.pk, organization=org_a, provider="local", timeout_s=60, expires_at=timezone.now()
    )
    with pytest.raises(IntegrityError), transaction.atomic():
        SANDBOX_INSERT.insert(again)


def test_a_conditional_insert_whose_condition_fails_stores_nothing(org_a):
    sandbox = Sandbox(organization=org_a, provider="local", timeout_s=60, expires_at=timezone.now())
    with connection.cursor() as cursor:
        # NULLs too keep their column's type (an untyped NULL in a SELECT list is text).
        cursor.execute(SANDBOX_INSERT.sql_where("1 = %s"), [*SANDBOX_INSERT.values(sandbox), 2])
        assert cursor.rowcount == 0
    assert not Sandbox.objects.filter(pk=sandbox.pk).exists()


def test_save_signals_are_kept_while_anything_listens(org_a):
    heard: list[tuple[str, bool]] = []

    def listener(sender, instance, created=None, **kwargs):  # type: ignore[no-untyped-def]
        heard.append((instance.pk, bool(created)))

    post_save.connect(listener, sender=Sandbox, weak=False)
    try:
        sandbox = SANDBOX_INSERT.insert(
            Sandbox(organization=org_a, provider="local", timeout_s=60, expires_at=timezone.now())
        )
    finally:
        post_save.disconnect(listener, sender=Sandbox)
    assert heard == [(sandbox.pk, True)]
    assert Sandbox.objects.filter(pk=sandbox.pk).exists()


def test_models_an_insert_cannot_write_alone_are_refused():
    with pytest.raises(ValueError, match="gets values back"):
        RowInsert(Organization)  # a database sequence gives its key
