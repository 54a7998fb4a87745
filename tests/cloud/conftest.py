"""Cloud provider fixtures. No cloud is reachable here: each adapter runs against a local fake.

`e2b_provider` is the real E2BProvider (real `e2b` SDK types and error translation) with
the SDK's Sandbox class replaced by tests/cloud/fake_e2b.py.
"""

from __future__ import annotations

import os
import shutil
import uuid

import pytest

from sandboxes.providers.base import SandboxProvider, SandboxSpec
from tests.requirements import missing_part, require_module

FAKE_E2B_KEY = "e2b_test_key"


@pytest.fixture(scope="session")
def fake_e2b_cloud(tmp_path_factory):  # type: ignore[no-untyped-def]
    require_module("e2b", "the e2b extra is not installed (pip install -e .[cloud])")
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        missing_part("the e2b fake binds each sandbox at /home/user with unshare (needs root)")
    from tests.cloud.fake_e2b import FakeCloud

    cloud = FakeCloud(tmp_path_factory.mktemp("fake-e2b"), api_key=FAKE_E2B_KEY)
    yield cloud
    cloud.close()


@pytest.fixture(scope="session")
def e2b_provider(fake_e2b_cloud):  # type: ignore[no-untyped-def]
    from sandboxes.providers.e2b import E2BProvider
    from tests.cloud.fake_e2b import fake_sandbox_class

    return E2BProvider(api_key=FAKE_E2B_KEY, sandbox_class=fake_sandbox_class(fake_e2b_cloud))


@pytest.fixture
def provider(e2b_provider) -> SandboxProvider:  # type: ignore[no-untyped-def]
    return e2b_provider  # type: ignore[no-any-return]


@pytest.fixture
def sandbox(provider):  # type: ignore[no-untyped-def]
    handle = provider.create(SandboxSpec(sandbox_id=uuid.uuid4().hex))
    yield handle.provider_id
    provider.destroy(handle.provider_id)
