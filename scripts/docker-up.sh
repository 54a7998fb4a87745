#!/usr/bin/env bash
# Make sure a Docker engine answers on this machine; start one if not.
#
# Idempotent: when `docker info` already works it does nothing. Otherwise it
# installs docker.io (only when dockerd is missing), starts dockerd in the
# background logging to /var/log/dockerd.log, and waits for it. When the
# overlay2 storage driver cannot start here (nested or odd kernels) it retries
# with fuse-overlayfs and then vfs. Exits non-zero with a reason on failure.
set -euo pipefail

LOG=${DOCKERD_LOG:-/var/log/dockerd.log}
TIMEOUT_S=${DOCKER_UP_TIMEOUT_S:-60}

say() { echo "docker-up: $*" >&2; }

engine_ok() { docker info >/dev/null 2>&1; }

# gVisor: when runsc is installed, register it (and runsc-net, for networked sandboxes)
# in daemon.json, which dockerd reads at start and re-reads for runtimes on SIGHUP, so an
# engine already running without them gets them without a restart.
DAEMON_JSON=${DOCKER_DAEMON_JSON:-/etc/docker/daemon.json}
RUNSC=${RUNSC:-/usr/bin/runsc}
runsc_wanted() { [ -x "$RUNSC" ] && [ "$(id -u)" = 0 ]; }
runsc_registered() {
    local have
    have=$(docker info --format '{{json .Runtimes}}' 2>/dev/null) || return 1
    [[ "$have" == *'"runsc"'* && "$have" == *'"runsc-net"'* ]]
}
write_runsc_config() {
    mkdir -p "$(dirname "$DAEMON_JSON")"
    # ptrace: needs no KVM (KVM here hangs runsc under nesting). Offline sandboxes keep
    # gVisor's own network stack (--network=none: loopback only); runsc-net hands sockets
    # to the host kernel inside the container's namespace, the mode that works with
    # Docker's bridge for this runsc (see sandboxes/providers/docker.py).
    python3 - "$DAEMON_JSON" "$RUNSC" <<'PY'
import json, os, sys
path, runsc = sys.argv[1], sys.argv[2]
config = {}
if os.path.exists(path):
    with open(path) as f:
        config = json.load(f)
runtimes = config.setdefault("runtimes", {})
runtimes["runsc"] = {"path": runsc, "runtimeArgs": ["--platform=ptrace", "--network=none"]}
runtimes["runsc-net"] = {"path": runsc, "runtimeArgs": ["--platform=ptrace", "--network=host"]}
with open(path + ".tmp", "w") as f:
    json.dump(config, f, indent=2)
os.replace(path + ".tmp", path)
PY
}
register_runsc() {
    runsc_wanted || return 0
    runsc_registered && return 0
    write_runsc_config
    local pid
    pid=$(pgrep -x dockerd | head -n1 || true)
    [ -n "$pid" ] || return 0
    say "registering runsc with the running engine (SIGHUP to dockerd pid $pid)"
    kill -HUP "$pid"
    local deadline=$((SECONDS + 20))
    while [ $SECONDS -lt $deadline ]; do
        runsc_registered && return 0
        sleep 0.25
    done
    say "dockerd did not pick up the runsc runtimes from $DAEMON_JSON; see $LOG"
    return 1
}

if engine_ok; then
    register_runsc
    exit 0
fi
runsc_wanted && write_runsc_config

if [ -n "${DOCKER_HOST:-}" ] && [[ "${DOCKER_HOST}" != unix://* ]]; then
    say "DOCKER_HOST=${DOCKER_HOST} is remote and does not answer; not starting a local engine"
    exit 1
fi

if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker >/dev/null 2>&1; then
    if [ "$(id -u)" != 0 ]; then
        say "dockerd is not installed and we are not root; install docker.io first"
        exit 1
    fi
    say "installing docker.io"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq docker.io >/dev/null
fi

if [ "$(id -u)" != 0 ]; then
    say "the engine is not running and only root can start dockerd"
    exit 1
fi

# A dockerd we (or someone) started earlier may still be coming up: wait for
# it instead of starting a second one that would fight over the pid file.
wait_engine() {
    local deadline=$((SECONDS + $1))
    while [ $SECONDS -lt $deadline ]; do
        engine_ok && return 0
        if [ -n "${2:-}" ] && ! kill -0 "$2" 2>/dev/null; then
            return 1
        fi
        sleep 0.25
    done
    return 1
}

existing=$(pgrep -x dockerd || true)
if [ -n "$existing" ]; then
    say "dockerd (pid $existing) is running but not answering yet; waiting"
    if wait_engine "$TIMEOUT_S" "$existing"; then
        register_runsc
        exit 0
    fi
    say "dockerd pid $existing did not answer within ${TIMEOUT_S}s; see $LOG"
    exit 1
fi

# containerd is started by dockerd itself when not running.
start_dockerd() {
    local driver=$1
    say "starting dockerd (storage driver: ${driver})"
    echo "=== $(date -Is) docker-up: dockerd --storage-driver=${driver}" >>"$LOG"
    setsid nohup dockerd --storage-driver="$driver" >>"$LOG" 2>&1 </dev/null &
    local pid=$!
    if wait_engine "$TIMEOUT_S" "$pid"; then
        say "engine up (storage driver ${driver}, pid ${pid}) after $((SECONDS - started))s"
        return 0
    fi
    if kill -0 "$pid" 2>/dev/null; then
        kill "$pid" 2>/dev/null || true
        sleep 1
    fi
    return 1
}

started=$SECONDS
drivers=${DOCKER_STORAGE_DRIVERS:-"overlay2 fuse-overlayfs vfs"}
for driver in $drivers; do
    if [ "$driver" = fuse-overlayfs ] && ! command -v fuse-overlayfs >/dev/null 2>&1; then
        continue
    fi
    if start_dockerd "$driver"; then
        exit 0
    fi
    say "dockerd with ${driver} failed; last log lines:"
    tail -n 5 "$LOG" >&2 || true
done

say "could not start the Docker engine (tried: ${drivers}); see $LOG"
exit 1
