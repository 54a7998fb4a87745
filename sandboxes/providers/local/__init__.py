"""The `local` provider: bubblewrap jails on this host (see provider.py)."""

from sandboxes.providers.local.provider import LocalProvider

__all__ = ["LocalProvider"]
