"""The small C programs of the local provider, compiled once per source version into its
shared directory with the host's C compiler (like the agent's bundle): jail_launch
(launcher.py), run as root between the server and bwrap, and the agent's exec shim
(sandboxes/agent/exec_shim.c), run inside every jail. Without a compiler each has a slower
path (setpriv; ctypes in the agent)."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
from pathlib import Path

logger = logging.getLogger(__name__)

COMPILE_TIMEOUT_S = 60
EXEC_SHIM_SOURCE = Path(__file__).resolve().parents[2] / "agent" / "exec_shim.c"


def binary_name(prefix: str, source: bytes) -> str:
    """``<prefix>-<first 12 hex digits of the source's SHA-256>``."""
    return f"{prefix}-{hashlib.sha256(source).hexdigest()[:12]}"


def compile_once(
    source_path: Path,
    shared_dir: Path,
    prefix: str,
    *,
    mode: int,
    static: bool = False,
    compiler: str | None = None,
    without: str,
) -> Path | None:
    """`source_path` compiled under `shared_dir` with `mode` (compiled now if this version
    is missing); None when it cannot be, logged with `without`: what happens instead."""
    source = source_path.read_bytes()
    target = shared_dir / binary_name(prefix, source)
    if os.access(target, os.X_OK):
        return target
    cc = compiler or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        logger.warning("no C compiler for %s: %s", source_path.name, without)
        return None
    # Per process: several web processes may build at once; the rename is atomic.
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    flags = ["-O2", "-Wall", "-Wextra", "-Werror", *(["-static"] if static else [])]
    try:
        result = subprocess.run(
            [cc, *flags, "-o", str(tmp), str(source_path)],
            capture_output=True,
            timeout=COMPILE_TIMEOUT_S,
            check=False,
        )
        if result.returncode != 0:
            detail = result.stderr.decode(errors="replace").strip()[-500:]
            logger.warning("could not compile %s (%s): %s", source_path.name, without, detail)
            return None
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.warning("could not compile %s (%s): %s", source_path.name, without, exc)
        return None
    finally:
        tmp.unlink(missing_ok=True)
    return target


def build_exec_shim(shared_dir: Path, compiler: str | None = None) -> Path | None:
    """The agent's exec shim, static so that it runs in any template's root file system,
    readable and executable by every jail uid (they reach it through the jail's bind)."""
    return compile_once(
        EXEC_SHIM_SOURCE,
        shared_dir,
        "exec-shim",
        mode=0o755,
        static=True,
        compiler=compiler,
        without="the jails' agents load ctypes to start commands",
    )
