#!/usr/bin/env bash
# Build the Sandpit application image (sandpit-app) without any registry.
#
#   1. The base is sandpit-base:bookworm from scripts/build-sandbox-image.sh (run it first;
#      this script does not touch it). Override with BASE_IMAGE=... (e.g. a registry's
#      python:3.11-slim-bookworm).
#   2. A wheelhouse of every runtime dependency is built on the host with the project's
#      pip (pinned to the versions in .venv), cached under var/app-build/ by the hash of
#      pyproject.toml and those pins.
#   3. A clean context (tracked and untracked-but-not-ignored source files, no tests, no
#      .venv) plus the wheelhouse is staged and built with the classic builder.
#
# Cached: when sandpit-app:<hash of the context> exists it is only re-tagged :latest.
# Usage: scripts/build-app-image.sh [extra tag...]   (prints the image id's tag on stdout)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
BASE_IMAGE=${BASE_IMAGE:-sandpit-base:bookworm}
IMAGE=${SANDPIT_APP_IMAGE_NAME:-sandpit-app}
BUILD=${SANDPIT_APP_BUILD_DIR:-$ROOT/var/app-build}
PIP=${PIP:-$ROOT/.venv/bin/pip}
PY=${PY:-$ROOT/.venv/bin/python}

say() { echo "build-app-image: $*" >&2; }
now_ms() { date +%s%3N; }
t0=$(now_ms)

if ! docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    say "base image $BASE_IMAGE is missing: run scripts/build-sandbox-image.sh first"
    exit 1
fi
mkdir -p "$BUILD"

# --- wheelhouse ----------------------------------------------------------------------------
reqs="$BUILD/requirements.in"
"$PY" - "$ROOT/pyproject.toml" >"$reqs" <<'PYEOF'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    deps = tomllib.load(f)["project"]["dependencies"]
print("\n".join(sorted(deps)))
PYEOF
pins="$BUILD/pins.txt"
"$PIP" freeze --exclude-editable 2>/dev/null | grep -v '^-e ' | grep -v ' @ ' >"$pins" || true
wh_hash=$(cat "$reqs" "$pins" | sha256sum | cut -c1-12)
wheelhouse="$BUILD/wheelhouse-$wh_hash"
if [ ! -f "$wheelhouse/requirements.txt" ]; then
    say "building wheelhouse $wh_hash"
    rm -rf "$wheelhouse.part"
    mkdir -p "$wheelhouse.part"
    # async-timeout: redis needs it on the base's Python 3.11.2 (< 3.11.3) though not on
    # a newer host Python, whose resolver would otherwise leave it out.
    "$PIP" wheel -q --wheel-dir "$wheelhouse.part" -c "$pins" -r "$reqs" pip async-timeout \
        2> >(grep -v '^WARNING: Location' >&2) >&2
    cp "$reqs" "$wheelhouse.part/requirements.txt"
    rm -rf "$wheelhouse"
    mv "$wheelhouse.part" "$wheelhouse"
fi

# --- context -------------------------------------------------------------------------------
ctx="$BUILD/context"
rm -rf "$ctx"
mkdir -p "$ctx/app"
git -C "$ROOT" ls-files -co --exclude-standard -z \
    | grep -zvE '^(tests|bench|\.ci|\.github|docker/sandbox)/' \
    | grep -zvE '^(Dockerfile|docker-compose\.yml|\.env.*)$' \
    | while IFS= read -r -d '' f; do [ -f "$f" ] && printf '%s\0' "$f"; done \
    | xargs -0 cp --parents -t "$ctx/app"
cp "$ROOT/Dockerfile" "$ctx/Dockerfile"
cp -al "$wheelhouse" "$ctx/wheelhouse" 2>/dev/null || cp -a "$wheelhouse" "$ctx/wheelhouse"
ctx_hash=$( (cd "$ctx" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum; \
    echo "$BASE_IMAGE $(docker image inspect -f '{{.Id}}' "$BASE_IMAGE")") | sha256sum | cut -c1-12)
TAG="$IMAGE:$ctx_hash"

if docker image inspect "$TAG" >/dev/null 2>&1; then
    docker tag "$TAG" "$IMAGE:latest"
else
    say "building $TAG on $BASE_IMAGE"
    log=$(mktemp)
    if ! DOCKER_BUILDKIT=0 docker build --pull=false --build-arg "BASE_IMAGE=$BASE_IMAGE" \
        -t "$TAG" -t "$IMAGE:latest" "$ctx" >"$log" 2>&1; then
        say "docker build failed:"
        cat "$log" >&2
        rm -f "$log"
        exit 1
    fi
    rm -f "$log"
fi
# Drop older content-hash tags of this image (layers shared with the new one stay).
docker images "$IMAGE" --format '{{.Tag}}' | grep -xE '[0-9a-f]{12}' | grep -vx "$ctx_hash" \
    | while read -r old; do docker rmi "$IMAGE:$old" >/dev/null 2>&1 || true; done || true
for extra in "$@"; do
    docker tag "$TAG" "$extra"
done
say "$TAG (+ $IMAGE:latest) ready in $(($(now_ms) - t0)) ms"
echo "$TAG"
