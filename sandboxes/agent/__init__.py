"""The in-sandbox agent: one program for every provider that runs its own sandboxes.

It runs inside the sandbox (PID 1 of a local bubblewrap jail; under tini in a Docker
container), listens on a Unix socket and serves one JSON-line request per connection:
commands (``exec``, ``exec_stream``), background processes, terminals, ports, file
operations and file events. Standard library only and no Sandpit imports: it runs on
the sandbox's own Python (3.11 in the image). The host side ships it as one zip file
(sandboxes/providers/agent_bundle.py) that ``python3 -I -S`` runs.

Modules: server (entry point, request loop, relay mode), wire (JSON lines), procs
(spawning, reaping, killing, background processes), spawn (libc's posix_spawn, or the exec
shim: exec_shim.c, which the local provider compiles and binds; not in the zip), execute,
terminal, ports, files.
"""

PROTOCOL = 2
"""Bumped when a request or reply changes shape; ``ping`` reports it."""
