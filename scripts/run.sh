#!/usr/bin/env bash
# One command: install, migrate, ensure the demo login, then serve daphne + Celery worker + beat
# on embedded defaults (SQLite, in-memory channel layer, filesystem broker, local provider).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export DJANGO_SETTINGS_MODULE=playground.settings
VAR_DIR=${SANDPIT_VAR_DIR:-var}
mkdir -p "$VAR_DIR"
PY=.venv/bin/python
$PY manage.py migrate --noinput
$PY manage.py ensure_demo
# Built-in templates (python, node) in the background when Docker is here: minutes the first
# time (apt), about a second after; `manage.py build_templates polyglot` adds the big one.
if docker image inspect sandpit-base:bookworm >/dev/null 2>&1; then
  $PY manage.py build_templates --quiet python node >"$VAR_DIR/build_templates.log" 2>&1 &
fi

pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM

.venv/bin/celery -A playground worker --loglevel=INFO --concurrency=2 --without-gossip --without-mingle &
pids+=($!)
.venv/bin/celery -A playground beat --loglevel=INFO --schedule "$VAR_DIR/celerybeat-schedule" &
pids+=($!)
# playground.webserver is daphne with a ceiling on request bodies. SANDPIT_WEB_PROCESSES=auto
# (the default) runs one per core on the port once REDIS_URL is set, and one on the embedded
# defaults, whose channel layer and cache are per process (playground/webprocs.py says why).
.venv/bin/python -m playground.webserver -b "${SANDPIT_BIND:-127.0.0.1}" -p "${SANDPIT_PORT:-8000}" playground.asgi:application &
pids+=($!)
url_host=${SANDPIT_BIND:-127.0.0.1}
[ "$url_host" = 0.0.0.0 ] && url_host=127.0.0.1
echo "==> Sandpit is starting on http://$url_host:${SANDPIT_PORT:-8000}/ (Ctrl-C stops everything)"
wait -n "${pids[@]}"
