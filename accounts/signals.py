"""Signals of the accounts app that Django's model signals do not cover."""

from __future__ import annotations

from django.dispatch import Signal

organizations_changed = Signal()
"""Sent (with `using`) after a queryset update or delete changed organizations' rows, which
send no post_save or post_delete (accounts.models.OrganizationQuerySet): processes that keep
an organization's row between requests (sandboxes/row_cache.py) listen to all three."""
