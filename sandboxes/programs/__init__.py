"""Programs that run inside a sandbox (stdlib only: a bare image has nothing else)."""
