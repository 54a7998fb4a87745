"""posix_spawn through libc itself, so that commands start with every signal at its default.

Python's os.posix_spawn cannot: its signal set refuses glibc's two internal signals
(32 and 33, below SIGRTMIN), and glibc's posix_spawn then sets both to SIG_IGN in the
child, which exec keeps. A program that is not glibc's (Go, musl, a JIT) would start
with them ignored. posix_spawnattr_setsigdefault copies the set as it is, so a set built
here by hand, with those two bits on, gives the child every signal at its default.

The same two can also be ignored in the agent itself: in a Docker container every
process starts with signal 32 ignored (the engine's processes ignore it, and ignored
signals survive exec), and the agent's forked children would inherit that. Python's
signal module cannot touch them either, so `_load` sets an ignored one back to its
default with the raw rt_sigaction system call.

Loading ctypes and libc costs each agent ~2 ms of CPU (10-40 ms of wall time), so
`start_loading()` does it on a thread of its own, and without the exec shim `wait_loaded()`
holds the first command until it is done. Where the host provides the shim (exec_shim.c;
the local provider binds it into each jail), commands start through os.posix_spawn of the
shim instead, which sets those two back to their default before it runs the command (an
exec more: ~0.6 ms of CPU per command), until libc is loaded. A cold jail loads it only
once it has started `SHIM_SPAWNS_BEFORE_LIBC` commands: a sandbox that runs one command
(a burst of creates) never pays for it, one that runs many pays it once. A warm jail loads
it as it starts, while it idles in the pool: its claim's first command, the one a create
is waiting to run, then starts without the shim's exec (~1 ms sooner, measured through the
API), which is worth its ~1.5 ms of the pool's CPU.
"""

from __future__ import annotations

import _thread

# posix, not os: the agent's start-up skips `os` (see procs.py)
import posix
import sys

# typing costs the agent's start-up ~5 ms: imported for the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal as _signal
    from typing import Any
else:
    import _signal  # the C module: importing `signal` would build its enums at start

_SETSIGDEF = 0x04
_SETSIGMASK = 0x08
_SETSID = 0x80
"""glibc's POSIX_SPAWN_* flags (SETSID since glibc 2.26)."""
_SIGSET_BYTES = 128
"""sizeof(sigset_t) in glibc: 1024 bits."""
_ATTR_BYTES = 1024
_ACTIONS_BYTES = 1024
"""Room for posix_spawnattr_t (336 bytes on x86-64) and posix_spawn_file_actions_t (80)."""
_NO_DEFAULT = (9, 19)
"""SIGKILL and SIGSTOP: their dispositions cannot be changed."""

_RT_SIGACTION = {"x86_64": 13, "aarch64": 134}
"""The rt_sigaction system call's number, where we know it."""
_KERNEL_SIGACTION_BYTES = 64
"""Room for the kernel's struct sigaction (32 bytes on x86-64); all zeros is SIG_DFL."""
_SIG_IGN = 1
_LOAD_WAIT_S = 10.0
SHIM_SPAWNS_BEFORE_LIBC = 2

_state: dict[str, Any] = {}
_loaded = _thread.allocate_lock()
_loaded.acquire()


def start_loading(exec_shim: str | None = None, *, preload: bool = True) -> None:
    """Load libc's posix_spawn on a thread of its own, now unless there is `exec_shim` and
    not `preload` (see the module docstring); until it is loaded, commands start through
    `exec_shim` where there is one."""
    if exec_shim is not None:
        _state.update(
            exec_shim=exec_shim,
            shim_sigdef=[sig for sig in _signal.valid_signals() if sig not in _NO_DEFAULT],
            shim_spawns=0,
        )
    if exec_shim is None or preload:
        _begin_loading()


def _begin_loading() -> None:
    if _state.get("loading"):
        return
    _state["loading"] = True
    if sys.platform == "linux":
        _thread.start_new_thread(_load, ())
    else:
        _state["done"] = True
        _loaded.release()


def wait_loaded() -> None:
    """Until `_load` is done (or gave up), so that no command starts before the agent's
    own ignored internal signals are reset; at once where commands can start through the
    exec shim meanwhile."""
    if "exec_shim" in _state:
        return
    if not _state.get("done") and _loaded.acquire(True, _LOAD_WAIT_S):
        _loaded.release()


def via_shim() -> str | None:
    """The exec shim, for a forked child to exec the command through, while libc's
    posix_spawn is not loaded (until then the agent's own internal signals may still be
    ignored, and a forked child would inherit that)."""
    return None if "libc" in _state else _state.get("exec_shim")


def _load() -> None:
    try:
        _load_libc()
    finally:
        _state["done"] = True
        _loaded.release()


def _load_libc() -> None:
    try:
        import ctypes  # noqa: PLC0415 - slow to import; see the module docstring

        libc = ctypes.CDLL(None, use_errno=True)
        for function in (  # AttributeError where this libc lacks one
            libc.posix_spawn,
            libc.posix_spawnattr_init,
            libc.posix_spawnattr_setflags,
            libc.posix_spawnattr_setsigdefault,
            libc.posix_spawnattr_setsigmask,
            libc.posix_spawnattr_destroy,
            libc.posix_spawn_file_actions_init,
            libc.posix_spawn_file_actions_adddup2,
            libc.posix_spawn_file_actions_destroy,
        ):
            function.restype = ctypes.c_int
    except (ImportError, OSError, AttributeError):
        return
    number = _RT_SIGACTION.get(posix.uname().machine)
    if number is not None:
        for sig in (32, 33):
            old = ctypes.create_string_buffer(_KERNEL_SIGACTION_BYTES)
            args = (ctypes.c_long(number), ctypes.c_long(sig))
            if libc.syscall(*args, None, old, ctypes.c_long(8)) == 0 and (
                int.from_bytes(old.raw[:8], sys.byteorder) == _SIG_IGN
            ):
                default = ctypes.create_string_buffer(_KERNEL_SIGACTION_BYTES)
                libc.syscall(*args, default, None, ctypes.c_long(8))
    bits = sum(1 << (sig - 1) for sig in range(1, 65) if sig not in _NO_DEFAULT)
    sigdef = (ctypes.c_ubyte * _SIGSET_BYTES)(*bits.to_bytes(8, sys.byteorder))
    _state.update(
        ctypes=ctypes,
        libc=libc,
        sigdef=sigdef,
        empty=(ctypes.c_ubyte * _SIGSET_BYTES)(),
    )


def spawn(
    program: str, argv: list[str], env: dict[str, str], fds: tuple[int, int, int]
) -> int | None:
    """vfork+exec `program` in a new session with `fds` as its 0, 1 and 2, every signal
    at its default and none blocked. The pid; None when libc's posix_spawn is not loaded
    (yet) and there is no exec shim, or exec failed (the caller's other path reports the
    error)."""
    if "libc" not in _state:
        if "exec_shim" not in _state:
            return None
        _state["shim_spawns"] += 1
        if _state["shim_spawns"] >= SHIM_SPAWNS_BEFORE_LIBC:
            _begin_loading()
        return _spawn_through_shim(program, argv, env, fds)
    ctypes = _state["ctypes"]
    libc = _state["libc"]
    attr = ctypes.create_string_buffer(_ATTR_BYTES)
    actions = ctypes.create_string_buffer(_ACTIONS_BYTES)
    if libc.posix_spawnattr_init(attr) != 0:
        return None
    try:
        if libc.posix_spawn_file_actions_init(actions) != 0:
            return None
        try:
            flags = ctypes.c_short(_SETSIGDEF | _SETSIGMASK | _SETSID)
            if (
                libc.posix_spawnattr_setflags(attr, flags)
                or libc.posix_spawnattr_setsigdefault(attr, _state["sigdef"])
                or libc.posix_spawnattr_setsigmask(attr, _state["empty"])
            ):
                return None
            for target, fd in enumerate(fds):
                if libc.posix_spawn_file_actions_adddup2(actions, fd, target) != 0:
                    return None
            c_argv = (ctypes.c_char_p * (len(argv) + 1))(*[_fsencode(a) for a in argv], None)
            c_env = (ctypes.c_char_p * (len(env) + 1))(
                *[_fsencode(f"{key}={value}") for key, value in env.items()], None
            )
            pid = ctypes.c_int()
            if libc.posix_spawn(
                ctypes.byref(pid), _fsencode(program), actions, attr, c_argv, c_env
            ):
                return None
            return pid.value
        finally:
            libc.posix_spawn_file_actions_destroy(actions)
    finally:
        libc.posix_spawnattr_destroy(attr)


def _fsencode(text: str) -> bytes:
    """os.fsencode, for a str."""
    return text.encode(sys.getfilesystemencoding(), sys.getfilesystemencodeerrors())


def _spawn_through_shim(
    program: str, argv: list[str], env: dict[str, str], fds: tuple[int, int, int]
) -> int | None:
    """`spawn` through os.posix_spawn and the exec shim, which runs `program` once it has
    set glibc's two internal signals back to their default. An exec error is the shim's to
    report (exit status 127, as the fork path); None only when the shim did not start."""
    shim = _state["exec_shim"]
    try:
        return posix.posix_spawn(
            shim,
            [shim, program, *argv],
            env,
            file_actions=[(posix.POSIX_SPAWN_DUP2, fd, target) for target, fd in enumerate(fds)],
            setsid=True,
            setsigmask=(),
            setsigdef=_state["shim_sigdef"],
        )
    except OSError:
        return None
