"""What the schema fuzz tests share: the fuzzed organization, kept fit for the next
operation's cases, and their failures reported once each."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from django.db import connection
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from accounts.models import Organization, User
from accounts.services import api_key_create, organization_settings_set
from billing import pricing
from billing import services as billing
from tests.requirements import missing_part
from tests.servers import serving_test_database


class FuzzedOrganization:
    """The fuzzed organization's credentials and one running sandbox, renewed between
    operations: a generated case may revoke the key or destroy the sandbox."""

    def __init__(self, base: str, org: Organization, owner: User) -> None:
        self.base, self.org, self.owner = base, org, owner
        self.sandbox_id = ""

    def restore(self) -> None:
        """Undo what the organization-wide operations' cases may have set: a spending cap
        (every create refused 402), the plan, gVisor required (local creates refused 403)."""
        billing.organization_spending_cap_set(organization=self.org, cap_cents=None)
        billing.organization_plan_change(
            organization=self.org, plan=pricing.PREMIUM, requested_by=self.owner
        )
        organization_settings_set(
            actor=self.owner, organization=self.org, allow_network=False, docker_runtime=""
        )

    def key_secret(self) -> str:
        """A new API key's secret (a case may have revoked the last one)."""
        return api_key_create(organization=self.org, name="fuzz", created_by=self.owner).secret

    def key_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key_secret()}"}

    def running_sandbox(self, headers: dict[str, str]) -> str:
        if self.sandbox_id:
            got = httpx.get(f"{self.base}/api/v1/sandboxes/{self.sandbox_id}", headers=headers)
            if got.status_code == 200 and got.json()["state"] == "running":
                return self.sandbox_id
        self.destroy_all(headers)
        created = httpx.post(f"{self.base}/api/v1/sandboxes", json={}, headers=headers, timeout=60)
        assert created.status_code == 201, created.text
        self.sandbox_id = created.json()["id"]
        return self.sandbox_id

    def token_headers(self, sandbox_id: str) -> dict[str, str]:
        """A sandbox token for `sandbox_id` with every scope."""
        minted = httpx.post(
            f"{self.base}/api/v1/sandboxes/{sandbox_id}/tokens",
            json={"scopes": ["terminal", "files", "exec", "ports"], "ttl_s": 3600},
            headers=self.key_headers(),
            timeout=30,
        )
        assert minted.status_code == 201, minted.text
        return {"Authorization": f"Bearer {minted.json()['token']}"}

    def destroy_all(self, headers: dict[str, str]) -> None:
        listed = httpx.get(f"{self.base}/api/v1/sandboxes?limit=500", headers=headers, timeout=30)
        assert listed.status_code == 200, listed.text
        for sandbox in listed.json()["results"]:
            gone = httpx.delete(
                f"{self.base}/api/v1/sandboxes/{sandbox['id']}", headers=headers, timeout=60
            )
            assert gone.status_code in (200, 404), gone.text


def described(label: str, failures: list[BaseException]) -> dict[str, str]:
    """One entry per distinct failure title, with Schemathesis' report (the curl to replay)."""
    out: dict[str, str] = {}
    for failure in failures:
        parts = failure.exceptions if isinstance(failure, BaseExceptionGroup) else [failure]
        for part in parts:
            title = f"{label}: {getattr(part, 'title', type(part).__name__)}"
            out.setdefault(title, f"{title}\n{str(failure)[:2500]}")
    return out


EXAMPLES = int(os.environ.get("SANDPIT_FUZZ_EXAMPLES", "12"))
"""Cases per operation and principal; derandomized, so CI runs the same ones each time."""


def each_generated_case(operation: Any, check: Callable[[Any, bool], None]) -> None:
    """`check(case, aim_at_live)` on EXAMPLES of the operation's generated cases, valid and
    invalid (Schemathesis' negative data) alike; `aim_at_live`: half of them, to point the
    case's sandbox at the live one."""

    @given(
        case=st.one_of(
            operation.as_strategy(GenerationMode.POSITIVE),
            operation.as_strategy(GenerationMode.NEGATIVE),
        ),
        aim_at_live=st.booleans(),
    )
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.explicit, Phase.generate],
    )
    def run(case: Any, aim_at_live: bool) -> None:
        check(case, aim_at_live)

    run()


@contextmanager
def fuzzed_server(settings: Any, tmp_path: Path) -> Iterator[str]:
    """The product's web server on this test's PostgreSQL and Redis (local provider, a warm
    pool of two): its URL."""
    if not settings.REDIS_URL or connection.vendor != "postgresql":
        missing_part("needs PostgreSQL and REDIS_URL")
    with serving_test_database(
        settings,
        tmp_path / "server.log",
        module="playground.webserver",
        SANDPIT_LOCAL_WARM_POOL="2",
    ) as (base, _root):
        yield base


def successes_by_principal(statuses: dict[tuple[str, str], list[int]]) -> dict[str, int]:
    """2xx answers per principal, of the statuses kept per (principal, operation): what shows
    the cases reached past authentication and validation."""
    counted: dict[str, int] = {}
    for (who, _label), codes in statuses.items():
        counted[who] = counted.get(who, 0) + sum(code < 300 for code in codes)
    return counted
