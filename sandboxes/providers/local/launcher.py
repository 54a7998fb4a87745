"""Starting a jail's bwrap away from the other sandboxes' volumes (jail_launch.c).

Each live sandbox's tmpfs is a mount in the host's namespace (volume.py). bwrap copies its
caller's namespace and reads the whole mount table again for each of its binds, so with 100
live sandboxes a jail's start cost ~60% more CPU than with none. jail_launch, run as root
in place of setpriv, gives bwrap a namespace holding only the host's own mounts and the
starting sandbox's volume, then drops to the jail's uid as setpriv did.

It is C because it runs on every jail's start, between the server and bwrap: an interpreter
there would cost more than it saves, and Popen cannot set up a namespace without giving up
vfork. `build` compiles it once per source version into the provider's shared directory
(like the agent's bundle) with the host's C compiler; without one, or not as root, jails
start through setpriv as before.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
from pathlib import Path

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("jail_launch.c")
COMPILE_TIMEOUT_S = 60
KEEP_NONE = ""
STAY_ROOT = "-"


def binary_name(source: bytes) -> str:
    """``jail-launch-<first 12 hex digits of the source's SHA-256>``."""
    return f"jail-launch-{hashlib.sha256(source).hexdigest()[:12]}"


def build(shared_dir: Path, compiler: str | None = None) -> Path | None:
    """The helper compiled under `shared_dir` (compiled now if this version is missing);
    None when this process is not root or it cannot be compiled (logged once here)."""
    if os.geteuid() != 0:
        return None
    source = SOURCE.read_bytes()
    target = shared_dir / binary_name(source)
    if os.access(target, os.X_OK):
        return target
    cc = compiler or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        logger.warning("no C compiler: local jails start through setpriv (slower with many)")
        return None
    # Per process: several web processes may build at once; the rename is atomic.
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        result = subprocess.run(
            [cc, "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(tmp), str(SOURCE)],
            capture_output=True,
            timeout=COMPILE_TIMEOUT_S,
            check=False,
        )
        if result.returncode != 0:
            detail = result.stderr.decode(errors="replace").strip()[-500:]
            logger.warning("could not compile %s: %s", SOURCE.name, detail)
            return None
        os.chmod(tmp, 0o700)  # root's alone: it runs only as root
        os.replace(tmp, target)
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.warning("could not compile %s: %s", SOURCE.name, exc)
        return None
    finally:
        tmp.unlink(missing_ok=True)
    return target


def argv(
    helper: Path, root_dir: Path, keep: Path | None, uid: int | None, rest: list[str]
) -> list[str]:
    """The command line that runs `rest` (its first item an absolute path) through `helper`:
    every mount under `root_dir` but `keep` detached, as `uid` (None: stay root). Paths go
    in as the kernel lists them (symbolic links resolved)."""
    return [
        str(helper),
        os.path.realpath(root_dir),
        KEEP_NONE if keep is None else os.path.realpath(keep),
        STAY_ROOT if uid is None else str(uid),
        *rest,
    ]
