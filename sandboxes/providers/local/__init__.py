"""The `local` provider: bubblewrap jails on this host (see provider.py)."""

from sandboxes.providers.local.provider import LocalProvider
from sandboxes.providers.local.wire import LocalPortStream, LocalPtySession, LocalRelayPtySession

__all__ = ["LocalPortStream", "LocalProvider", "LocalPtySession", "LocalRelayPtySession"]
