"""jail_launch.c (sandboxes/providers/local/launcher.py): a jail's bwrap starts in a mount
namespace without the other sandboxes' volumes, nothing is unmounted on the host, and the
uid is dropped as setpriv dropped it. Real mounts, real jails; needs root and a C compiler,
which `make test` has."""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxes.providers.base import ExecRequest, SandboxSpec
from sandboxes.providers.local import LocalProvider, c_helpers, jail, launcher
from sandboxes.providers.local.provider import LAUNCH_APART
from tests.requirements import jail_root, missing_part

NOBODY = 65534


@pytest.fixture(scope="module")
def helper(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if os.geteuid() != 0:
        missing_part("jail_launch runs as root")
    built = launcher.build(tmp_path_factory.mktemp("launch"))
    if built is None:
        missing_part("no C compiler to build jail_launch")
    assert built is not None
    return built


def points(mountinfo: str) -> set[str]:
    """The mount points a mount table lists, with the kernel's octal escapes decoded."""
    return {
        re.sub(r"\\([0-7]{3})", lambda code: chr(int(code[1], 8)), line.split()[4])
        for line in mountinfo.splitlines()
    }


def mount_points() -> set[str]:
    return points(Path("/proc/self/mountinfo").read_text())


def mount_points_of(pid: int) -> set[str]:
    return points(Path(f"/proc/{pid}/mountinfo").read_text())


@pytest.fixture
def mounted_root(tmp_path: Path) -> Iterator[Path]:
    """A shared mount (as / is on systemd hosts) holding two tmpfs mounts, a and b. Its
    name has a space, which the kernel's mount table escapes."""
    root = tmp_path / "jail root"
    root.mkdir()
    subprocess.run(["mount", "--bind", root, root], check=True)
    subprocess.run(["mount", "--make-shared", root], check=True)
    for name in ("a", "b"):
        (root / name).mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "t", root / name], check=True)
    try:
        yield root
    finally:
        subprocess.run(["umount", "-R", "-l", root], check=False)


def run_helper(helper: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(helper), *args], capture_output=True, text=True, timeout=10, check=False
    )


def test_the_program_sees_only_the_volume_it_keeps(helper: Path, mounted_root: Path) -> None:
    # The root itself is a mount here, and not under root/: it stays; a and b are under it.
    result = run_helper(
        helper, str(mounted_root), str(mounted_root / "b"), "-", "/bin/cat", "/proc/self/mountinfo"
    )
    assert result.returncode == 0, result.stderr
    seen = points(result.stdout)
    assert str(mounted_root / "b") in seen
    assert str(mounted_root / "a") not in seen
    assert str(mounted_root) in seen


def test_nothing_is_unmounted_on_the_host_even_under_a_shared_mount(
    helper: Path, mounted_root: Path
) -> None:
    result = run_helper(helper, str(mounted_root), "", "-", "/bin/true")
    assert result.returncode == 0, result.stderr
    assert {str(mounted_root / "a"), str(mounted_root / "b")} <= mount_points()
    (mounted_root / "a" / "still-here").write_text("x")


def test_volumes_mounted_later_do_not_reach_a_running_jail(
    helper: Path, mounted_root: Path
) -> None:
    program = "echo ready; read go; cat /proc/self/mountinfo"
    with subprocess.Popen(
        [str(helper), str(mounted_root), "", "-", "/bin/sh", "-c", program],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
        later = mounted_root / "later"
        later.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "t", later], check=True)
        out, _ = proc.communicate("go\n", timeout=10)
    assert str(later) in mount_points()
    assert str(later) not in points(out)


def test_it_drops_to_the_uid_with_no_groups_and_no_capabilities(helper: Path) -> None:
    result = run_helper(
        helper, "/nonexistent-root", "", str(NOBODY), "/bin/cat", "/proc/self/status"
    )
    assert result.returncode == 0, result.stderr
    status = dict(line.split(":", 1) for line in result.stdout.splitlines() if ":" in line)
    assert status["Uid"].split() == [str(NOBODY)] * 4
    assert status["Gid"].split() == [str(NOBODY)] * 4
    assert status["Groups"].strip() == ""
    assert int(status["CapEff"], 16) == 0
    assert int(status["CapPrm"], 16) == 0


@pytest.mark.parametrize(
    "args",
    [
        ("relative", "", "-", "/bin/true"),  # the root must be absolute
        ("/r", "keep", "-", "/bin/true"),  # so must the volume kept
        ("/r", "", "0", "/bin/true"),  # never "drop" to root
        ("/r", "", "12ab", "/bin/true"),
        ("/r", "", "", "/bin/true"),
        ("/r", "", "4294967295", "/bin/true"),  # (uid_t)-1 means "unchanged" to setresuid
        ("/r", "", "-"),  # no program
    ],
)
def test_bad_arguments_exit_125_before_running_anything(
    helper: Path, tmp_path: Path, args: tuple[str, ...]
) -> None:
    marker = tmp_path / "ran"
    result = run_helper(helper, *args[:3], *(["/bin/touch", str(marker)] if len(args) > 3 else []))
    assert result.returncode == 125
    assert "jail_launch" in result.stderr or "usage" in result.stderr
    assert not marker.exists()


def test_a_missing_program_exits_125(helper: Path) -> None:
    result = run_helper(helper, "/r", "", "-", "/nonexistent/program")
    assert result.returncode == 125
    assert "/nonexistent/program" in result.stderr


def test_a_jail_starts_without_the_other_sandboxes_volumes(helper: Path) -> None:
    provider = LocalProvider(root_dir=jail_root("launch-sandboxes"))
    if LAUNCH_APART not in provider.health().detail:
        missing_part("the local provider has no tmpfs volumes here")
    first = provider.create(SandboxSpec(sandbox_id=uuid.uuid4().hex)).provider_id
    second = provider.create(SandboxSpec(sandbox_id=uuid.uuid4().hex)).provider_id
    try:
        first_vol = str((provider.root_dir / first / "vol").resolve())
        second_vol = str((provider.root_dir / second / "vol").resolve())
        assert {first_vol, second_vol} <= mount_points()
        # bwrap's own process (the helper exec'd into it) stays in the helper's namespace.
        state = jail.JailState.load(provider.root_dir / second / "state.json")
        assert state is not None
        seen = mount_points_of(state.bwrap_pid)
        assert second_vol in seen
        assert first_vol not in seen
        # Both jails work, with their own files, as their own uids.
        results = {}
        for sid in (first, second):
            provider.write_file(sid, "/workspace/who", sid.encode())
            results[sid] = provider.exec(
                sid, ExecRequest(command="sh", args=["-c", "cat /workspace/who; echo; id -u"])
            )
        for sid, result in results.items():
            assert result.exit_code == 0, result.stderr
            lines = result.stdout.splitlines()
            assert lines[0] == sid.encode()
            assert int(lines[1]) == 1000
    finally:
        provider.destroy(first)
        provider.destroy(second)
    assert first_vol not in mount_points()


def test_the_helper_is_built_once_per_source_version(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        missing_part("jail_launch runs as root")
    built = launcher.build(tmp_path)
    if built is None:
        missing_part("no C compiler to build jail_launch")
    assert built is not None
    assert built.name == c_helpers.binary_name(launcher.PREFIX, launcher.SOURCE.read_bytes())
    assert built.stat().st_mode & 0o777 == 0o700
    stamp = built.stat().st_mtime_ns
    assert launcher.build(tmp_path, compiler="/nonexistent/cc") == built  # cached: no compile
    assert built.stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [built.name]  # no temporary file left


def test_without_a_compiler_jails_start_through_setpriv(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        missing_part("jail_launch runs as root")
    assert launcher.build(tmp_path, compiler="/nonexistent/cc") is None
    assert list(tmp_path.iterdir()) == []
