#!/bin/sh
# One image, several roles: `web` (daphne), `worker` (Celery), `beat`, `migrate`, or any
# command. Migrations run from the `migrate` one-shot service, never from several web
# containers at once.
set -eu
role=${1:-web}
case "$role" in
  web)
    shift || true
    # daphne with a ceiling on request bodies (playground/webserver.py)
    exec python -m playground.webserver -b 0.0.0.0 -p 8000 --proxy-headers playground.asgi:application "$@"
    ;;
  worker)
    shift
    exec celery -A playground worker --loglevel="${SANDPIT_LOG_LEVEL:-INFO}" \
      --concurrency="${SANDPIT_WORKER_CONCURRENCY:-4}" --without-gossip --without-mingle "$@"
    ;;
  beat)
    shift
    # Exactly one beat per installation: the schedule is in code, its state in /app/var.
    exec celery -A playground beat --loglevel="${SANDPIT_LOG_LEVEL:-INFO}" \
      --schedule /app/var/celerybeat-schedule "$@"
    ;;
  migrate)
    shift
    exec python manage.py migrate --noinput "$@"
    ;;
  *)
    exec "$@"
    ;;
esac
