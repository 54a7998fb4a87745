"""End-to-end fixtures: one daphne serving the test database and one headless Chromium per
module. Each test gets a fresh browser context (its own cookies) and its own users."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests.requirements import jail_root, missing_part
from tests.servers import free_port, server_start


@pytest.fixture(autouse=True, scope="module")
def _allow_orm_beside_playwright():  # type: ignore[no-untyped-def]
    # Playwright's sync API runs an event loop in this thread; the ORM calls the tests make
    # (creating users) are still plain synchronous code. Scoped to the browser modules only.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        yield


ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
PASSWORD = "correct horse battery"


def _database_url(db: dict) -> str:
    user = db.get("USER") or "postgres"
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    host = db.get("HOST") or "127.0.0.1"
    port = db.get("PORT") or 5432
    return f"postgres://{user}{password}@{host}:{port}/{db['NAME']}"


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix):  # type: ignore[no-untyped-def]
    """Run alone, the browser tests use their own test database, so a concurrent pytest run
    on `test_sandpit` cannot drop it from under the daphne subprocess."""
    from django.conf import settings

    settings.DATABASES["default"].setdefault("TEST", {})
    settings.DATABASES["default"]["TEST"]["NAME"] = "test_sandpit_browser"


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    path = Path(
        os.environ.get("SANDPIT_ARTIFACTS") or ROOT / "var" / "test-artifacts" / "screenshots"
    )
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def server(request, django_db_setup, django_db_blocker, tmp_path_factory):  # type: ignore[no-untyped-def]
    """daphne in a subprocess on a free loopback port, on the test database; previews on
    `<port>-<id>.localhost:<port>` as under `make run`. A module may add environment
    variables in SERVER_ENV."""
    from django.conf import settings

    db = settings.DATABASES["default"]
    if "postgresql" not in db["ENGINE"]:
        missing_part("browser tests need DATABASE_URL pointing at Postgres")
    port = free_port()
    root = jail_root("browser-sandboxes")
    prefix = f"sandpit-browser-{os.getpid()}"
    env = {
        **os.environ,
        "DATABASE_URL": _database_url(db),
        "REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/15"),
        "SANDPIT_PROVIDERS": "local",
        "SANDPIT_DEFAULT_PROVIDER": "local",
        "SANDPIT_LOCAL_ROOT": str(root),
        "SANDPIT_REDIS_PREFIX": prefix,
        "SANDPIT_PASSWORD_HASHERS": "django.contrib.auth.hashers.MD5PasswordHasher",
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
        "DJANGO_SETTINGS_MODULE": "playground.settings",
        "SANDPIT_PREVIEW_DOMAIN": f"localhost:{port}",
        **getattr(request.module, "SERVER_ENV", {}),
    }
    log_path = root / "daphne.log"
    log = open(log_path, "wb")  # noqa: SIM115 - closed in the teardown below
    proc = server_start(port, env, log, module="daphne")
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health/live", timeout=1) as response:  # noqa: S310
                if response.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            log.close()
            raise RuntimeError(f"daphne did not start:\n{log_path.read_text()[-4000:]}")
        time.sleep(0.2)
    yield url
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()
    _destroy_leftover_sandboxes(root)
    _drop_redis_keys(env["REDIS_URL"], prefix)


def _destroy_leftover_sandboxes(root: Path) -> None:
    from django.test import override_settings

    from sandboxes.providers import get_provider, reset_providers

    with override_settings(SANDPIT_PROVIDERS=["local"], SANDPIT_LOCAL_ROOT=root):
        reset_providers()
        try:
            provider = get_provider("local")
            for handle in provider.list_sandboxes():
                provider.destroy(handle.provider_id)
        finally:
            reset_providers()


def _drop_redis_keys(url: str, prefix: str) -> None:
    try:
        import redis

        client = redis.Redis.from_url(url)
        keys = list(client.scan_iter(f"{prefix}*"))
        if keys:
            client.delete(*keys)
    except Exception:  # noqa: BLE001, S110 - best-effort cleanup
        pass


@pytest.fixture(scope="module")
def browser():  # type: ignore[no-untyped-def]
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        yield chromium
        chromium.close()


def new_page(browser, server: str, *, bypass_csp: bool):  # type: ignore[no-untyped-def]
    context = browser.new_context(
        base_url=server,
        viewport={"width": 1400, "height": 900},
        accept_downloads=True,
        bypass_csp=bypass_csp,
    )
    context.set_default_timeout(15000)
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.js_errors = errors  # type: ignore[attr-defined]
    return pg


@pytest.fixture
def page(browser, server):  # type: ignore[no-untyped-def]
    """A page for the end-to-end tests. They poll page state with wait_for_function, which
    Playwright compiles in the page (eval), so the app's CSP is bypassed here; the pages under
    their real CSP are tested in test_csp.py with `strict_page`."""
    pg = new_page(browser, server, bypass_csp=True)
    yield pg
    pg.context.close()


@pytest.fixture
def strict_page(browser, server):  # type: ignore[no-untyped-def]
    """A page under the app's own Content-Security-Policy (no wait_for_function on it)."""
    pg = new_page(browser, server, bypass_csp=False)
    yield pg
    pg.context.close()


@pytest.fixture
def org_owner(transactional_db):  # type: ignore[no-untyped-def]
    """alice, owner of a premium organization (terminals and previews are premium features)."""
    from accounts.models import Membership, Organization, Role, User

    user = User.objects.create_user(email="alice@example.com", password=PASSWORD)
    org = Organization.objects.create(
        name="Acme Labs", slug="acme", plan="premium", allow_network=False
    )
    Membership.objects.create(user=user, organization=org, role=Role.OWNER)
    return user


def login(page, email: str, password: str = PASSWORD) -> None:  # type: ignore[no-untyped-def]
    page.goto("/accounts/login/")
    page.fill("#id_username", email)
    page.fill("#id_password", password)
    with page.expect_navigation():
        page.click("button[type=submit]")
    assert "/accounts/login" not in page.url, page.locator("main").inner_text()
