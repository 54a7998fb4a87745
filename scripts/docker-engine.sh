#!/usr/bin/env bash
# A second (third...) Docker engine on this machine, for the multi-engine tests.
#
#   scripts/docker-engine.sh start NAME [IMAGE]   # prints the engine's URL (unix://...)
#   scripts/docker-engine.sh stop NAME            # SIGTERM, waits until dockerd has exited
#   scripts/docker-engine.sh url NAME
#
# Each engine is a dockerd of its own, apart from the machine's engine in every place two
# dockerds would fight over: its socket, pid file, data root, exec root (so its own managed
# containerd), config file (the machine's daemon.json is not read), cgroup parent and bridge:
# a bridge interface of its own (sp-NAME, 172.30.N.1/24), no iptables rules, so networked
# sandboxes there reach no further than the host. Never --bridge=none: a dockerd started
# that way deletes docker0, the machine engine's bridge, on its way up. The data root is
# kept between runs, so the sandbox IMAGE, copied from the machine's engine once
# (`docker save | docker load`), is there next time: only a new image tag costs a load.
# Idempotent: `start` on an answering engine only checks the image.
set -euo pipefail

cmd=${1:?usage: docker-engine.sh start|stop|url NAME [IMAGE]}
name=${2:?engine name}
image=${3:-}
[[ "$name" =~ ^[a-z0-9-]{1,20}$ ]] || { echo "docker-engine: bad name $name" >&2; exit 2; }

run_dir=/run/sandpit-engine-$name
data_dir=${SANDPIT_ENGINE_DATA:-/var/lib/sandpit-engine}-$name
sock=$run_dir/docker.sock
url=unix://$sock
pidfile=$run_dir/dockerd.pid
bridge=sp-$name
bridge=${bridge:0:15}
subnet=${SANDPIT_ENGINE_SUBNET:-172.30.$(( $(cksum <<<"$name" | cut -d' ' -f1) % 250 + 1 )).1/24}
log=$data_dir.log
TIMEOUT_S=${DOCKER_UP_TIMEOUT_S:-60}

say() { echo "docker-engine[$name]: $*" >&2; }
answers() { docker -H "$url" version --format '{{.Server.Version}}' >/dev/null 2>&1; }
running_pid() {
    local pid
    pid=$(cat "$pidfile" 2>/dev/null || true)
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

start() {
    if ! answers; then
        [ "$(id -u)" = 0 ] || { say "only root can start dockerd"; exit 1; }
        command -v dockerd >/dev/null || { say "dockerd is not installed"; exit 1; }
        if [ -n "$(running_pid || true)" ]; then
            say "dockerd $(running_pid) is starting; waiting"
        else
            mkdir -p "$run_dir" "$data_dir"
            if ! ip link show "$bridge" >/dev/null 2>&1; then
                ip link add "$bridge" type bridge
                ip addr add "$subnet" dev "$bridge"
                ip link set "$bridge" up
            fi
            chmod 711 "$run_dir"
            echo '{}' >"$data_dir.json"
            echo "=== $(date -Is) start" >>"$log"
            setsid nohup dockerd \
                --host "$url" --pidfile "$pidfile" \
                --data-root "$data_dir" --exec-root "$run_dir/exec" \
                --config-file "$data_dir.json" --cgroup-parent "sandpit-engine-$name" \
                --bridge="$bridge" --iptables=false --ip-masq=false --ip-forward=false \
                --userland-proxy=false --storage-driver="${SANDPIT_ENGINE_STORAGE:-overlay2}" \
                >>"$log" 2>&1 </dev/null &
        fi
        local deadline=$((SECONDS + TIMEOUT_S))
        until answers; do
            if [ $SECONDS -ge $deadline ]; then
                say "did not answer within ${TIMEOUT_S}s; see $log"
                tail -n 5 "$log" >&2 || true
                exit 1
            fi
            sleep 0.1
        done
    fi
    if [ -n "$image" ] && ! docker -H "$url" image inspect "$image" >/dev/null 2>&1; then
        say "loading $image from the machine's engine"
        docker save "$image" | docker -H "$url" load -q >/dev/null
        # Earlier builds of the same repository are not needed here any more.
        docker -H "$url" images --format '{{.Repository}}:{{.Tag}}' "${image%%:*}" \
            | grep -vxF "$image" | xargs -r docker -H "$url" rmi >/dev/null 2>&1 || true
    fi
    echo "$url"
}

stop() {
    local pid
    pid=$(running_pid || true)
    [ -n "$pid" ] || return 0
    kill -TERM "$pid"
    # dockerd stops its containers, then its containerd, then itself.
    local deadline=$((SECONDS + TIMEOUT_S))
    while kill -0 "$pid" 2>/dev/null; do
        if [ $SECONDS -ge $deadline ]; then
            say "dockerd $pid did not stop within ${TIMEOUT_S}s; killing it"
            kill -KILL "$pid" 2>/dev/null || true
            break
        fi
        sleep 0.05
    done
    ip link del "$bridge" 2>/dev/null || true
}

case "$cmd" in
    start) start ;;
    stop) stop ;;
    url) echo "$url" ;;
    *) echo "usage: docker-engine.sh start|stop|url NAME [IMAGE]" >&2; exit 2 ;;
esac
