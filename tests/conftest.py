"""Shared fixtures: organizations (alice's, bob on her team, charlie the outsider) and API clients."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from rest_framework.test import APIClient

from accounts import attempts
from accounts.models import Membership, Organization, Role, User
from accounts.services import api_key_create
from sandboxes.providers.local import jail_cgroups
from tests.requirements import JAIL_ROOTS_MADE


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (scripts/test.sh runs a worker per core) each worker is an
    installation of its own, with its own jail root. Each worker has its own test database,
    and an installation treats the jails, containers and billing keys it finds under its
    name as its own: sharing one, a worker's reconciler or pool would take the other's
    sandboxes for orphans and destroy them. Servers the tests start inherit the environment."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return
    installation = f"{django_settings.SANDPIT_INSTALLATION}-{worker}"
    root = Path(f"{django_settings.SANDPIT_LOCAL_ROOT}-{worker}")
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o711)  # noqa: S103 - jails run as other uids, which must pass through
    # Django read the environment before this hook: both are set.
    os.environ["SANDPIT_INSTALLATION"] = django_settings.SANDPIT_INSTALLATION = installation
    os.environ["SANDPIT_LOCAL_ROOT"] = str(root)
    django_settings.SANDPIT_LOCAL_ROOT = root
    # Redis is shared too: metrics counters, rate limits and cached keys live under the
    # prefix, and one worker's counts must not land in another's (the reaped counter did).
    if "KEY_PREFIX" in django_settings.CACHES.get("default", {}):
        prefix = f"{django_settings.CACHES['default']['KEY_PREFIX']}-{worker}"
        os.environ["SANDPIT_REDIS_PREFIX"] = prefix
        django_settings.CACHES["default"]["KEY_PREFIX"] = prefix
        layer = django_settings.CHANNEL_LAYERS["default"].get("CONFIG", {})
        if "prefix" in layer:
            layer["prefix"] = prefix


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remove the cgroup parents of the jail roots this session made, where no jail is
    left in them (each root has its own, see sandboxes/providers/local/jail.py)."""
    unified = jail_cgroups.unified_cgroup()
    for root in JAIL_ROOTS_MADE:
        scope = jail_cgroups.cgroup_scope(root)
        jail_cgroups.cgroup_scope_remove(jail_cgroups.cgroup_bases(scope))
        if unified is not None:  # a provider forced to v2 (test_local_cgroup_v2.py)
            jail_cgroups.cgroup_scope_remove({jail_cgroups.UNIFIED: f"{unified}/sandpit/{scope}"})


@pytest.fixture(autouse=True)
def _fast_tests(settings, tmp_path_factory):  # type: ignore[no-untyped-def]
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _isolated_auth_attempts(monkeypatch):  # type: ignore[no-untyped-def]
    """Login/signup/reset counters of one test must not throttle another (they live in the
    shared Redis and would outlast the test run)."""
    monkeypatch.setattr(attempts, "NAMESPACE", f"test-auth-attempts-{uuid.uuid4().hex[:12]}")


@pytest.fixture
def alice(db) -> User:  # type: ignore[no-untyped-def]
    return User.objects.create_user(email="alice@example.com", password="correct horse battery")


@pytest.fixture
def bob(db) -> User:  # type: ignore[no-untyped-def]
    return User.objects.create_user(email="bob@example.com", password="correct horse battery")


@pytest.fixture
def charlie(db) -> User:  # type: ignore[no-untyped-def]
    return User.objects.create_user(email="charlie@example.com", password="correct horse battery")


@pytest.fixture
def org_a(alice, bob) -> Organization:  # type: ignore[no-untyped-def]
    org = Organization.objects.create(name="Org A", slug="org-a", plan="premium")
    Membership.objects.create(user=alice, organization=org, role=Role.OWNER)
    Membership.objects.create(user=bob, organization=org, role=Role.MEMBER)
    return org


@pytest.fixture
def org_b(charlie) -> Organization:  # type: ignore[no-untyped-def]
    org = Organization.objects.create(name="Org B", slug="org-b", plan="premium")
    Membership.objects.create(user=charlie, organization=org, role=Role.OWNER)
    return org


@pytest.fixture
def key_a(org_a, alice) -> str:  # type: ignore[no-untyped-def]
    return api_key_create(organization=org_a, name="key a", created_by=alice).secret


@pytest.fixture
def key_b(org_b, charlie) -> str:  # type: ignore[no-untyped-def]
    return api_key_create(organization=org_b, name="key b", created_by=charlie).secret


def _client(secret: str | None = None) -> APIClient:
    client = APIClient()
    if secret:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


@pytest.fixture
def api_a(key_a) -> APIClient:  # type: ignore[no-untyped-def]
    return _client(key_a)


@pytest.fixture
def api_b(key_b) -> APIClient:  # type: ignore[no-untyped-def]
    return _client(key_b)


@pytest.fixture
def anon_api() -> APIClient:
    return _client()


def assert_error(response, status: int, code: str | None = None) -> dict:  # type: ignore[no-untyped-def]
    """The one error shape, with the expected status (and code when given)."""
    assert response.status_code == status, (response.status_code, response.content[:500])
    body = response.json()
    assert set(body) == {"error"}, body
    assert isinstance(body["error"]["code"], str) and body["error"]["code"]
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    if code is not None:
        assert body["error"]["code"] == code, body
    return body["error"]


@pytest.fixture(scope="session")
def local_sandboxes_root() -> Iterator[Path]:
    """One root for the session's local providers: the files a provider shares between its
    jails (/etc versions, the launcher it compiles, the agent) are built by the first and
    found by the others, instead of ~0.25 s of building per test."""
    root = Path(tempfile.mkdtemp(prefix="sp-"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def local_sandboxes(settings, local_sandboxes_root):  # type: ignore[no-untyped-def]
    """The real local (bubblewrap) provider, a new one per test; everything destroyed after."""
    from sandboxes.providers import get_provider, reset_providers

    settings.SANDPIT_PROVIDERS = ["local"]
    settings.SANDPIT_DEFAULT_PROVIDER = "local"
    settings.SANDPIT_LOCAL_ROOT = local_sandboxes_root
    settings.SANDPIT_LOCAL_WARM_POOL = 0  # a provider per test; the pool has its own tests
    reset_providers()
    provider = get_provider("local")
    yield provider
    for handle in provider.list_sandboxes():
        provider.destroy(handle.provider_id)
    reset_providers()


@pytest.fixture
def sandbox_a(api_a, local_sandboxes) -> dict:  # type: ignore[no-untyped-def]
    response = api_a.post("/api/v1/sandboxes", {}, format="json")
    assert response.status_code == 201, response.content
    return response.json()
