# The Sandpit application image: web (daphne), Celery worker and beat all run from it.
#
# Built by scripts/build-app-image.sh, which stages a clean context (the source plus a
# wheelhouse of every Python dependency built on the host) so nothing here needs the
# network. The default base is the local debootstrap image (sandpit-base:bookworm, made by
# scripts/build-sandbox-image.sh: python3, tini, ca-certificates); it has no pip or
# ensurepip, so pip runs from its own wheel. An operator with a registry may build on
# python:3.11-slim-bookworm instead: --build-arg BASE_IMAGE=python:3.11-slim-bookworm.
ARG BASE_IMAGE=sandpit-base:bookworm
FROM ${BASE_IMAGE}

ENV LANG=C.UTF-8 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH \
    DJANGO_SETTINGS_MODULE=playground.settings \
    DJANGO_STATIC_ROOT=/app/staticfiles \
    SANDPIT_VAR_DIR=/app/var

RUN groupadd --system --gid 10001 sandpit \
 && useradd --system --uid 10001 --gid 10001 --home-dir /app --shell /usr/sbin/nologin sandpit

# Dependencies first: this layer is reused until the wheelhouse changes.
COPY wheelhouse/ /tmp/wheelhouse/
RUN python3 -m venv --without-pip /opt/venv \
 && pip_wheel=$(ls /tmp/wheelhouse/pip-*.whl) \
 && /opt/venv/bin/python "$pip_wheel/pip" install --no-cache-dir --no-index \
        --find-links /tmp/wheelhouse -r /tmp/wheelhouse/requirements.txt \
 && rm -rf /tmp/wheelhouse \
 && /opt/venv/bin/python -c "import django, celery, daphne, channels_redis, psycopg, docker, e2b, connectrpc, pydantic"

COPY app/ /app/
WORKDIR /app
# Static files are collected at build time with the production storage (hashed names and
# a manifest); the throwaway key and host exist only for this one command.
RUN DJANGO_ENV=production DJANGO_SECRET_KEY=build-only-build-only-build-only-build-only-0123456789 \
    DJANGO_ALLOWED_HOSTS=build.invalid \
    python manage.py collectstatic --noinput -v 0 \
 && mkdir -p /app/var \
 && chown -R sandpit:sandpit /app/var \
 && install -m 0755 /app/docker/app/entrypoint.sh /usr/local/bin/sandpit-entrypoint

USER sandpit
EXPOSE 8000
ENTRYPOINT ["/usr/bin/tini", "--", "sandpit-entrypoint"]
CMD ["web"]
