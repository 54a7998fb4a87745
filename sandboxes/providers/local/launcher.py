"""Starting a jail's bwrap away from the mounts it does not read (jail_launch.c).

Each live sandbox's tmpfs is a mount in the host's namespace (volume.py), and hosts have
mounts of their own (/sys and its cgroups, a container engine's, other disks). bwrap copies
its caller's namespace and reads the whole mount table again for each of its binds, so
with 100 live sandboxes a jail's start cost ~60% more CPU than with none, and the host's
own 22 mounts here cost a jail's bwrap ~0.7 ms of its ~6. jail_launch, run as root in
place of setpriv, gives bwrap a namespace holding only the mounts its binds come from
(`needs`) and the starting sandbox's volume, then drops to the jail's uid as setpriv did.

It is C because it runs on every jail's start, between the server and bwrap: an interpreter
there would cost more than it saves, and Popen cannot set up a namespace without giving up
vfork. `build` compiles it once per source version into the provider's shared directory
(c_helpers.py); without a compiler, or not as root, jails start through setpriv as before.
"""

from __future__ import annotations

import os
from pathlib import Path

from sandboxes.providers.local import c_helpers

SOURCE = Path(__file__).with_name("jail_launch.c")
KEEP_NONE = ""
STAY_ROOT = "-"
PREFIX = "jail-launch"


def build(shared_dir: Path, compiler: str | None = None) -> Path | None:
    """The helper compiled under `shared_dir` (compiled now if this version is missing);
    None when this process is not root or it cannot be compiled (logged)."""
    if os.geteuid() != 0:
        return None
    return c_helpers.compile_once(
        SOURCE,
        shared_dir,
        PREFIX,
        mode=0o700,  # root's alone: it runs only as root
        compiler=compiler,
        without="local jails start through setpriv (slower with many)",
    )


ALWAYS_NEEDED = ("/proc", "/dev", "/etc")
"""Read by bwrap whatever it binds: its own /proc entries, the device nodes --dev binds and
the dynamic loader's cache when it starts. Not /tmp, where bwrap builds the new root on a
tmpfs of its own: any directory there will do, and the host's /tmp often holds mounts."""
KEEP_EVERY_MOUNT = "/"


def needs(bwrap: str, sources: list[str], root_dir: Path) -> str:
    """jail_launch's NEEDS: the paths whose mounts a jail's bwrap at `bwrap` reads, binding
    `sources` (jail.bind_sources), one per line as the kernel lists them (symbolic links
    resolved). Sources under `root_dir` go without saying (the helper keeps the root's
    mounts apart). A path with a newline in it keeps every mount."""
    under_root = os.fspath(root_dir).rstrip("/") + "/"
    paths = {
        os.path.realpath(path)
        for path in (*ALWAYS_NEEDED, os.path.dirname(bwrap), *sources)
        if not path.startswith(under_root)
    }
    if any("\n" in path for path in paths):
        return KEEP_EVERY_MOUNT
    return "\n".join(sorted(paths))


def argv(
    helper: Path,
    root_dir: Path,
    keep: Path | None,
    uid: int | None,
    rest: list[str],
    sources: list[str],
) -> list[str]:
    """The command line that runs `rest` (its first item the absolute path of bwrap)
    through `helper`: every mount under `root_dir` but `keep` detached, and every other one
    that neither holds nor lies under `root_dir`, a path in `sources` or ALWAYS_NEEDED; as
    `uid` (None: stay root). Paths go in as the kernel lists them (symbolic links
    resolved)."""
    return [
        str(helper),
        os.path.realpath(root_dir),
        KEEP_NONE if keep is None else os.path.realpath(keep),
        STAY_ROOT if uid is None else str(uid),
        needs(rest[0], sources, root_dir),
        *rest,
    ]
