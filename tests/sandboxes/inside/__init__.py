"""Programs the tests run inside sandboxes (copied in, run by the sandbox's python3)."""
