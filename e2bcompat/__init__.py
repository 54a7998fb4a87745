"""E2B-compatible API: the unmodified `e2b` SDK drives Sandpit's sandboxes.

Mounted under /e2b/ on Sandpit's own origin. The control plane (/e2b/sandboxes...,
/e2b/v2/sandboxes...) and envd's plain HTTP endpoints (/e2b/files, /e2b/health) are DRF
views; envd's Connect RPC services (/e2b/process.Process/*, /e2b/filesystem.Filesystem/*)
are connectrpc ASGI applications in front of Django (e2bcompat/asgi.py). Every operation
goes through Sandpit's services (sandboxes.services, .streaming, .terminals), which
authorize and meter it; this package only translates.
"""
