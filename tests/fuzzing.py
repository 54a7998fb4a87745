"""What the schema fuzz tests share: the fuzzed organization, kept fit for the next
operation's cases, and their failures reported once each."""

from __future__ import annotations

import httpx

from accounts.models import Organization, User
from accounts.services import api_key_create, organization_settings_set
from billing import pricing
from billing import services as billing


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
