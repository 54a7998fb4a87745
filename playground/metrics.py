"""Prometheus metrics at /metrics: sandboxes by provider and state, Docker engines, executions,
plus the counters and latency histogram kept in common/metrics.py. Gauges are read from the
database at scrape time.

Access: a staff session, or `Authorization: Bearer $SANDPIT_METRICS_TOKEN`. A wrong token
answers 401; no credentials answer 404, so the endpoint's existence is not advertised.
"""

from __future__ import annotations

import hmac
import logging

from django.conf import settings
from django.db import DatabaseError, transaction
from django.db.models import Count, Sum
from django.http import Http404, HttpRequest, HttpResponse

from billing.models import UsageDaily, UsageEvent
from common.metrics import counter_lines, label_text, latency_lines, number_text, read_store
from sandboxes.engines import engine_reports
from sandboxes.models import Sandbox, SandboxState
from sandboxes.providers import configured_provider_names

logger = logging.getLogger(__name__)


def _sandbox_lines() -> list[str]:

    counts: dict[tuple[str, str], int] = {
        (provider, state): 0
        for provider in configured_provider_names()
        for state in SandboxState.values
        if state != SandboxState.DESTROYED
    }
    rows = (
        Sandbox.objects.exclude(state=SandboxState.DESTROYED)
        .values("provider", "state")
        .annotate(n=Count("id"))
    )
    for row in rows:
        counts[(row["provider"], row["state"])] = row["n"]
    lines = [
        "# HELP sandpit_sandboxes Sandboxes not yet destroyed, by provider and state.",
        "# TYPE sandpit_sandboxes gauge",
    ]
    for (provider, state), n in sorted(counts.items()):
        lines.append(
            f"sandpit_sandboxes{label_text([('provider', provider), ('state', state)])} {n}"
        )
    return lines


def _engine_lines() -> list[str]:
    """Each Docker engine: up, running sandboxes, memory reserved and planned with."""
    try:
        reports = engine_reports()
    except Exception:  # noqa: BLE001 - a scrape must not fail for one component
        logger.warning("could not read the docker engines for /metrics", exc_info=True)
        return []
    gauges = [
        ("up", "Whether the Docker engine answers (1) or not (0).", lambda r: int(r.status.ok)),
        ("sandboxes", "Sandboxes running on the Docker engine.", lambda r: r.status.sandboxes),
        (
            "memory_reserved_bytes",
            "Memory limits of the sandboxes running on the Docker engine, added up.",
            lambda r: r.status.memory_reserved_mb * 2**20,
        ),
        (
            "memory_capacity_bytes",
            "Memory placement plans with on the Docker engine.",
            lambda r: r.status.memory_capacity_mb * 2**20,
        ),
    ]
    lines: list[str] = []
    for suffix, help_text, value in gauges if reports else []:
        metric = f"sandpit_docker_engine_{suffix}"
        lines += [f"# HELP {metric} {help_text}", f"# TYPE {metric} gauge"]
        for report in reports:
            labels = label_text([("engine", report.status.name)])
            lines.append(f"{metric}{labels} {number_text(value(report))}")
    return lines


def _execution_lines() -> list[str]:
    """Executions from the billing ledger: the daily rollup plus ledger rows not yet rolled
    up (both cheap: a few rollup rows, and a partial index on the unaggregated ledger).
    Omitted when the billing tables cannot be read."""
    try:
        with transaction.atomic():
            rolled = UsageDaily.objects.aggregate(n=Sum("count"))["n"] or 0
            pending = UsageEvent.objects.filter(aggregated_at__isnull=True).count()
    except DatabaseError:
        return []
    return [
        "# HELP sandpit_executions_total Metered executions recorded in the billing ledger.",
        "# TYPE sandpit_executions_total counter",
        f"sandpit_executions_total {rolled + pending}",
    ]


def render_metrics() -> str:
    """The whole exposition, Prometheus text format 0.0.4."""
    counters, latency_raw = read_store()
    lines = _sandbox_lines() + _engine_lines() + _execution_lines() + counter_lines(counters)
    lines += latency_lines(latency_raw)
    return "\n".join(lines) + "\n"


def _authorized(request: HttpRequest) -> bool:
    """True for a staff session or the metrics token; raises Http404 when no credentials
    are offered; False (→ 401) for a wrong or unconfigured token."""
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated and user.is_staff:
        return True
    header = request.headers.get("Authorization", "")
    if not header:
        raise Http404
    token = str(getattr(settings, "METRICS_TOKEN", "") or "")
    scheme, _, offered = header.partition(" ")
    return bool(
        token
        and scheme.lower() == "bearer"
        and hmac.compare_digest(offered.strip().encode(), token.encode())
    )


def metrics_view(request: HttpRequest) -> HttpResponse:
    if request.method not in {"GET", "HEAD"}:
        return HttpResponse(status=405, headers={"Allow": "GET, HEAD"})
    if not _authorized(request):
        return HttpResponse(
            "unauthorized\n",
            status=401,
            content_type="text/plain",
            headers={"WWW-Authenticate": 'Bearer realm="metrics"'},
        )
    return HttpResponse(render_metrics(), content_type="text/plain; version=0.0.4; charset=utf-8")
