"""Files where the sandbox user may write (/workspace, also HOME, and /tmp): every path
resolved inside the sandbox with ``realpath``, so a symlink the sandbox's code made cannot
lead anywhere else; and file events (``inotifywait``) streamed to the host."""

from __future__ import annotations

import errno
import os
import select
import stat as S

from .procs import child_env, kill_tree, spawn
from .wire import CHUNK, AgentError, json_dumps, send_line, socket

WS = "/workspace"
ROOTS = (WS, "/tmp")
"""The writable directories the file operations reach; relative paths start in the first."""
MAX_PATH_BYTES = 4096
MAX_LIST_ENTRIES = 100_000


def _rel(p: str) -> str:
    """As entries show a path: relative in the workspace (as always), absolute elsewhere."""
    if p == WS:
        return ""
    return p[len(WS) + 1 :] if p.startswith(WS + "/") else p


def _inside(p: str) -> bool:
    return any(p == root or p.startswith(root + "/") for root in ROOTS)


def resolve(path: object, follow: bool = True) -> tuple[str, str]:
    """(lexical path with its parent's symlinks resolved, fully resolved path); raises
    path_not_allowed when either leaves the workspace (the last component may be a
    dangling or outward symlink when `follow` is False: it is then the link itself)."""
    if not isinstance(path, str) or "\0" in path or len(path.encode()) > MAX_PATH_BYTES:
        raise AgentError("path_not_allowed", "malformed path")
    full = path if path.startswith("/") else os.path.join(WS, path)
    head, name = os.path.split(full.rstrip("/") or "/")
    if name in ("", ".", ".."):
        lex = os.path.realpath(full)
    else:
        lex = os.path.join(os.path.realpath(head), name)
    if not _inside(lex):
        raise AgentError("path_not_allowed", "path is outside /workspace and /tmp: " + path)
    real = os.path.realpath(lex)
    if follow and not _inside(real):
        raise AgentError("path_not_allowed", "path is outside /workspace and /tmp: " + path)
    return lex, real


def entry(lex: str, st: os.stat_result | None = None) -> dict:
    st = st or os.lstat(lex)
    if S.S_ISLNK(st.st_mode):
        kind = "symlink"
    elif S.S_ISDIR(st.st_mode):
        kind = "dir"
    else:
        kind = "file"
    return {
        "name": os.path.basename(lex) if lex != WS else "",
        "path": _rel(lex),
        "type": kind,
        "size": st.st_size,
        "mtime": st.st_mtime,
    }


def op_read(conn: socket.socket, req: dict) -> None:
    """Reply ``{"ok": true, "size": n}`` and then the n bytes."""
    path = req["path"]
    _lex, real = resolve(path)
    st = os.stat(real)
    if S.S_ISDIR(st.st_mode):
        raise AgentError("file_conflict", "is a directory: " + path)
    if not S.S_ISREG(st.st_mode):
        raise AgentError("file_conflict", "not a regular file: " + path)
    off = max(0, int(req.get("offset") or 0))
    n = max(0, st.st_size - off)
    if req.get("length") is not None:
        n = min(n, max(0, int(req["length"])))
    if n > int(req["max"]):
        raise AgentError("file_too_large", f"file is {n} bytes; the limit is {req['max']}")
    with open(real, "rb") as f:
        data = os.pread(f.fileno(), n, off) if n else b""
    conn.sendall(json_dumps({"ok": True, "size": len(data)}).encode() + b"\n" + data)


def op_write(conn: socket.socket, req: dict, data: bytes) -> None:
    path = req["path"]
    lex, real = resolve(path)
    if os.path.isdir(real):
        raise AgentError("file_conflict", "is a directory: " + path)
    if os.path.exists(real) and not os.path.isfile(real):
        raise AgentError("file_conflict", "not a regular file: " + path)
    os.makedirs(os.path.dirname(real), exist_ok=True)
    with open(real, "wb") as f:
        f.write(data)
    send_line(conn, {"ok": True, "entry": entry(lex)})


def op_mkdir(conn: socket.socket, req: dict) -> None:
    lex, real = resolve(req["path"])
    if os.path.lexists(real) and not os.path.isdir(real):
        raise AgentError("file_conflict", "exists and is not a directory: " + req["path"])
    os.makedirs(real, exist_ok=True)
    send_line(conn, {"ok": True, "entry": entry(lex)})


def op_list_files(conn: socket.socket, req: dict) -> None:
    lex, real = resolve(req["path"])
    if not os.path.isdir(real):
        if os.path.lexists(real):
            raise AgentError("file_conflict", "not a directory: " + req["path"])
        raise AgentError("file_not_found", "no such directory: " + req["path"])
    out: list[dict] = []

    def walk(dir_real: str, dir_lex: str) -> None:
        with os.scandir(dir_real) as it:
            items = sorted(it, key=lambda e: e.name)
        for e in items:
            if len(out) >= MAX_LIST_ENTRIES:
                return
            p = os.path.join(dir_lex, e.name)
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            out.append(entry(p, st))
            if req.get("recursive") and S.S_ISDIR(st.st_mode):
                walk(os.path.join(dir_real, e.name), p)

    walk(real, lex)
    send_line(conn, {"ok": True, "entries": out})


def op_stat(conn: socket.socket, req: dict) -> None:
    lex, _real = resolve(req["path"], follow=False)
    send_line(conn, {"ok": True, "entry": entry(lex)})


def op_exists(conn: socket.socket, req: dict) -> None:
    lex, _real = resolve(req["path"], follow=False)
    send_line(conn, {"ok": True, "exists": os.path.lexists(lex)})


def op_remove(conn: socket.socket, req: dict) -> None:
    lex, _real = resolve(req["path"], follow=False)
    if lex in ROOTS:
        raise AgentError("path_not_allowed", f"cannot remove {lex} itself")
    st = os.lstat(lex)
    if S.S_ISDIR(st.st_mode):
        if req.get("recursive"):
            _rmtree(lex)
        else:
            os.rmdir(lex)
    else:
        os.unlink(lex)
    send_line(conn, {"ok": True})


def _rmtree(top: str) -> None:
    """shutil.rmtree without importing shutil (and its imports) into the agent; never
    follows symlinks."""
    with os.scandir(top) as it:
        items = list(it)
    for e in items:
        if e.is_dir(follow_symlinks=False):
            _rmtree(e.path)
        else:
            os.unlink(e.path)
    os.rmdir(top)


def op_move(conn: socket.socket, req: dict) -> None:
    src, _ = resolve(req["src"], follow=False)
    dst, _ = resolve(req["dst"], follow=False)
    if src in ROOTS or dst in ROOTS:
        raise AgentError("path_not_allowed", "cannot move /workspace or /tmp itself")
    os.lstat(src)
    if os.path.lexists(dst):
        raise AgentError("file_conflict", "destination exists: " + req["dst"])
    if (dst + "/").startswith(src + "/"):
        raise AgentError("file_conflict", "cannot move a directory into itself")
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    try:
        os.rename(src, dst)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        _copy_across(src, dst, req["src"])
    send_line(conn, {"ok": True, "entry": entry(dst)})


def _copy_across(src: str, dst: str, shown: str) -> None:
    """/workspace and /tmp are separate mounts: a file moves by a copy, as mv does; a
    directory is refused rather than copied tree-wise."""
    st = os.lstat(src)
    if not S.S_ISREG(st.st_mode):
        raise AgentError("file_conflict", "only files move between /workspace and /tmp: " + shown)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    with open(src, "rb") as f, os.fdopen(os.open(dst, flags, S.S_IMODE(st.st_mode)), "wb") as out:
        while chunk := f.read(CHUNK):
            out.write(chunk)
    os.unlink(src)


WATCH_EVENTS = "create,delete,modify,close_write,moved_from,moved_to"


def op_watch(conn: socket.socket, req: dict) -> None:
    """Run ``inotifywait -m`` on a workspace directory; once its watches are established,
    reply and then stream its records (``"<events> <path>\\0"``) until the host closes
    the connection, which kills the watcher."""
    lex, real = resolve(req["path"])
    if not os.path.isdir(real):
        if os.path.lexists(real):
            raise AgentError("file_conflict", "not a directory: " + req["path"])
        raise AgentError("file_not_found", "no such directory: " + req["path"])
    argv = ["inotifywait", "-m", "--format", "%e %w%f%0", "--no-newline", "-e", WATCH_EVENTS]
    if req.get("recursive", True):
        argv.append("-r")
    argv.append(lex)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    null = os.open("/dev/null", os.O_RDONLY)
    try:
        child = spawn(
            argv, child_env(None), WS, (null, out_w, err_w), kind="watch", command="watch"
        )
    finally:
        for fd in (null, out_w, err_w):
            os.close(fd)
    try:
        err = b""
        while b"Watches established" not in err:
            data = os.read(err_r, CHUNK)
            if not data:
                raise AgentError(
                    "agent_error", "inotifywait: " + err.decode(errors="replace")[-300:]
                )
            err += data
        send_line(conn, {"ok": True})
        poller = select.poll()
        poller.register(out_r, select.POLLIN)
        poller.register(conn.fileno(), select.POLLIN)
        while True:
            for fd, _ev in poller.poll():
                if fd == out_r:
                    data = os.read(out_r, CHUNK)
                    if not data:
                        return
                    conn.sendall(data)
                elif not conn.recv(CHUNK):
                    return
    finally:
        kill_tree(child.pid, child.tag)
        child.done.wait(1.0)
        os.close(out_r)
        os.close(err_r)


OPS = {
    "read": op_read,
    "mkdir": op_mkdir,
    "list_files": op_list_files,
    "stat": op_stat,
    "exists": op_exists,
    "remove": op_remove,
    "move": op_move,
    "watch": op_watch,
}
"""``write`` is dispatched by the server: its request carries a body."""
