"""Several Docker engines: the SANDPIT_DOCKER_HOSTS format, placement, routing, an engine
that stops answering (lost sandboxes, creates elsewhere, orphans reconciled when it returns),
per-engine health and metrics.

The second engine is a real dockerd of its own (scripts/docker-engine.sh: its own socket,
data and exec roots, pid file, no bridge), started once per session and stopped at its end;
its copy of the sandbox image is cached in its data root.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import subprocess
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings as django_settings
from django.db import connection
from django.test import Client
from django.utils import timezone

from accounts.authentication import Principal
from accounts.models import Organization
from common.errors import ApplicationError
from playground.metrics import render_metrics
from sandboxes.caller import Caller
from sandboxes.engine_health import engines_check, sandboxes_mark_lost
from sandboxes.engines import engine_label_required
from sandboxes.events import sandbox_events_group
from sandboxes.models import Sandbox, SandboxState
from sandboxes.operations import reconcile_orphans, reconcile_sandboxes
from sandboxes.providers import get_provider, reset_providers
from sandboxes.providers.base import (
    ExecRequest,
    ProviderError,
    ProviderNotConfigured,
    Resources,
    SandboxGone,
    SandboxSpec,
)
from sandboxes.providers.docker import DockerProvider
from sandboxes.providers.docker.engines import DockerEngines, EngineConfig, parse_engines
from sandboxes.services import sandbox_create, sandbox_destroy, sandbox_exec
from tests.docker_support import docker_provider_or_skip
from tests.requirements import missing_part

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "docker-engine.sh"
ENGINE_B = "pytest-b"
"""One second engine for the machine: its tests start it, stop it halfway and stop it at the
end, so they all run on one pytest-xdist worker (pyproject's pytest addopts: `--dist loadgroup`)."""

pytestmark = pytest.mark.xdist_group("second-docker-engine")
SMALL = {"memory_mb": 64, "cpu_count": 0.25, "pids": 64, "disk_mb": 16}


# --- the format and the routing (no engine needed) ----------------------------------------------


def test_no_setting_is_one_engine_at_docker_host() -> None:
    assert parse_engines("", "unix:///x.sock") == [
        EngineConfig(name="default", url="unix:///x.sock")
    ]


def test_engines_with_names_labels_tls_and_capacity(tmp_path: Path) -> None:
    for name in ("ca.pem", "c.pem", "k.pem"):
        (tmp_path / name).write_text("")
    a, b = parse_engines(
        "unix:///run/a.sock#name=a ,\n tcp://10.0.0.7:2376#name=b&label=gpu&label=eu"
        f"&tls_ca={tmp_path}/ca.pem&tls_cert={tmp_path}/c.pem&tls_key={tmp_path}/k.pem"
        "&memory_mb=4096&max_sandboxes=9",
        "unix:///ignored.sock",
    )
    assert (a.name, a.url, a.labels, a.tls_config()) == ("a", "unix:///run/a.sock", set(), None)
    assert (b.name, b.labels, b.memory_mb, b.max_sandboxes) == ("b", {"gpu", "eu"}, 4096, 9)
    assert not a.drain and parse_engines("unix:///a.sock#drain=1", "")[0].drain
    tls = b.tls_config()
    assert tls is not None and tls.verify is True and tls.ca_cert == f"{tmp_path}/ca.pem"
    assert tls.cert == (f"{tmp_path}/c.pem", f"{tmp_path}/k.pem")
    assert parse_engines("tcp://h:2376#tls=1", "")[0].tls_config() is not None
    # A certificate that is not there is a configuration error when the provider is built.
    missing = parse_engines("tcp://h:2376#tls_ca=/nowhere/ca.pem&tls_cert=/x&tls_key=/y", "")
    with pytest.raises(ProviderNotConfigured, match="engine 'default'"):
        DockerEngines(missing)


@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        ("http://h:2375#name=a", "not a unix:// or tcp://"),
        ("unix:///a.sock#name=a&colour=red", "unknown option"),
        ("unix:///a.sock#name=a,unix:///b.sock", "needs a name"),
        ("unix:///a.sock#name=A", "needs a name"),
        ("unix:///a.sock#name=a,unix:///b.sock#name=a", "repeat"),
        ("unix:///a.sock#name=a&memory_mb=lots", "integers"),
    ],
)
def test_bad_engine_lists_say_what_is_wrong(value: str, complaint: str) -> None:
    with pytest.raises(ProviderNotConfigured, match=complaint):
        parse_engines(value, "")


def test_provider_ids_name_their_engine_except_on_the_first() -> None:
    fleet = DockerEngines(parse_engines("unix:///a.sock#name=a, unix:///b.sock#name=b", ""))
    assert fleet.provider_id("a", "c0ffee") == "c0ffee"
    assert fleet.provider_id("b", "c0ffee") == "b:c0ffee"
    assert fleet.engine_of("c0ffee") == ("a", "c0ffee")
    assert fleet.engine_of("b:c0ffee") == ("b", "c0ffee")
    with pytest.raises(SandboxGone, match="no longer in SANDPIT_DOCKER_HOSTS"):
        fleet.engine_of("gone:c0ffee")
    # A sandbox on an engine that does not answer fails at once, not after a timeout.
    with pytest.raises(ProviderError, match="engine"):
        fleet.exec("b:c0ffee", ExecRequest(command="true"))


def test_every_docker_provider_method_reaches_the_right_engine() -> None:
    """Methods added to DockerProvider must either take the provider_id first (routed) or
    be wrapped in DockerEngines: a new one that is neither fails here."""
    unrouted = []
    for name, member in inspect.getmembers(DockerProvider, inspect.isfunction):
        if name.startswith("_") or hasattr(DockerEngines, name):
            continue
        params = list(inspect.signature(member).parameters)[1:]
        if not params or params[0] != "provider_id":
            unrouted.append(name)
    assert unrouted == []


def test_required_labels_come_from_the_setting(settings, org_a) -> None:  # type: ignore[no-untyped-def]
    settings.SANDPIT_DOCKER_ENGINE_REQUIREMENTS = f"org:{org_a.slug}=gpu, template:cuda=big"
    assert engine_label_required(org_a, "default") == "gpu"
    assert engine_label_required(org_a, "cuda") == "big"  # the template's need wins
    other = Organization(name="x", slug="x")
    assert engine_label_required(other, "default") == ""


@pytest.mark.django_db
def test_lost_engine_marks_only_its_own_rows(org_a) -> None:  # type: ignore[no-untyped-def]
    """Rows made before rows recorded their engine (engine '') run on the first engine."""
    rows = {
        name: Sandbox.objects.create(
            organization=org_a,
            provider=provider,
            engine=engine,
            state=state,
            timeout_s=60,
            expires_at=timezone.now() + timedelta(hours=1),
        )
        for name, provider, engine, state in [
            ("on_b", "docker", "b", SandboxState.RUNNING),
            ("paused_on_b", "docker", "b", SandboxState.PAUSED),
            ("stopped_on_b", "docker", "b", SandboxState.STOPPED),
            ("on_a", "docker", "a", SandboxState.RUNNING),
            ("legacy", "docker", "", SandboxState.RUNNING),
            ("local", "local", "", SandboxState.RUNNING),
        ]
    }
    assert sorted(sandboxes_mark_lost("b", "gone")) == sorted(
        [rows["on_b"].id, rows["paused_on_b"].id]
    )
    assert sandboxes_mark_lost("b", "gone") == []  # idempotent
    assert set(sandboxes_mark_lost("a", "gone", first=True)) == {rows["on_a"].id, rows["legacy"].id}
    states = {name: Sandbox.objects.get(pk=row.pk).state for name, row in rows.items()}
    assert states == {
        "on_b": SandboxState.ERROR,
        "paused_on_b": SandboxState.ERROR,
        "stopped_on_b": SandboxState.STOPPED,
        "on_a": SandboxState.ERROR,
        "legacy": SandboxState.ERROR,
        "local": SandboxState.RUNNING,
    }


# --- two real engines -------------------------------------------------------------------------------


def _engine(command: str, *args: str) -> str:
    done = subprocess.run(
        [str(SCRIPT), command, ENGINE_B, *args], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture(scope="session")
def engine_b() -> Iterator[str]:
    """The second engine's URL, with the sandbox image; stopped at the end of the session."""
    image = docker_provider_or_skip().image
    started = subprocess.run(
        [str(SCRIPT), "start", ENGINE_B, image], capture_output=True, text=True, timeout=300
    )
    if started.returncode != 0:
        missing_part(f"a second Docker engine (scripts/docker-engine.sh): {started.stderr[-500:]}")
    yield started.stdout.strip()
    _engine("stop")


def _containers(url: str, installation: str) -> list[str]:
    out = subprocess.run(
        [
            "docker",
            "-H",
            url,
            "ps",
            "-aq",
            "--filter",
            f"label=sandpit.installation={installation}",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.split()


@pytest.fixture
def two_engines(settings, engine_b):  # type: ignore[no-untyped-def]
    installation = f"engines-{uuid.uuid4().hex[:8]}"
    settings.SANDPIT_PROVIDERS = ["docker"]
    settings.SANDPIT_DEFAULT_PROVIDER = "docker"
    settings.SANDPIT_INSTALLATION = installation
    settings.SANDPIT_DOCKER_IMAGE = docker_provider_or_skip().image
    settings.SANDPIT_DOCKER_HOSTS = (
        f"unix:///var/run/docker.sock#name=a {engine_b}#name=b&label=gpu"
    )
    settings.SANDPIT_DOCKER_ENGINE_LOST_S = 0
    settings.SANDPIT_DOCKER_POOL_SIZE = 0  # these sandboxes are not the pool's common spec
    settings.SANDPIT_ORPHAN_GRACE_S = 0
    reset_providers()
    yield installation
    provider = get_provider("docker")
    try:
        for handle in provider.list_sandboxes():
            provider.destroy(handle.provider_id)
    finally:
        reset_providers()
        _engine("start")  # a test that failed half-way may have left it stopped


def _in_threads(fn, items: list, workers: int = 8) -> list:  # type: ignore[no-untyped-def,type-arg]
    def run(item):  # type: ignore[no-untyped-def]
        try:
            return fn(item)
        finally:
            connection.close()

    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(run, items))


@pytest.mark.django_db(transaction=True)
def test_engines_share_the_load_and_survive_one_stopping(  # type: ignore[no-untyped-def]
    two_engines, settings, org_a, alice, engine_b
) -> None:
    installation = two_engines
    Organization.objects.filter(pk=org_a.pk).update(max_concurrent_sandboxes=50)
    org_a.refresh_from_db()
    principal = Principal(organization=org_a, user=alice)

    def create(_: int) -> Sandbox:
        return sandbox_create(principal=principal, provider_name="docker", resources=SMALL)

    # Placement spreads parallel creates by free memory over both engines.
    sandboxes = _in_threads(create, list(range(20)))
    spread = Counter(s.engine for s in sandboxes)
    assert set(spread) == {"a", "b"} and abs(spread["a"] - spread["b"]) <= 2, spread
    on_b = [s for s in sandboxes if s.engine == "b"]
    on_a = [s for s in sandboxes if s.engine == "a"]
    assert all(s.provider_id.startswith("b:") for s in on_b)
    assert not any(":" in s.provider_id for s in on_a)
    # Each container is on the engine its row names, and operations reach it there.
    assert len(_containers(engine_b, installation)) == len(on_b)
    assert len(_containers("unix:///var/run/docker.sock", installation)) == len(on_a)
    for sandbox in (on_a[0], on_b[0]):
        result = sandbox_exec(caller=_caller(principal), sandbox=sandbox, command="echo $HOSTNAME")
        assert result.stdout == b"sandbox\n"
    # Methods DockerProvider gained elsewhere (pause, the agent's socket) reach b too.
    provider = get_provider("docker")
    provider.pause(on_b[0].provider_id)
    assert _inspect(engine_b, on_b[0].provider_id)["State"]["Paused"] is True
    provider.resume(on_b[0].provider_id)
    assert _inspect(engine_b, on_b[0].provider_id)["State"]["Paused"] is False
    provider.agent_socket(on_b[0].provider_id).close()

    # An organization that requires a label lands on the engines carrying it.
    settings.SANDPIT_DOCKER_ENGINE_REQUIREMENTS = f"org:{org_a.slug}=gpu"
    gpu = _in_threads(create, [0, 1, 2])
    assert {s.engine for s in gpu} == {"b"}
    settings.SANDPIT_DOCKER_ENGINE_REQUIREMENTS = f"org:{org_a.slug}=tpu"
    with pytest.raises(ProviderNotConfigured, match="label 'tpu'"):
        create(0)
    settings.SANDPIT_DOCKER_ENGINE_REQUIREMENTS = ""
    on_b += gpu

    # Engine b stops: its sandboxes are lost (error, with the reason, and an event).
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(sandbox_events_group(on_b[0].id), channel)
    _engine("stop")
    report = engines_check()
    assert (report.up, report.down) == (["a"], ["b"])
    assert sorted(report.lost) == sorted(s.id for s in on_b)
    lost = Sandbox.objects.get(pk=on_b[0].pk)
    assert lost.state == SandboxState.ERROR
    assert "Docker engine 'b'" in lost.error_message and "stopped answering" in lost.error_message
    event = async_to_sync(_receive)(layer, channel)["event"]
    assert (event["state"], event["reason"]) == ("error", "engine_lost")
    assert Sandbox.objects.get(pk=on_a[0].pk).state == SandboxState.RUNNING
    with pytest.raises(ApplicationError) as refused:
        sandbox_exec(caller=_caller(principal), sandbox=lost, command="true")
    assert refused.value.code == "sandbox_not_running"

    # New sandboxes go to the engine that answers; health and metrics say which is down.
    later = _in_threads(create, [0, 1, 2])
    assert {s.engine for s in later} == {"a"}
    ready = _ready()
    assert ready["components"]["provider:docker"]["status"] == "ok"
    assert ready["docker_engines"]["b"]["status"] == "down"
    assert ready["docker_engines"]["a"]["running"] == len(on_a) + len(later)
    metrics = _metrics()
    assert 'sandpit_docker_engine_up{engine="b"} 0' in metrics
    assert 'sandpit_docker_engine_up{engine="a"} 1' in metrics
    assert 'sandpit_sandboxes_lost_total{engine="b"}' in metrics

    # The reaper moves the lost rows on to destroyed while the engine is still down...
    reconcile_sandboxes()
    assert set(
        Sandbox.objects.filter(pk__in=[s.pk for s in on_b]).values_list("state", flat=True)
    ) == {SandboxState.DESTROYED}

    # ...and once b answers again its containers, owned by no live row, are removed.
    _engine("start")
    assert engines_check().down == []
    swept = reconcile_orphans()
    assert len(swept.orphans_destroyed) == len(on_b)
    assert all(pid.startswith("b:") for pid in swept.orphans_destroyed)

    # Nothing leaks: containers on both engines, agent directories, live rows.
    for sandbox in on_a + later:
        assert sandbox_destroy(sandbox=Sandbox.objects.get(pk=sandbox.pk))
    assert _containers(engine_b, installation) == []
    assert _containers("unix:///var/run/docker.sock", installation) == []
    agents = django_settings.VAR_DIR / "docker-agents"
    assert list(agents.glob(f"sandpit-{installation}-*")) == []
    # The create refused for want of a 'tpu' engine left an error row: the reconciler ends it.
    reconcile_sandboxes()
    assert not Sandbox.objects.exclude(state=SandboxState.DESTROYED).exists()


def test_sandboxes_go_where_their_image_is_and_not_to_a_draining_engine(engine_b) -> None:  # type: ignore[no-untyped-def]
    """An image on one engine only (a template built there) takes its sandboxes there; an
    engine marked drain=1 takes none."""
    only_a = f"sandpit-sandbox:engines-only-a-{uuid.uuid4().hex[:8]}"
    subprocess.run(["docker", "tag", docker_provider_or_skip().image, only_a], check=True)
    fleet = DockerEngines(
        parse_engines(f"unix:///var/run/docker.sock#name=a,{engine_b}#name=b", ""),
        image=only_a,
        installation=f"engines-{uuid.uuid4().hex[:8]}",
    )
    made = []
    try:
        for _ in range(3):
            spec = SandboxSpec(sandbox_id=uuid.uuid4().hex, resources=Resources(memory_mb=64))
            made.append(fleet.create(spec).provider_id)
        assert not any(":" in provider_id for provider_id in made)  # all on a
        assert fleet.exec(made[0], ExecRequest(command="true")).exit_code == 0
        drained = DockerEngines(
            parse_engines(f"unix:///var/run/docker.sock#name=a&drain=1,{engine_b}#name=b", ""),
            image=docker_provider_or_skip().image,
            installation=fleet.installation,
        )
        spec = SandboxSpec(sandbox_id=uuid.uuid4().hex, resources=Resources(memory_mb=64))
        made.append(drained.create(spec).provider_id)
        assert made[-1].startswith("b:")
    finally:
        for provider_id in made:
            fleet.destroy(provider_id)
        subprocess.run(["docker", "rmi", only_a], capture_output=True)
        fleet.close()


async def _receive(layer, channel: str) -> dict:  # type: ignore[no-untyped-def,type-arg]
    return await asyncio.wait_for(layer.receive(channel), timeout=10)


def _inspect(url: str, provider_id: str) -> dict:  # type: ignore[type-arg]
    cid = provider_id.partition(":")[2] or provider_id
    out = subprocess.run(["docker", "-H", url, "inspect", cid], capture_output=True, check=True)
    return json.loads(out.stdout)[0]


def _caller(principal: Principal) -> Caller:
    return Caller(principal)


def _ready() -> dict:  # type: ignore[type-arg]
    return json.loads(Client().get("/health/ready").content)


def _metrics() -> str:
    return render_metrics()
