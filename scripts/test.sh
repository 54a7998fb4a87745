#!/usr/bin/env bash
# One command runs the whole suite against the real parts: PostgreSQL, Redis, bubblewrap,
# a Docker engine (started here if needed) and headless Chromium.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh --dev

# PostgreSQL and Redis on this machine: start them when they are not running.
if ! pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then
  echo "==> starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
fi
# The live-server tests open many connections at once (32 clients, daphne's thread pool).
if [ "$(psql -h 127.0.0.1 -U postgres -tAc 'show max_connections' 2>/dev/null || echo 0)" -lt 300 ]; then
  echo "==> raising PostgreSQL max_connections to 400"
  psql -h 127.0.0.1 -U postgres -qc "ALTER SYSTEM SET max_connections = 400"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main restart
  until pg_isready -h 127.0.0.1 -p 5432 -q; do sleep 0.2; done
fi
if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  echo "==> starting Redis"
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
fi

# A Docker engine and the sandbox image (cached); the docker tests fail under CI without them.
if ! ./scripts/docker-up.sh; then
  echo "==> no Docker engine could be started; docker tests will skip (or fail under CI=true)"
fi
if docker info >/dev/null 2>&1; then
  # Its content tag, not :latest, which another checkout on this machine may retag.
  image=$(./scripts/build-sandbox-image.sh) && export SANDPIT_DOCKER_IMAGE=${SANDPIT_DOCKER_IMAGE:-$image}
  # Built-in templates, cached by content (a second run checks in about a second). polyglot
  # costs ~80 s and 1.8 GB more the first time; built here, in set-up, so the suite's language
  # tests do not build it themselves. SANDPIT_TEST_TEMPLATES="python node" leaves it out.
  # shellcheck disable=SC2086 # a list of names
  .venv/bin/python manage.py build_templates --no-db --quiet ${SANDPIT_TEST_TEMPLATES:-python node polyglot} \
    || echo "==> built-in templates could not be built; their tests will build them (or fail under CI=true)"
fi

export DATABASE_URL=${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/sandpit}
export REDIS_URL=${TEST_REDIS_URL:-redis://127.0.0.1:6379/15}
export SANDPIT_PROVIDERS=${SANDPIT_PROVIDERS:-local,docker}
# One pooled docker container per process: the pool is exercised by every docker test through
# the API, without each provider a test builds starting four containers in the background.
export SANDPIT_DOCKER_POOL_SIZE=${SANDPIT_DOCKER_POOL_SIZE:-1}
# Nor grow after tests that create several at once (tests/sandboxes/test_docker_pool.py
# tests the growth): the suite's engine would start containers no test claims.
export SANDPIT_DOCKER_POOL_MAX=${SANDPIT_DOCKER_POOL_MAX:-1}
# Likewise two warm jails per server the suite starts, no growth: each fills its pool as it
# starts listening, and 8 (up to 64) per server would start jails no test claims
# (tests/sandboxes/test_local_warm_pool.py tests the pool and its growth).
export SANDPIT_LOCAL_WARM_POOL=${SANDPIT_LOCAL_WARM_POOL:-2}
export SANDPIT_LOCAL_WARM_POOL_MAX=${SANDPIT_LOCAL_WARM_POOL_MAX:-2}
# Jail roots stay on the disk: the suite makes a root per test and removes it, and a tmpfs
# mounted on each would outlive it (tests/sandboxes/test_local_root_in_memory.py mounts and
# detaches its own).
export SANDPIT_LOCAL_ROOT_IN_MEMORY=${SANDPIT_LOCAL_ROOT_IN_MEMORY:-false}
export SANDPIT_ARTIFACTS=${SANDPIT_ARTIFACTS:-$PWD/var/test-artifacts}
# Local jails run as unprivileged host uids that must pass through every directory above their
# root; a checkout may sit under a private (0700) directory, so tests keep jails elsewhere.
export SANDPIT_LOCAL_ROOT=${SANDPIT_LOCAL_ROOT:-/tmp/sandpit-test-jails/default}
mkdir -p /tmp/sandpit-test-jails && chmod 711 /tmp/sandpit-test-jails
mkdir -p "$SANDPIT_ARTIFACTS"
# A worker per core (pytest-xdist), at most 4: most tests wait on servers, engines and
# browsers, so two workers on two cores take ~60% of the time of one. Each worker is an
# installation of its own (tests/conftest.py). SANDPIT_TEST_WORKERS=0 runs in this process.
# pyproject's addopts add `--dist loadgroup`: tests sharing one thing of the machine's carry
# one xdist_group mark and run on one worker (tests/playground/test_parallel_workers.py).
workers=${SANDPIT_TEST_WORKERS:-$(nproc)}
[ "$workers" -gt 4 ] && workers=4
exec .venv/bin/pytest -n "$workers" "$@"
