#!/usr/bin/env bash
# Build the sandbox image without any registry: debootstrap a Debian rootfs on
# the host (the only step that needs deb.debian.org), import it as
# sandpit-base:bookworm, then `docker build` docker/sandbox/ on top of it.
#
# Idempotent and cached:
#   * sandpit-sandbox:<hash of docker/sandbox/* and the package list> exists
#     -> only (re)tag it sandpit-sandbox:latest;
#   * prints the content tag (sandpit-sandbox:<hash>) on stdout: other checkouts on
#     the machine retag :latest, the content tag names exactly this tree's image;
#   * the debootstrap rootfs tarball is kept under /var/cache/sandpit/, so a
#     rebuild after `docker system prune` skips the download;
#   * sandpit-base:bookworm(-<package hash>) is re-imported only when the package
#     list changed.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CONTEXT="$ROOT/docker/sandbox"
CACHE=${SANDPIT_CACHE_DIR:-/var/cache/sandpit}
SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
PACKAGES=python3,nodejs,bash,procps,coreutils,inotify-tools,ca-certificates,tini,iproute2
BASE=sandpit-base:$SUITE
IMAGE=sandpit-sandbox

say() { echo "build-sandbox-image: $*" >&2; }
now_ms() { date +%s%3N; }
t0=$(now_ms)

pkg_hash=$(printf '%s %s' "$SUITE" "$PACKAGES" | sha256sum | cut -c1-12)
# The agent bundle is named by its content hash, so a changed agent changes the tag.
agent_name=$(python3 "$ROOT/sandboxes/providers/agent_bundle.py" --name)
ctx_hash=$( (cd "$CONTEXT" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum; echo "$pkg_hash $agent_name") \
    | sha256sum | cut -c1-12)
TAG="$IMAGE:$ctx_hash"

if docker image inspect "$TAG" >/dev/null 2>&1; then
    docker tag "$TAG" "$IMAGE:latest"
    say "$TAG is up to date (tagged $IMAGE:latest) in $(($(now_ms) - t0)) ms"
    echo "$TAG"
    exit 0
fi

# The base is tagged with its package-list hash too, so a changed list rebuilds it.
# (No LABELs on either image: containers inherit image labels, and the
# provider's labels are the ones that mean something.)
if docker image inspect "$BASE-$pkg_hash" >/dev/null 2>&1; then
    docker tag "$BASE-$pkg_hash" "$BASE"
else
    tarball="$CACHE/rootfs-$SUITE-$pkg_hash.tar"
    if [ ! -s "$tarball" ]; then
        if [ "$(id -u)" != 0 ]; then
            say "debootstrap needs root"
            exit 1
        fi
        mkdir -p "$CACHE"
        dir=$(mktemp -d "$CACHE/rootfs.XXXXXX")
        trap 'rm -rf "$dir"' EXIT
        say "debootstrap $SUITE ($PACKAGES) from $MIRROR"
        t1=$(now_ms)
        debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$dir" "$MIRROR" \
            >"$CACHE/debootstrap.log" 2>&1 || {
            say "debootstrap failed; last lines of $CACHE/debootstrap.log:"
            tail -n 20 "$CACHE/debootstrap.log" >&2
            exit 1
        }
        # Package caches and lists are dead weight in an image nobody apt-gets in.
        rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*
        tar -C "$dir" --numeric-owner -cf "$tarball.part" .
        mv "$tarball.part" "$tarball"
        rm -rf "$dir"
        trap - EXIT
        say "debootstrap done in $(($(now_ms) - t1)) ms ($(du -h "$tarball" | cut -f1))"
    else
        say "using cached rootfs $tarball"
    fi
    t1=$(now_ms)
    docker import --change 'CMD ["/bin/bash"]' "$tarball" "$BASE-$pkg_hash" >/dev/null
    docker tag "$BASE-$pkg_hash" "$BASE"
    say "imported $BASE in $(($(now_ms) - t1)) ms"
fi

t1=$(now_ms)
# The context plus the agent bundle, in a copy (the bundle is built from sandboxes/agent/).
build_dir=$(mktemp -d)
trap 'rm -rf "$build_dir"' EXIT
cp -a "$CONTEXT/." "$build_dir/"
python3 "$ROOT/sandboxes/providers/agent_bundle.py" "$build_dir" >/dev/null
# The classic builder needs no buildx plugin and no network for a FROM that
# exists locally; --pull=false keeps it from ever asking a registry.
if ! DOCKER_BUILDKIT=0 docker build --pull=false -t "$TAG" -t "$IMAGE:latest" "$build_dir" \
    >"$build_dir/build.log" 2>&1; then
    say "docker build failed:"
    cat "$build_dir/build.log" >&2
    exit 1
fi
# Older content-hash tags are dead weight, but other checkouts on this machine may be
# testing with theirs: keep the newest few; an image still used by a container stays.
for old in $(docker images --format '{{.Repository}}:{{.Tag}}' "$IMAGE" | grep -v -e ":latest$" -e "^$TAG$" | tail -n +5); do
    docker rmi "$old" >/dev/null 2>&1 || true
done
say "built $TAG (+ $IMAGE:latest) in $(($(now_ms) - t1)) ms; total $(($(now_ms) - t0)) ms"
echo "$TAG"
