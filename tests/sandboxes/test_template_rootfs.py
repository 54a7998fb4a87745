"""Unpacking a template's image for local jails (providers/local/rootfs.py), fed a tar stream
as `docker export` writes it: links the image points outside never lead the unpacking onto
the host; ownership, modes, devices and the jail's mount points come out as a jail needs."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from sandboxes.providers.local.rootfs import RootfsInvalid, rootfs_check, rootfs_install


def _tar(entries: list[tarfile.TarInfo], data: dict[str, bytes]) -> list[bytes]:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for info in entries:
            content = data.get(info.name)
            if content is not None:
                info.size = len(content)
            archive.addfile(info, io.BytesIO(content) if content is not None else None)
    raw = buffer.getvalue()
    return [raw[i : i + 4096] for i in range(0, len(raw), 4096)]  # as a stream of chunks


def _entry(name: str, kind: bytes = tarfile.REGTYPE, **attrs: object) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = int(attrs.pop("mode", 0o755))  # type: ignore[call-overload]
    for key, value in attrs.items():
        setattr(info, key, value)
    return info


def test_links_out_of_the_tree_never_touch_the_host(tmp_path):
    host = tmp_path / "host"
    (host / "etc").mkdir(parents=True)
    (host / "etc" / "resolv.conf").write_text("host's")
    (host / "opt").mkdir()
    entries = [
        _entry("usr", tarfile.DIRTYPE),
        _entry("usr/bin", tarfile.DIRTYPE),
        _entry("usr/bin/python3", mode=0o4755, uid=1000, gid=1000),  # setuid, not root's
        _entry("etc", tarfile.DIRTYPE),
        _entry("etc/resolv.conf", tarfile.SYMTYPE, linkname=str(host / "etc" / "resolv.conf")),
        _entry("opt", tarfile.SYMTYPE, linkname=str(host / "opt")),
        _entry("run", tarfile.SYMTYPE, linkname=str(host)),
        _entry("dev", tarfile.DIRTYPE),
        _entry("dev/sda", tarfile.BLKTYPE, devmajor=8, devminor=0),
        _entry("tmp", tarfile.DIRTYPE, mode=0o1777),
        _entry("workspace", tarfile.DIRTYPE, mode=0o777, uid=1000),
        _entry("world-writable", mode=0o666),
    ]
    root = tmp_path / "templates" / "t1"
    rootfs_install(_tar(entries, {"usr/bin/python3": b"#!", "world-writable": b"x"}), root)

    assert (host / "etc" / "resolv.conf").read_text() == "host's"
    assert sorted(p.name for p in host.iterdir()) == ["etc", "opt"]
    assert list((host / "opt").iterdir()) == []
    for sub in ("opt", "opt/sandpit", "run", "run/sandpit", "etc"):
        assert (root / sub).is_dir() and not (root / sub).is_symlink(), sub
    for sub in ("etc/resolv.conf", "opt/sandpit/agent.pyz", "opt/sandpit/exec-shim", "etc/passwd"):
        assert (root / sub).is_file() and not (root / sub).is_symlink(), sub
    assert not (root / "dev" / "sda").exists()
    python = (root / "usr" / "bin" / "python3").lstat()
    assert not python.st_mode & (stat.S_ISUID | stat.S_ISGID)
    for path in (root / "world-writable", root / "workspace", root / "tmp"):
        assert not path.lstat().st_mode & 0o022, path
    if os.geteuid() == 0:
        assert {p.lstat().st_uid for p in root.rglob("*")} == {0}
    assert rootfs_check(root) == root
    assert not list(root.parent.glob(".*"))  # no staging left


def test_a_tree_without_python_is_refused(tmp_path):
    entries = [_entry("usr", tarfile.DIRTYPE), _entry("usr/bin", tarfile.DIRTYPE)]
    with pytest.raises(RootfsInvalid, match="python3"):
        rootfs_install(_tar(entries, {}), tmp_path / "t2")
    assert not (tmp_path / "t2").exists()
    assert not list(Path(tmp_path).glob(".*"))
