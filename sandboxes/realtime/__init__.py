"""The WebSocket side of sandboxes: one consumer per job, routed in sandboxes/routing.py.

auth.py      who is on the other end of a socket (also used by the preview proxy)
outbound.py  the base consumer: one ordered outbound queue, typed errors and refusals
terminal.py  /ws/sandboxes/<id>/terminals/<tid>: raw bytes both ways, JSON for control
events.py    /ws/sandboxes/<id>/events: status, ports, processes, file watchers
exec.py      /ws/sandboxes/<id>/exec: streamed commands and code, stdin, signals

Every consumer authenticates the same way (auth.realtime_authorize), refuses with a close
code after accepting (4401 auth, 4402 billing, 4403 scope, 4404 tenancy, 4503 the database
could not serve) and runs every
operation through one service (sandboxes.terminals, sandboxes.streaming), which meters it.
Messages are documented in the README (Real-time section).
"""
