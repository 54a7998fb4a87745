"""jail_launch.c (sandboxes/providers/local/launcher.py): a jail's bwrap starts in a mount
namespace without the other sandboxes' volumes or the host's mounts it does not read,
nothing is unmounted on the host, and the uid is dropped as setpriv dropped it. Real mounts, real jails; needs root and a C compiler,
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
KEEP_EVERY_MOUNT = launcher.KEEP_EVERY_MOUNT
"""NEEDS for the tests of what happens under the root: every other mount stays."""


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
        helper,
        str(mounted_root),
        str(mounted_root / "b"),
        "-",
        KEEP_EVERY_MOUNT,
        "/bin/cat",
        "/proc/self/mountinfo",
    )
    assert result.returncode == 0, result.stderr
    seen = points(result.stdout)
    assert str(mounted_root / "b") in seen
    assert str(mounted_root / "a") not in seen
    assert str(mounted_root) in seen


def test_nothing_is_unmounted_on_the_host_even_under_a_shared_mount(
    helper: Path, mounted_root: Path
) -> None:
    result = run_helper(helper, str(mounted_root), "", "-", KEEP_EVERY_MOUNT, "/bin/true")
    assert result.returncode == 0, result.stderr
    assert {str(mounted_root / "a"), str(mounted_root / "b")} <= mount_points()
    (mounted_root / "a" / "still-here").write_text("x")


def test_volumes_mounted_later_do_not_reach_a_running_jail(
    helper: Path, mounted_root: Path
) -> None:
    program = "echo ready; read go; cat /proc/self/mountinfo"
    with subprocess.Popen(
        [str(helper), str(mounted_root), "", "-", KEEP_EVERY_MOUNT, "/bin/sh", "-c", program],
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


@pytest.fixture
def host_tree(tmp_path: Path) -> Iterator[Path]:
    """Mounts outside any jail root: `tree` (a bind of itself) holding the tmpfs mounts
    needed, needed/inner and other."""
    tree = tmp_path / "host tree"
    tree.mkdir()
    subprocess.run(["mount", "--bind", tree, tree], check=True)
    try:
        for name in ("needed", "needed/inner", "other"):
            (tree / name).mkdir()
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "t", tree / name], check=True)
        yield tree
    finally:
        subprocess.run(["umount", "-R", "-l", tree], check=False)


def test_it_keeps_only_the_mounts_that_hold_or_lie_under_what_it_needs(
    helper: Path, host_tree: Path, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    needs = f"/proc\n{host_tree / 'needed'}"
    result = run_helper(helper, str(root), "", "-", needs, "/bin/cat", "/proc/self/mountinfo")
    assert result.returncode == 0, result.stderr
    seen = points(result.stdout)
    # The mount holding a need, the need's own and the one under it stay.
    assert {"/", "/proc", str(host_tree), str(host_tree / "needed")} <= seen
    assert str(host_tree / "needed" / "inner") in seen
    assert str(host_tree / "other") not in seen
    hosts = mount_points()
    for point in hosts - seen:  # nothing else the host has survives, /sys and /dev among them
        assert not any(launcher_related(point, need) for need in needs.split("\n"))
    # ...and nothing left the host.
    assert str(host_tree / "other") in hosts
    (host_tree / "other" / "still-here").write_text("x")


def launcher_related(point: str, path: str) -> bool:
    """jail_launch's rule, restated: the mount at `point` holds `path`, is it or lies under."""
    return (
        point == "/"
        or path.startswith(point.rstrip("/") + "/")
        or point == path
        or (point.startswith(path + "/"))
    )


def test_it_drops_to_the_uid_with_no_groups_and_no_capabilities(helper: Path) -> None:
    result = run_helper(
        helper, "/nonexistent-root", "", str(NOBODY), "/proc", "/bin/cat", "/proc/self/status"
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
        ("relative", "", "-", "/", "/bin/true"),  # the root must be absolute
        ("/r", "keep", "-", "/", "/bin/true"),  # so must the volume kept
        ("/r", "", "0", "/", "/bin/true"),  # never "drop" to root
        ("/r", "", "12ab", "/", "/bin/true"),
        ("/r", "", "", "/", "/bin/true"),
        ("/r", "", "4294967295", "/", "/bin/true"),  # (uid_t)-1 means "unchanged" to setresuid
        ("/r", "", "-", "usr", "/bin/true"),  # every path it needs must be absolute
        ("/r", "", "-", "/usr\nproc", "/bin/true"),
        ("/r", "", "-", "", "/bin/true"),
        ("/r", "", "-", "/"),  # no program
    ],
)
def test_bad_arguments_exit_125_before_running_anything(
    helper: Path, tmp_path: Path, args: tuple[str, ...]
) -> None:
    marker = tmp_path / "ran"
    result = run_helper(helper, *args[:4], *(["/bin/touch", str(marker)] if len(args) > 4 else []))
    assert result.returncode == 125
    assert "jail_launch" in result.stderr or "usage" in result.stderr
    assert not marker.exists()


def test_a_missing_program_exits_125(helper: Path) -> None:
    result = run_helper(helper, "/r", "", "-", "/", "/nonexistent/program")
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


def test_a_jail_starts_without_the_hosts_mounts_it_does_not_read(
    helper: Path, host_tree: Path
) -> None:
    provider = LocalProvider(root_dir=jail_root("launch-host-mounts"))
    if LAUNCH_APART not in provider.health().detail:
        missing_part("the local provider has no tmpfs volumes here")
    sid = provider.create(SandboxSpec(sandbox_id=uuid.uuid4().hex)).provider_id
    try:
        state = jail.JailState.load(provider.root_dir / sid / "state.json")
        assert state is not None
        seen = mount_points_of(state.bwrap_pid)
        assert str(host_tree / "other") not in seen
        assert str(host_tree) not in seen
        if "/sys" in mount_points():
            assert "/sys" not in seen
        assert {"/proc", "/dev", str((provider.root_dir / sid / "vol").resolve())} <= seen
        result = provider.exec(
            sid, ExecRequest(command="sh", args=["-c", "node -v && ls /usr/bin/node /etc/passwd"])
        )
        assert result.exit_code == 0, result.stderr
        assert result.stdout.startswith(b"v")
    finally:
        provider.destroy(sid)
    assert str(host_tree / "other") in mount_points()


def jail_command_line(tmp_path: Path, env: dict[str, str], variant: str) -> list[str]:
    """bwrap_argv's command line in one of its variants: the host's /usr and /etc files, a
    built /etc with the exec shim and network, or a template's root file system."""
    return jail.bwrap_argv(
        bwrap="/usr/bin/bwrap",
        sandbox_dir=tmp_path / "sbx",
        shared_etc=tmp_path / "shared-etc",
        agent_path=tmp_path / "agent.pyz",
        network=variant != "host",
        env=env,
        info_fd=3,
        block_fd=4,
        agent_config={},
        rootfs=tmp_path / "rootfs" if variant == "template" else None,
        etc_dir=tmp_path / "etc" if variant == "built-etc" else None,
        exec_shim=None if variant == "host" else tmp_path / "shim",
    )


@pytest.mark.parametrize("variant", ["host", "built-etc", "template"])
def test_bind_sources_lists_every_host_path_a_jail_binds_from(tmp_path: Path, variant: str) -> None:
    plain = jail_command_line(tmp_path, {}, variant)
    written = [plain[at + 1] for at, arg in enumerate(plain) if arg in ("--bind", "--ro-bind")]
    # Environment values that look like options are skipped as values.
    hostile = jail_command_line(tmp_path, {"X": "--bind", "--ro-bind": "/nowhere"}, variant)
    assert "/nowhere" in hostile
    assert jail.bind_sources(hostile[1:]) == written
    assert str(tmp_path / "agent.pyz") in written
    assert str(tmp_path / "rootfs") in written if variant == "template" else "/usr" in written
    assert (str(tmp_path / "shim") in written) == (variant != "host")


def test_bind_sources_refuses_an_option_it_does_not_know() -> None:
    with pytest.raises(ValueError, match="--overlay"):
        jail.bind_sources(["--unshare-all", "--overlay", "/a", "/b", "/c", "/usr/bin/true"])
    assert jail.bind_sources(["--ro-bind", "/usr", "/usr", "/usr/bin/true", "--bind"]) == ["/usr"]


def test_needs_lists_the_sources_and_what_bwrap_always_reads(tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "real")
    root = tmp_path / "root"
    sources = ["/usr", str(link), str(root / "sbx" / "workspace")]
    needs = launcher.needs("/usr/bin/bwrap", sources, root).split("\n")
    # The root's own go without saying: the helper keeps the root apart.
    assert set(needs) == {"/usr", "/usr/bin", "/proc", "/dev", "/etc", str(tmp_path / "real")}
    weird = [str(tmp_path / "new\nline")]
    assert launcher.needs("/usr/bin/bwrap", weird, root) == KEEP_EVERY_MOUNT


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
