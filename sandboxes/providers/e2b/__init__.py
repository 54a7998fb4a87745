"""E2B cloud sandboxes through the `e2b` Python SDK. The only package that imports `e2b`.

Mapping onto the provider interface:

- lifecycle: `Sandbox.create(template=...)`, the class-level `get_info`, `list` (filtered by
  our `sandpit.installation` metadata), `kill` (False when already gone), `set_timeout`,
  `get_metrics`. Connected `Sandbox` objects are cached per provider id.
- commands: every command runs as `commands.run(..., background=True)` so we hold the pid
  (for stdin, and to kill the whole process tree after a timeout) and stream output into
  per-stream byte caps. envd runs commands with `bash -l -c`; the argv form is shell-quoted.
- files: the SDK's filesystem calls on `/home/user`, which is Sandpit's workspace here.
  Paths are checked lexically, then with one `realpath -m` command so symlinks cannot
  lead outside the workspace (one extra round trip per file operation).
- terminals: `sandbox.pty`; a thread pumps the SDK's callback output into an os.pipe()
  so the session has a real, non-blocking `fileno()`.
- ports: `get_host(port)` gives the public host; we open TLS to it (plain TCP when the
  SDK is in debug mode and returns host:port). `open_ports` reads /proc/net/tcp{,6}.
- watch: `files.watch_dir` polled with `get_new_events`.

SDK objects and exceptions never leave this package: `E2BProvider._translate` (provider.py)
is the one place that turns e2b errors into ours. Sessions (terminal, port stream, watch)
are in sessions.py.
"""

from .provider import E2BProvider

__all__ = ["E2BProvider"]
