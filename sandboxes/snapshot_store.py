"""Where snapshot archives live on the host, and their removal with their rows.

An archive is `SANDPIT_SNAPSHOT_DIR/<organization id>/<snapshot id>.tar.zst`, written by the
provider (sandboxes/providers/snapshot_archive.py). A snapshot's file goes with its row,
however the row goes: deleted through the API, with its organization (a cascade), or, for
the reaper's 'archive' snapshots, with its sandbox (`archives_drop`). A post_delete receiver
removes the file once the deleting transaction commits, so a rolled-back delete keeps it.
This module imports no sandbox service, so the services may call it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models.signals import post_delete
from django.dispatch import receiver

from common.rows import RowLookup

from .models import Sandbox, Snapshot
from .providers.snapshot_archive import remove_archive

logger = logging.getLogger(__name__)

ARCHIVE = "archive"
"""Snapshot.kind of the reaper's snapshot of a long-paused sandbox (resume starts from it)."""
MANUAL = "manual"
FORK = "fork"
"""Snapshot.kind of the passing snapshot a fork is made from (removed once forked)."""


def snapshot_path(organization_id: int, snapshot_id: str) -> Path:
    """The archive file of snapshot `snapshot_id` (not created here)."""
    return Path(settings.SANDPIT_SNAPSHOT_DIR) / str(organization_id) / f"{snapshot_id}.tar.zst"


def archives_drop(sandbox: Sandbox) -> int:
    """Delete the reaper's archive snapshots of `sandbox` (it was destroyed: nothing will
    resume from them). Manual snapshots stay. Returns how many went."""
    # Every destroy asks, and few sandboxes were ever archived: the ORM's delete selects
    # the rows first (its post_delete receiver needs them), a third of a destroy's CPU.
    if SNAPSHOT_OF_SANDBOX_BY_KIND.get(sandbox.pk, ARCHIVE) is None:
        return 0
    deleted, _ = Snapshot.objects.filter(sandbox=sandbox, kind=ARCHIVE).delete()
    return deleted


SNAPSHOT_OF_SANDBOX_BY_KIND = RowLookup(Snapshot, "sandbox", "kind")
"""One of a sandbox's snapshots of a kind, if any (common/rows.py)."""


@receiver(post_delete, sender=Snapshot, dispatch_uid="sandpit-snapshot-files")
def _remove_file(sender: Any, instance: Snapshot, **kwargs: Any) -> None:
    location = instance.location
    if not location:
        return

    def remove() -> None:
        try:
            remove_archive(location)
        except OSError:
            logger.exception("could not remove snapshot archive %s", location)

    transaction.on_commit(remove)
