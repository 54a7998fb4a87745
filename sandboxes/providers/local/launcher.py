"""Starting a jail's bwrap away from the other sandboxes' volumes (jail_launch.c).

Each live sandbox's tmpfs is a mount in the host's namespace (volume.py). bwrap copies its
caller's namespace and reads the whole mount table again for each of its binds, so with 100
live sandboxes a jail's start cost ~60% more CPU than with none. jail_launch, run as root
in place of setpriv, gives bwrap a namespace holding only the host's own mounts and the
starting sandbox's volume, then drops to the jail's uid as setpriv did.

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
