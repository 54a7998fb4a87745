"""``python3 -I -S <bundle>.pyz CONFIG_JSON`` or ``--relay SOCKET`` (see server.main)."""

from __future__ import annotations

from .server import main

main()
