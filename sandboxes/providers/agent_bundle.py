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
import subprocess
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


def install(target: Path, python: str | None = None) -> None:
    """Write the bundle at `target`, world-readable (jails run as other host uids),
    atomically and only when it differs. With `python`, the bundle compiled by that
    interpreter (see `compiled`)."""
    data = bundle() if python is None else compiled(python, target.parent)
    if target.exists() and target.read_bytes() == data:
        return
    # Per process: several web processes may install at once.
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.chmod(tmp, 0o644)
    os.replace(tmp, target)


# Run by the interpreter that will run the agent: reads the bundle on stdin, writes it back
# with `<module>.pyc` beside each `<module>.py` (zipimport prefers those). Unchecked-hash
# pycs: zipimport would otherwise compare each with its source's zip timestamp.
_COMPILE = """
import io, os, py_compile, sys, tempfile, zipfile
src = zipfile.ZipFile(io.BytesIO(sys.stdin.buffer.read()))
out_buffer = io.BytesIO()
out = zipfile.ZipFile(out_buffer, "w", zipfile.ZIP_STORED)
with tempfile.TemporaryDirectory() as tmp:
    for info in src.infolist():
        data = src.read(info)
        out.writestr(info, data)
        if "/" not in info.filename or not info.filename.endswith(".py"):
            continue
        path = os.path.join(tmp, info.filename.replace("/", "_"))
        with open(path, "wb") as f:
            f.write(data)
        pyc = py_compile.compile(
            path, cfile=path + "c", dfile=sys.argv[1] + "/" + info.filename, doraise=True,
            invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
        )
        compiled = zipfile.ZipInfo(info.filename + "c", info.date_time)
        compiled.external_attr = info.external_attr
        with open(pyc, "rb") as f:
            out.writestr(compiled, f.read())
out.close()
sys.stdout.buffer.write(out_buffer.getvalue())
"""


def compiled(python: str, cache_dir: Path, shown_as: str = "/opt/sandpit/agent.pyz") -> bytes:
    """The bundle plus its modules compiled by `python` (the interpreter the agent runs
    under), so an agent starting from the zip file need not compile itself: about 70% of
    its start-up's CPU here (77 ms -> 20 ms), paid by every local sandbox and warm jail.
    Another interpreter (a template's root file system) finds pycs of a foreign magic
    number and compiles the sources, as before. Cached in `cache_dir` by bundle and
    interpreter; any failure to compile gives the plain bundle."""
    data = bundle()
    try:
        info = os.stat(python)
    except OSError:
        return data
    key = hashlib.sha256(
        data + f"{os.path.realpath(python)}:{info.st_mtime_ns}:{info.st_size}".encode()
    ).hexdigest()[:16]
    cached = cache_dir / f"agent-compiled-{key}.pyz"
    try:
        return cached.read_bytes()
    except OSError:
        pass
    try:
        done = subprocess.run(
            [python, "-I", "-S", "-c", _COMPILE, shown_as],
            input=data,
            capture_output=True,
            timeout=60,
            check=True,
        )
        zipfile.ZipFile(io.BytesIO(done.stdout)).testzip()
    except (OSError, subprocess.SubprocessError, zipfile.BadZipFile):
        return data
    tmp = cached.with_name(f".{cached.name}.{os.getpid()}.tmp")
    tmp.write_bytes(done.stdout)
    os.replace(tmp, cached)
    return done.stdout


if __name__ == "__main__":
    if sys.argv[1] == "--name":
        print(file_name())
    else:
        install(Path(sys.argv[1]) / file_name())
        print(file_name())
