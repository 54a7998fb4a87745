"""Fan-out of sandbox events (status, ports, files) to the sockets subscribed to a sandbox."""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

logger = logging.getLogger(__name__)


def sandbox_events_group(sandbox_id: str) -> str:
    """The channel-layer group of a sandbox's events sockets."""
    return f"sandbox-events.{sandbox_id}"


def sandbox_event_broadcast(sandbox_id: str, event: dict[str, Any]) -> None:
    """Send an event to everyone subscribed to the sandbox; never fails the caller."""
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(
            sandbox_events_group(sandbox_id), {"type": "sandbox.event", "event": event}
        )
    except Exception:  # noqa: BLE001 - a broadcast must not break the operation
        logger.warning("could not broadcast sandbox event", exc_info=True)
