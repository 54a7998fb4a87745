"""The shared provider contract, unchanged, against E2BProvider on the local e2b fake.

The `provider` and `sandbox` fixtures come from tests/cloud/conftest.py. What this proves:
the adapter's mapping (paths, exit codes, timeouts, truncation, PTY bridge, watch, ports)
over the SDK surface the fake reproduces. What it cannot prove: that E2B's real API and
envd behave like the fake (see README_CLOUD.md, "What was verified").
"""

from __future__ import annotations

from tests.sandboxes.test_provider_contract import *  # noqa: F403 - re-run every contract test
