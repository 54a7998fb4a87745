"""Liveness and readiness: database, channel layer, Celery broker, each sandbox provider."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

from playground.celery import app
from sandboxes.engines import engine_reports
from sandboxes.providers import configured_provider_names, get_provider


def _timed(check: Callable[[], object]) -> dict[str, Any]:
    started = time.perf_counter()
    try:
        detail = check()
        ok = True
    except Exception as exc:  # noqa: BLE001 - a health check reports every failure
        detail, ok = f"{type(exc).__name__}: {exc}", False
    return {
        "status": "ok" if ok else "down",
        "detail": detail,
        "latency_ms": round((time.perf_counter() - started) * 1000, 2),
    }


def _check_database() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return connection.vendor


def _check_channel_layer() -> str:
    layer = get_channel_layer()
    if layer is None:
        raise RuntimeError("no channel layer is configured (CHANNEL_LAYERS)")
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.send)(channel, {"type": "health.ping"})
    message = async_to_sync(layer.receive)(channel)
    assert message["type"] == "health.ping"
    return type(layer).__name__


def _check_broker() -> str:
    with app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1, timeout=2)
        return conn.transport_cls if isinstance(conn.transport_cls, str) else conn.as_uri()


def provider_health_report() -> dict[str, dict[str, Any]]:
    report: dict[str, dict[str, Any]] = {}
    for name in configured_provider_names():

        def check(name: str = name) -> str:
            health = get_provider(name).health()
            if not health.ok:
                raise RuntimeError(health.detail)
            return health.detail

        report[f"provider:{name}"] = _timed(check)
    return report


def docker_engine_report() -> dict[str, Any]:
    """Each Docker engine's state (sandboxes/engines.py); {} without the docker provider."""
    try:
        return {report.status.name: report.as_json() for report in engine_reports()}
    except Exception as exc:  # noqa: BLE001 - a health page reports every failure
        return {"error": {"status": "down", "detail": f"{type(exc).__name__}: {exc}"}}


@require_GET
def live(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


@require_GET
def ready(request: HttpRequest) -> JsonResponse:
    components = {
        "database": _timed(_check_database),
        "channel_layer": _timed(_check_channel_layer),
        "broker": _timed(_check_broker),
    }
    components.update(provider_health_report())
    healthy = all(c["status"] == "ok" for c in components.values())
    body: dict[str, Any] = {"status": "ok" if healthy else "down", "components": components}
    engines = docker_engine_report()
    if engines:
        # Not part of the verdict: one engine down still serves (placement avoids it);
        # provider:docker is down only when none answers.
        body["docker_engines"] = engines
    return JsonResponse(body, status=200 if healthy else 503)
