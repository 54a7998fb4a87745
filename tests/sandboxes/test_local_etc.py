"""The jails' /etc directory (sandboxes/providers/local/etc.py), on real files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandboxes.providers.base import ExecRequest, SandboxSpec
from sandboxes.providers.local import etc as jail_etc
from sandboxes.providers.local.etc import NETWORK, PLAIN, JailEtc

GENERATED = {"hostname": "sandbox\n", "passwd": "sandbox:x:1000:1000::/workspace:/bin/bash\n"}
NETWORK_FILES = {"resolv.conf": "nameserver 10.0.2.3\n"}


@pytest.fixture
def host(tmp_path: Path) -> Path:
    etc = tmp_path / "host-etc"
    (etc / "ssl" / "certs").mkdir(parents=True)
    (etc / "ssl" / "private").mkdir()
    (etc / "ssl" / "private" / "key.pem").write_text("secret")
    (etc / "ssl" / "certs" / "a.pem").write_text("cert a")
    (etc / "ssl" / "certs" / "link.pem").symlink_to("/usr/share/ca-certificates/a.crt")
    (etc / "services").write_text("http 80/tcp\n")
    (etc / "real-os-release").write_text("ID=debian\n")
    (etc / "os-release").symlink_to("real-os-release")
    (etc / "shadow").write_text("root:*:")
    return etc


def _make(tmp_path: Path, host: Path) -> JailEtc:
    shared = tmp_path / "shared"
    shared.mkdir(exist_ok=True)
    names = ("services", "ssl/certs", "os-release", "missing.conf")
    return JailEtc(shared, names, GENERATED, NETWORK_FILES, host_etc=host)


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_only_listed_entries_and_ours_and_links_as_a_bind_shows_them(tmp_path, host):
    etc = _make(tmp_path, host)
    plain = etc.current()
    assert plain.name == PLAIN
    assert _tree(plain) == {
        "services",
        "ssl",
        "ssl/certs",
        "ssl/certs/a.pem",
        "ssl/certs/link.pem",
        "os-release",
        "hostname",
        "passwd",
    }
    # A listed link is followed (a bind mounts its target); links inside a directory stay
    # links, resolved in the jail as they were under the bind.
    assert not (plain / "os-release").is_symlink()
    assert (plain / "os-release").read_text() == "ID=debian\n"
    assert os.readlink(plain / "ssl/certs/link.pem") == "/usr/share/ca-certificates/a.crt"
    assert (plain / "hostname").read_text() == "sandbox\n"
    networked = etc.current(network=True)
    assert networked.name == NETWORK and networked.parent == plain.parent
    assert (networked / "resolv.conf").read_text() == "nameserver 10.0.2.3\n"
    assert not (plain / "resolv.conf").exists()


def test_a_replaced_file_makes_a_new_version_and_the_old_one_stays(tmp_path, host):
    etc = _make(tmp_path, host)
    before = etc.current()
    assert etc.current() == before  # nothing changed: the same directory
    tmp = host / ".services.new"
    tmp.write_text("https 443/tcp\n")
    os.replace(tmp, host / "services")
    after = etc.current()
    assert after != before
    assert (after / "services").read_text() == "https 443/tcp\n"
    assert (before / "services").read_text() == "http 80/tcp\n"  # a running jail's /etc


def test_an_added_certificate_is_seen_at_once(tmp_path, host):
    etc = _make(tmp_path, host)
    etc.current()
    (host / "ssl" / "certs" / "b.pem").write_text("cert b")
    assert (etc.current() / "ssl/certs/b.pem").read_text() == "cert b"


def test_an_edit_in_place_deep_in_a_directory_is_seen_after_the_walk_interval(
    tmp_path, host, monkeypatch
):
    etc = _make(tmp_path, host)
    etc.current()
    with open(host / "ssl" / "certs" / "a.pem", "r+") as f:  # same inode, same directory
        f.write("CERT A")
    monkeypatch.setattr(jail_etc, "WALK_S", 0.0)
    assert (etc.current() / "ssl/certs/a.pem").read_text() == "CERT A"


def test_two_providers_build_the_same_version(tmp_path, host):
    assert _make(tmp_path, host).current() == _make(tmp_path, host).current()


def test_unused_old_versions_are_removed_and_used_ones_kept(tmp_path, host, monkeypatch):
    etc = _make(tmp_path, host)
    first = etc.current()
    (host / "services").write_text("one\n")
    second = etc.current()
    (host / "services").write_text("two\n")
    third = etc.current()
    assert len({first.parent, second.parent, third.parent}) == 3
    etc.remove_unused({str(first)})
    assert first.parent.exists() and second.parent.exists()  # too young to go
    monkeypatch.setattr(jail_etc, "_KEEP_UNUSED_S", 0.0)
    etc.remove_unused({str(first)})
    assert first.parent.exists()  # a live jail's
    assert not second.parent.exists()
    assert third.parent.exists()  # the current one


def test_a_jail_sees_its_etc_read_only_with_our_accounts(local_provider):
    sandbox = "etc-jail"
    local_provider.create(SandboxSpec(sandbox_id=sandbox))
    try:
        script = "cat /etc/passwd /etc/hostname; ls /etc/ssl/certs | head -1; touch /etc/x"
        result = local_provider.exec(sandbox, ExecRequest(command=script))
    finally:
        local_provider.destroy(sandbox)
    assert result.stdout.startswith(b"root:x:0:0:root:/nonexistent:")
    assert b"sandbox:x:1000:1000:" in result.stdout and b"\nsandbox\n" in result.stdout
    assert b"Read-only file system" in result.stderr and result.exit_code != 0
