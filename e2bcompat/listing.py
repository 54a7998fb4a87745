"""GET /v2/sandboxes (and /sandboxes): E2B's list query, read strictly, and its pages.

The SDK's `Sandbox.list(query=SandboxQuery(...), limit=..., order=...)` sends `metadata`,
`state`, `startedAfter`, `template`, `order`, `limit` and `nextToken`, and pages on the
`x-next-token` answer header. Pages are keyset pages over (created_at, id): a sandbox
created or destroyed between two pages neither repeats nor shifts the others.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Q, QuerySet
from django.db.models.functions import Coalesce
from django.http import QueryDict
from rest_framework import serializers

from accounts.authentication import Principal
from common.errors import ApplicationError
from sandboxes.models import Sandbox, SandboxState
from sandboxes.selectors import sandboxes_for_org

from . import translate

STATES_PATTERN = "^((running|paused)(,(running|paused))*)?$"
MAX_PAGE = 100
"""E2B's largest page, and the v2 list's page when no `limit` is given."""


class ListQuery(serializers.Serializer[Any]):
    metadata = serializers.CharField(required=False, allow_blank=True)
    state = serializers.RegexField(STATES_PATTERN, required=False, allow_blank=True)
    startedAfter = serializers.DateTimeField(required=False)  # noqa: N815 - E2B's name
    template = serializers.CharField(required=False, allow_blank=True)
    order = serializers.ChoiceField(["asc", "desc"], required=False)
    limit = serializers.IntegerField(required=False, min_value=1, max_value=MAX_PAGE)
    nextToken = serializers.CharField(required=False)  # noqa: N815 - E2B's name


NOT_BLANK = ("startedAfter", "order", "limit", "nextToken")


@dataclass(frozen=True)
class Listing:
    states: frozenset[str]
    metadata: dict[str, str]
    started_after: datetime | None
    template: str | None
    ascending: bool
    limit: int | None
    after: tuple[str, str] | None


def _token(sandbox: Sandbox) -> str:
    raw = json.dumps([sandbox.created_at.isoformat(), sandbox.id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _position(token: str) -> tuple[str, str]:
    """(created_at, id) of the last sandbox of the previous page."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        created_at, sandbox_id = json.loads(raw)
        datetime.fromisoformat(created_at)
    except (binascii.Error, ValueError, TypeError):
        raise ApplicationError("nextToken is not one this server answered.") from None
    if not isinstance(sandbox_id, str):
        raise ApplicationError("nextToken is not one this server answered.")
    return created_at, sandbox_id


def listing_read(params: QueryDict, *, paged: bool) -> Listing:
    """The list query of `params`; 400 for anything E2B's API would not take. `paged`: the
    v2 list (a page of at most 100); the v1 list answers every sandbox at once."""
    # DRF reads an empty query value as an absent one (form data's rule): limit= would be
    # the default page, not the client's mistake.
    for name in NOT_BLANK:
        if params.get(name) == "":
            raise ApplicationError(f"{name} is empty.")
    query = ListQuery(data=params)
    query.is_valid(raise_exception=True)
    data = query.validated_data
    limit = data.get("limit", MAX_PAGE) if paged else data.get("limit")
    return Listing(
        states=frozenset(data["state"].split(",")) if data.get("state") else frozenset({"running"}),
        metadata=translate.metadata_filter(data.get("metadata")),
        started_after=data.get("startedAfter"),
        template=data.get("template") or None,
        ascending=data.get("order") == "asc",
        limit=limit,
        after=_position(data["nextToken"]) if data.get("nextToken") else None,
    )


def _ordered(principal: Principal, listing: Listing) -> QuerySet[Sandbox]:
    states = [SandboxState.RUNNING] if "running" in listing.states else []
    if "paused" in listing.states:
        states += list(translate.HELD_STATES)
    found = sandboxes_for_org(principal.organization).filter(state__in=states)
    if listing.started_after is not None:
        found = found.annotate(began=Coalesce("started_at", "created_at")).filter(
            began__gte=listing.started_after
        )
    if listing.after is not None:
        created_at, sandbox_id = listing.after
        later = "gt" if listing.ascending else "lt"
        found = found.filter(
            Q(**{f"created_at__{later}": created_at})
            | Q(created_at=created_at, **{f"id__{later}": sandbox_id})
        )
    order = ("created_at", "id") if listing.ascending else ("-created_at", "-id")
    return found.order_by(*order)


def sandboxes_listed(
    principal: Principal, listing: Listing
) -> tuple[list[dict[str, Any]], str | None]:
    """A page of E2B's ListedSandbox for `principal` (a token: its own sandbox only), and the
    token of the next page (None: this was the last)."""
    page: list[dict[str, Any]] = []
    last: Sandbox | None = None
    for sandbox in _ordered(principal, listing).iterator():
        if not principal.allows_sandbox(sandbox.id):
            continue
        listed = translate.sandbox_listed(sandbox)
        if any(listed["metadata"].get(k) != v for k, v in listing.metadata.items()):
            continue
        if listing.template is not None and not translate.template_matches(
            listing.template, listed["templateID"]
        ):
            continue
        if last is not None and listing.limit is not None and len(page) == listing.limit:
            return page, _token(last)
        page.append(listed)
        last = sandbox
    return page, None
