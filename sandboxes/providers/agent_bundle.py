"""The in-sandbox agent (sandboxes/agent/) as one zip file that ``python3 -I -S`` runs.

Every provider that runs the agent ships this same file: the local provider copies it
where every jail uid can read it and bind-mounts it read-only; the Docker image carries
it unpacked and compiled by its own Python at ``image_path()``, whose name holds the
bundle's content hash, so a provider never drives an agent other than its own (an image
built from other sources lacks the file and fails with a rebuild hint). Byte-for-byte reproducible: fixed timestamps, sorted
entries, no compression (zipimport then needs no zlib and reads the sources as is).

Standard library only, so scripts/build-sandbox-image.sh can run it as a script:
``python3 sandboxes/providers/agent_bundle.py DIR`` writes ``DIR/<file name>``;
``--name`` prints the file name.
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import sys
import zipfile
from pathlib import Path

AGENT_DIR = Path(__file__).resolve().parents[1] / "agent"
PACKAGE = "sandpit_agent"
"""The agent package's name inside the bundle (its modules import each other relatively)."""
_MAIN = (
    # Run as a script from the unpacked bundle (the image), `-I` leaves the script's
    # directory off sys.path; run as a zip file, the zip is on it already.
    "import sys\n\n"
    "sys.path.insert(0, __file__.rpartition('/')[0])\n"
    f"from {PACKAGE}.server import main\n\nmain()\n"
)
_EPOCH = (1980, 1, 1, 0, 0, 0)


@functools.cache
def bundle() -> bytes:
    """The zip file's bytes (cached: the sources do not change under a running server)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        entries = [("__main__.py", _MAIN.encode())]
        entries += [
            (f"{PACKAGE}/{path.name}", path.read_bytes()) for path in sorted(AGENT_DIR.glob("*.py"))
        ]
        for name, data in entries:
            info = zipfile.ZipInfo(name, _EPOCH)
            info.external_attr = 0o644 << 16
            archive.writestr(info, data)
    return buffer.getvalue()


def file_name() -> str:
    """``agent-<first 12 hex digits of the bundle's SHA-256>.pyz``."""
    return f"agent-{hashlib.sha256(bundle()).hexdigest()[:12]}.pyz"


IMAGE_DIR = "/opt/sandpit"


def image_path() -> str:
    """The script that starts this exact agent in the sandbox image: the bundle unpacked,
    its modules compiled (Python never caches what it compiles from a zip file, and
    compiling the agent was about half of its start-up, so of every docker sandbox's
    create); run as a script, not as a directory, which would import runpy."""
    return f"{IMAGE_DIR}/{file_name().removesuffix('.pyz')}/__main__.py"


def install(target: Path) -> None:
    """Write the bundle at `target`, world-readable (jails run as other host uids),
    atomically and only when it differs."""
    data = bundle()
    if target.exists() and target.read_bytes() == data:
        return
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_bytes(data)
    os.chmod(tmp, 0o644)
    os.replace(tmp, target)


if __name__ == "__main__":
    if sys.argv[1] == "--name":
        print(file_name())
    else:
        install(Path(sys.argv[1]) / file_name())
        print(file_name())
