"""Accounts under attack: invitations for someone else, racing owners, password guessing,
redirects after signup, and what signup tells about an address."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from django.core import mail
from django.db import connection, connections
from django.test import Client

from accounts import attempts, services
from accounts.models import Invitation, Membership, Organization, Role, User
from accounts.services import invitation_accept, invitation_create
from common.errors import ApplicationError

PASSWORD = "correct horse battery"


@pytest.fixture(autouse=True)
def _mail(settings):  # type: ignore[no-untyped-def]
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def clock(monkeypatch) -> Clock:  # type: ignore[no-untyped-def]
    """The throttle's clock stands still unless a test moves it, so a delay never runs out
    while a slow test is still making its requests."""
    frozen = Clock()
    monkeypatch.setattr(attempts, "_clock", frozen)
    return frozen


def _link(path_part: str, index: int = -1) -> str:
    body = mail.outbox[index].body
    line = next(line for line in body.splitlines() if path_part in line).strip()
    return line[line.index("/accounts/") :]


# --- 1. invitations are for the invited address only ------------------------------------------


@pytest.mark.django_db
def test_invitation_cannot_be_accepted_by_another_logged_in_account(org_a, alice, charlie):
    issued = invitation_create(
        actor=alice, organization=org_a, email="intended@example.com", role=Role.ADMIN
    )
    client = Client()
    client.force_login(charlie)
    page = client.get(f"/invitations/{issued.token}/")
    posted = client.post(f"/invitations/{issued.token}/")
    for response in (page, posted):
        assert response.status_code == 403
        body = response.content.decode()
        assert "different account" in body
        for secret in ("Org A", "intended", "Admin", "admin"):
            assert secret not in body.split("<main", 1)[1], secret
    assert not Membership.objects.filter(user=charlie, organization=org_a).exists()
    assert Invitation.objects.get(pk=issued.invitation.pk).accepted_at is None
    with pytest.raises(ApplicationError) as excinfo:
        invitation_accept(token=issued.token, user=charlie)
    assert excinfo.value.code == "invitation_wrong_account"


@pytest.mark.django_db
def test_wrong_account_is_refused_before_the_invitations_state_is_told(org_a, alice, charlie):
    issued = invitation_create(actor=alice, organization=org_a, email="intended@example.com")
    Invitation.objects.filter(pk=issued.invitation.pk).update(revoked_at="2020-01-01T00:00Z")
    with pytest.raises(ApplicationError) as excinfo:
        invitation_accept(token=issued.token, user=charlie)
    assert excinfo.value.code == "invitation_wrong_account"


@pytest.mark.django_db
def test_invitation_matches_the_email_case_insensitively(org_a, alice, charlie):
    issued = invitation_create(
        actor=alice, organization=org_a, email="CHARLIE@Example.com", role=Role.ADMIN
    )
    # Accounts made in the admin may keep the case they were typed with.
    User.objects.filter(pk=charlie.pk).update(email="Charlie@EXAMPLE.com")
    charlie.refresh_from_db()
    client = Client()
    client.force_login(charlie)
    assert client.post(f"/invitations/{issued.token}/").status_code == 302
    assert Membership.objects.get(user=charlie, organization=org_a).role == Role.ADMIN


@pytest.mark.django_db
def test_invitee_signs_up_from_the_link_with_the_invited_address_and_joins(org_a, alice):
    issued = invitation_create(
        actor=alice, organization=org_a, email="newcomer@example.com", role=Role.ADMIN
    )
    invitation_path = f"/invitations/{issued.token}/"
    client = Client()
    to_login = client.get(invitation_path)
    assert to_login.status_code == 302 and "next=" in to_login["Location"]
    client.post(f"/accounts/signup/?next={invitation_path}", {"email": "newcomer@example.com"})
    created = client.post(_link("/signup/confirm/"), {"password": "a long enough passphrase"})
    # The new account joined on creation (it can only be the invited address's), so there is
    # no detour through the invitation page and no organization of its own.
    assert created.status_code == 302 and created["Location"] == "/"
    newcomer = User.objects.get(email="newcomer@example.com")
    assert Membership.objects.get(user=newcomer, organization=org_a).role == Role.ADMIN
    assert Membership.objects.filter(user=newcomer).count() == 1


# --- 2. at least one owner, under concurrency ---------------------------------------------------


def _race(calls: list[Callable[[], int]], monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Run `calls` in threads so that each reaches the owner check while the others are at it.

    Every call that passes the "another owner exists" check then waits until either all calls
    have passed it (the race the old code lost) or another call is blocked on a database lock
    (the organization row lock serializing them), read from pg_stat_activity.
    """
    original = services._ensure_another_owner
    passed = 0
    passed_lock = threading.Lock()
    go = threading.Event()

    def checked_then_wait(membership: Membership) -> None:
        nonlocal passed
        original(membership)
        with passed_lock:
            passed += 1
            if passed == len(calls):
                go.set()
        assert go.wait(timeout=60), "neither a race nor a lock wait happened"

    monkeypatch.setattr(services, "_ensure_another_owner", checked_then_wait)
    statuses: list[int] = [0] * len(calls)

    def run(i: int) -> None:
        try:
            statuses[i] = calls[i]()
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 60
    while not go.is_set() and any(t.is_alive() for t in threads) and time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            if cursor.fetchone()[0]:
                go.set()
        time.sleep(0.002)  # polling the marker above, not waiting for an outcome
    go.set()
    for thread in threads:
        thread.join(timeout=60)
    return statuses


@pytest.fixture
def two_owners(db, alice, bob, org_a):  # type: ignore[no-untyped-def]
    if connection.vendor != "postgresql":
        pytest.fail("the owner race is tested on PostgreSQL (set TEST_DATABASE_URL)")
    Membership.objects.filter(user=bob, organization=org_a).update(role=Role.OWNER)
    clients = []
    for user in (alice, bob):
        client = Client()
        client.force_login(user)
        clients.append(client)
    memberships = [Membership.objects.get(user=u, organization=org_a) for u in (alice, bob)]
    return clients, memberships


def _owners(org: Organization) -> int:
    return Membership.objects.filter(organization=org, role=Role.OWNER).count()


@pytest.mark.django_db(transaction=True)
def test_two_owners_demoting_each_other_at_once_leave_one_owner(two_owners, org_a, monkeypatch):
    (alice_client, bob_client), (alice_m, bob_m) = two_owners
    statuses = _race(
        [
            lambda: (
                alice_client.patch(
                    f"/api/v1/members/{bob_m.pk}", {"role": "member"}, "application/json"
                ).status_code
            ),
            lambda: (
                bob_client.patch(
                    f"/api/v1/members/{alice_m.pk}", {"role": "member"}, "application/json"
                ).status_code
            ),
        ],
        monkeypatch,
    )
    # The second sees the first's write: no longer an owner (403) or the last owner (409).
    assert statuses.count(200) == 1 and set(statuses) - {200} <= {403, 409}
    assert _owners(org_a) == 1


@pytest.mark.django_db(transaction=True)
def test_two_owners_removing_each_other_at_once_leave_one_owner(two_owners, org_a, monkeypatch):
    (alice_client, bob_client), (alice_m, bob_m) = two_owners
    statuses = _race(
        [
            lambda: alice_client.delete(f"/api/v1/members/{bob_m.pk}").status_code,
            lambda: bob_client.delete(f"/api/v1/members/{alice_m.pk}").status_code,
        ],
        monkeypatch,
    )
    # The second finds its own membership gone (not a member any more: 403) or is refused as
    # the last owner (409); never two successes.
    assert statuses.count(204) == 1 and statuses.count(200) == 0
    assert _owners(org_a) == 1


@pytest.mark.django_db(transaction=True)
def test_two_owners_leaving_at_once_leave_one_owner(two_owners, org_a, monkeypatch):
    (alice_client, bob_client), (alice_m, bob_m) = two_owners
    statuses = _race(
        [
            lambda: alice_client.delete(f"/api/v1/members/{alice_m.pk}").status_code,
            lambda: bob_client.delete(f"/api/v1/members/{bob_m.pk}").status_code,
        ],
        monkeypatch,
    )
    assert sorted(statuses) == [204, 409]
    assert _owners(org_a) == 1


# --- 3. password guessing, reset and signup floods ------------------------------------------


def _login(client: Client, email: str, password: str, address: str):  # type: ignore[no-untyped-def]
    return client.post(
        "/accounts/login/", {"username": email, "password": password}, REMOTE_ADDR=address
    )


@pytest.mark.django_db
def test_twelve_wrong_passwords_then_the_right_one_is_refused(alice):
    client = Client()
    for _ in range(12):
        _login(client, "alice@example.com", "wrong password", "198.51.100.7")
    response = _login(client, "alice@example.com", PASSWORD, "198.51.100.7")
    assert response.status_code == 429
    assert int(response["Retry-After"]) >= 1
    assert b"Too many attempts" in response.content
    assert "_auth_user_id" not in client.session


@pytest.mark.django_db
def test_delays_grow_and_end(alice, clock):
    client = Client()
    waits = []
    for _ in range(attempts.LOGIN_PER_ACCOUNT_AND_ADDRESS.free + 4):
        _login(client, "alice@example.com", "wrong password", "198.51.100.8")
        waits.append(attempts.login_wait_s(_request("198.51.100.8"), "alice@example.com"))
        clock.now += waits[-1]  # wait out each delay, then guess again
    assert waits[:5] == [0, 0, 0, 0, 0]
    assert waits[5:] == [1, 2, 4, 8]
    # Past the delay the owner's right password works again: no lock outlives its delay.
    assert _login(client, "alice@example.com", PASSWORD, "198.51.100.8").status_code == 302


def _request(address: str, cookies: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    from django.test import RequestFactory

    request = RequestFactory().get("/", REMOTE_ADDR=address)
    request.COOKIES.update(cookies or {})
    return request


@pytest.mark.django_db
def test_guessing_from_one_address_does_not_lock_the_owner_out_elsewhere(alice):
    attacker = Client()
    for _ in range(12):
        _login(attacker, "alice@example.com", "wrong password", "198.51.100.9")
    assert _login(attacker, "alice@example.com", PASSWORD, "198.51.100.9").status_code == 429
    assert _login(Client(), "alice@example.com", PASSWORD, "192.0.2.10").status_code == 302


@pytest.mark.django_db
def test_guessing_from_many_addresses_spares_a_browser_that_logged_in_before(alice):
    owner = Client()
    assert _login(owner, "alice@example.com", PASSWORD, "192.0.2.20").status_code == 302
    owner.post("/accounts/logout/")
    for n in range(attempts.LOGIN_PER_ACCOUNT.free + 2):
        _login(Client(), "alice@example.com", "wrong password", f"203.0.113.{n + 1}")
    # A new browser at a fresh address meets the account-wide delay...
    assert _login(Client(), "alice@example.com", PASSWORD, "192.0.2.30").status_code == 429
    # ...the owner's browser, which carries the known-browser cookie, does not.
    assert attempts.KNOWN_BROWSER_COOKIE in owner.cookies
    assert _login(owner, "alice@example.com", PASSWORD, "192.0.2.20").status_code == 302


@pytest.mark.django_db
def test_one_address_spraying_many_accounts_is_throttled(db):
    for n in range(attempts.LOGIN_PER_ADDRESS.free + 1):
        _login(Client(), f"user{n}@example.com", "wrong password", "198.51.100.11")
    User.objects.create_user(email="victim@example.com", password=PASSWORD)
    assert _login(Client(), "victim@example.com", PASSWORD, "198.51.100.11").status_code == 429


@pytest.mark.django_db
def test_admin_login_is_throttled_too(alice):
    alice.is_staff = True
    alice.save()
    client = Client()
    for _ in range(12):
        client.post(
            "/admin/login/",
            {"username": "alice@example.com", "password": "nope"},
            REMOTE_ADDR="198.51.100.12",
        )
    client.post(
        "/admin/login/",
        {"username": "alice@example.com", "password": PASSWORD},
        REMOTE_ADDR="198.51.100.12",
    )
    assert "_auth_user_id" not in client.session


@pytest.mark.django_db
def test_password_reset_mails_an_address_a_few_times_then_stops_quietly(alice):
    responses = [
        Client().post(
            "/accounts/password_reset/",
            {"email": "alice@example.com"},
            REMOTE_ADDR=f"192.0.2.{n + 40}",
        )
        for n in range(6)
    ]
    assert {r.status_code for r in responses} == {302}
    assert len(mail.outbox) == attempts.RESET_PER_EMAIL.free + 1


@pytest.mark.django_db
def test_password_reset_from_one_address_is_refused_past_its_limit(alice):
    client = Client()
    statuses = [
        client.post(
            "/accounts/password_reset/",
            {"email": f"someone{n}@example.com"},
            REMOTE_ADDR="198.51.100.13",
        ).status_code
        for n in range(attempts.RESET_PER_ADDRESS.free + 2)
    ]
    assert statuses[: attempts.RESET_PER_ADDRESS.free] == [302] * attempts.RESET_PER_ADDRESS.free
    assert statuses[-1] == 429


@pytest.mark.django_db
def test_signup_from_one_address_is_refused_past_its_limit(db):
    client = Client()
    statuses = [
        client.post(
            "/accounts/signup/", {"email": f"new{n}@example.com"}, REMOTE_ADDR="198.51.100.14"
        ).status_code
        for n in range(attempts.SIGNUP_PER_ADDRESS.free + 2)
    ]
    assert statuses[: attempts.SIGNUP_PER_ADDRESS.free] == [200] * attempts.SIGNUP_PER_ADDRESS.free
    assert statuses[-1] == 429


@pytest.mark.django_db
def test_signup_mails_an_address_a_few_times_then_stops_quietly(db):
    responses = [
        Client().post(
            "/accounts/signup/", {"email": "flooded@example.com"}, REMOTE_ADDR=f"192.0.2.{n + 60}"
        )
        for n in range(6)
    ]
    assert {r.status_code for r in responses} == {200}
    assert len({r.content for r in responses}) == 1
    assert len(mail.outbox) == attempts.SIGNUP_PER_EMAIL.free + 1


# --- 4. no redirect off-site after signup ---------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    "next_url",
    ["https://evil.example/", "//evil.example/", "https:evil.example", "\\\\evil.example"],
)
def test_signup_does_not_redirect_to_another_site(next_url):
    client = Client()
    client.post(f"/accounts/signup/?next={next_url}", {"email": "fresh@example.com"})
    created = client.post(_link("/signup/confirm/"), {"password": "a long enough passphrase"})
    assert created.status_code == 302
    assert created["Location"] == "/"


@pytest.mark.django_db
def test_switching_organization_does_not_redirect_to_another_site(alice, org_a):
    client = Client()
    client.force_login(alice)
    response = client.post(
        "/organizations/switch/", {"organization": org_a.pk, "next": "https://evil.example/"}
    )
    assert response.status_code == 302 and response["Location"] == "/"


# --- 5. signup says nothing about whether an address has an account -------------------------


@pytest.mark.django_db
def test_signup_answers_the_same_for_a_taken_and_a_free_address(alice):
    taken = Client().post("/accounts/signup/", {"email": "alice@example.com"})
    free = Client().post("/accounts/signup/", {"email": "free@example.com"})
    assert taken.status_code == free.status_code == 200
    assert taken.content.replace(b"alice@example.com", b"X") == free.content.replace(
        b"free@example.com", b"X"
    )
    # Only the address's owner learns which case it was.
    to_alice, to_free = mail.outbox
    assert to_alice.to == ["alice@example.com"] and "already has an account" in to_alice.body
    assert "/signup/confirm/" not in to_alice.body
    assert to_free.to == ["free@example.com"] and "/signup/confirm/" in to_free.body
    alice.refresh_from_db()
    assert alice.check_password(PASSWORD)


@pytest.mark.django_db
def test_signup_link_cannot_be_forged_or_reused(alice):
    client = Client()
    assert client.get("/accounts/signup/confirm/not-a-token/").status_code == 400
    client.post("/accounts/signup/", {"email": "once@example.com"})
    link = _link("/signup/confirm/")
    assert client.post(link, {"password": "a long enough passphrase"}).status_code == 302
    again = Client().post(link, {"password": "another long passphrase"})
    assert again.status_code == 409
    assert User.objects.get(email="once@example.com").check_password("a long enough passphrase")
