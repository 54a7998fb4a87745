"""Sandpit settings: every value comes from the environment with a safe default.

Embedded defaults (nothing set): SQLite, in-memory channel layer, a filesystem
Celery broker and the local (bubblewrap) provider. Production (DJANGO_ENV=production)
requires DJANGO_SECRET_KEY and DJANGO_ALLOWED_HOSTS and turns on every HTTPS setting.
"""

from __future__ import annotations

import os
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

BASE_DIR = Path(__file__).resolve().parent.parent


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be an integer, got {value!r}") from exc


def env_list(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


# --- Mode -------------------------------------------------------------------
DJANGO_ENV = env_str("DJANGO_ENV", "development")
PRODUCTION = DJANGO_ENV == "production"
DEBUG = env_bool("DJANGO_DEBUG", default=not PRODUCTION)

if PRODUCTION:
    SECRET_KEY = env_str("DJANGO_SECRET_KEY")
    if len(SECRET_KEY) < 50:
        raise ImproperlyConfigured(
            "DJANGO_SECRET_KEY must be set (50+ random characters) in production"
        )
    ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS")
    if not ALLOWED_HOSTS:
        raise ImproperlyConfigured("DJANGO_ALLOWED_HOSTS must be set in production")
else:
    # Development only: a fixed key is fine because nothing here is exposed.
    SECRET_KEY = env_str(
        "DJANGO_SECRET_KEY", "dev-insecure-sandpit-key-not-for-production-use-0123456789"
    )
    ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost,testserver,[::1]")

# Signing key for short-lived sandbox tokens (JWT, HS256); defaults to SECRET_KEY.
SANDBOX_TOKEN_SECRET = env_str("SANDPIT_TOKEN_SECRET", SECRET_KEY)
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS")

# --- Applications -------------------------------------------------------------
INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "servestatic",  # its system checks (the middleware serves the files)
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI's files, served from our static files
    "channels",
    "accounts",
    "sandboxes",
    "billing",
    "playground",
]


class _MiddlewareList(list):
    """MIDDLEWARE whose `in` also finds subclasses. Django's deploy checks test membership of
    dotted paths (e.g. django.middleware.security.SecurityMiddleware) and skip the HSTS, SSL,
    cookie and frame checks when it is absent; our inline subclasses must not silence them."""

    def __contains__(self, path: object) -> bool:
        if list.__contains__(self, path):
            return True
        try:
            wanted = import_string(str(path))
        except ImportError:
            return False
        return any(
            isinstance(cls, type) and issubclass(cls, wanted)
            for cls in (import_string(entry) for entry in self)
        )


MIDDLEWARE = _MiddlewareList(
    [
        # Outermost, so even Django's own refusals under /api/ leave as JSON.
        "common.errors.ApiErrorShapeMiddleware",
        # Django's own middleware, subclassed to run inline under ASGI (see playground/middleware.py).
        "common.metrics.LatencyMiddleware",
        "playground.middleware.SecurityMiddleware",
        "playground.csp.ContentSecurityPolicyMiddleware",
        "servestatic.middleware.ServeStaticMiddleware",
        "playground.middleware.RequestIdMiddleware",
        "playground.middleware.SessionMiddleware",
        "playground.middleware.CommonMiddleware",
        "playground.middleware.CsrfViewMiddleware",
        "playground.middleware.AuthenticationMiddleware",
        "playground.middleware.MessageMiddleware",
        "playground.middleware.XFrameOptionsMiddleware",
    ]
)

ROOT_URLCONF = "playground.urls"
ASGI_APPLICATION = "playground.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "accounts.context_processors.current_organization",
            ],
        },
    },
]

# Local state in the embedded mode: SQLite, the filesystem broker, local sandboxes, beat schedule.
VAR_DIR = Path(env_str("SANDPIT_VAR_DIR", str(BASE_DIR / "var")))

# --- Database -----------------------------------------------------------------
# Set by the web supervisor in each of its N servers (playground/webprocs.py): the
# connection pool's default is a share of 40 per machine past 2 processes (at least 5
# each), so one server per core stays under PostgreSQL's default max_connections (100).
SANDPIT_WEB_PROCESS_COUNT = max(1, env_int("SANDPIT_WEB_PROCESS_COUNT", 1))
DATABASE_URL = env_str("DATABASE_URL")
if DATABASE_URL:
    # Under ASGI every request runs its sync code on a fresh thread, so Django's persistent
    # connections (CONN_MAX_AGE) would open one connection per request and leak them; a
    # psycopg pool per process hands each request a warm connection instead.
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=0)}
    if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql" and env_bool(
        "DJANGO_DB_POOL", True
    ):
        DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
            "min_size": env_int("DJANGO_DB_POOL_MIN", 1),
            "max_size": env_int(
                "DJANGO_DB_POOL_MAX", min(20, max(5, 40 // SANDPIT_WEB_PROCESS_COUNT))
            ),
            "timeout": env_int("DJANGO_DB_POOL_TIMEOUT_S", 10),
        }
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": env_str("SANDPIT_SQLITE_PATH", str(VAR_DIR / "db.sqlite3")),
            # How long a write waits for SQLite's one write lock before it gives up (503).
            "OPTIONS": {
                "timeout": env_int("SANDPIT_SQLITE_BUSY_TIMEOUT_S", 20),
                "transaction_mode": "IMMEDIATE",
            },
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Redis: channel layer, Celery broker, cache ---------------------------------
REDIS_URL = env_str("REDIS_URL")

if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL], "prefix": env_str("SANDPIT_REDIS_PREFIX", "sandpit")},
        }
    }
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": env_str("SANDPIT_REDIS_PREFIX", "sandpit"),
        }
    }
    CELERY_BROKER_URL = REDIS_URL
    CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {}
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    # A broker that needs no server: kombu's filesystem transport under var/, with messages
    # that appear whole (playground/broker.py).
    CELERY_BROKER_URL = "filesystem://"
    CELERY_BROKER_TRANSPORT = "playground.broker:Transport"
    _broker_dir = VAR_DIR / "celery-broker"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "queue"),
        "data_folder_out": str(_broker_dir / "queue"),
        "processed_folder": str(_broker_dir / "processed"),
        # Broadcast (pidbox) exchanges; kombu's default is ./control in the working directory.
        "control_folder": str(_broker_dir / "control"),
        "store_processed": False,
    }
    for _folder in ("queue", "processed", "control"):
        (_broker_dir / _folder).mkdir(parents=True, exist_ok=True)

CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TIMEZONE = "UTC"

# --- Auth ---------------------------------------------------------------------
AUTH_USER_MODEL = "accounts.User"
# Django's password check with guesses throttled per account and client address (accounts/attempts.py).
AUTHENTICATION_BACKENDS = ["accounts.backends.ThrottledModelBackend"]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard"
LOGOUT_REDIRECT_URL = "login"
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
PASSWORD_HASHERS = env_list("SANDPIT_PASSWORD_HASHERS") or [
    "django.contrib.auth.hashers.PBKDF2PasswordHasher",
]
# Mail (signup links, password resets, invitations): printed on the console in development,
# sent through the SMTP server below in production.
EMAIL_BACKEND = env_str(
    "DJANGO_EMAIL_BACKEND",
    "django.core.mail.backends.smtp.EmailBackend"
    if PRODUCTION
    else "django.core.mail.backends.console.EmailBackend",
)
EMAIL_HOST = env_str("DJANGO_EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("DJANGO_EMAIL_PORT", 25)
EMAIL_HOST_USER = env_str("DJANGO_EMAIL_HOST_USER")
EMAIL_HOST_PASSWORD = env_str("DJANGO_EMAIL_HOST_PASSWORD")
EMAIL_USE_TLS = env_bool("DJANGO_EMAIL_USE_TLS", False)
EMAIL_USE_SSL = env_bool("DJANGO_EMAIL_USE_SSL", False)
EMAIL_TIMEOUT = env_int("DJANGO_EMAIL_TIMEOUT_S", 10)
DEFAULT_FROM_EMAIL = env_str("DJANGO_DEFAULT_FROM_EMAIL", "sandpit@localhost")
INVITATION_TTL_HOURS = env_int("SANDPIT_INVITATION_TTL_HOURS", 72)

# --- I18N / static ----------------------------------------------------------------
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(env_str("DJANGO_STATIC_ROOT", str(VAR_DIR / "staticfiles")))
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "servestatic.storage.CompressedManifestStaticFilesStorage"
        if PRODUCTION
        else "django.contrib.staticfiles.storage.StaticFilesStorage"
    },
}
SERVESTATIC_USE_FINDERS = not PRODUCTION
if not PRODUCTION:
    STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # servestatic warns when it is missing

# --- REST framework ---------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "accounts.authentication.ApiKeyAuthentication",
        "accounts.authentication.SandboxTokenAuthentication",
        "accounts.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["accounts.permissions.HasOrganization"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "common.negotiation.AnyFirstNegotiation",
    "DEFAULT_PARSER_CLASSES": ["common.parsers.JSONParser"],
    "DEFAULT_PAGINATION_CLASS": "common.pagination.CursorlessPagination",
    "PAGE_SIZE": 50,
    "EXCEPTION_HANDLER": "common.exception_handler.api_exception_handler",
    "DEFAULT_SCHEMA_CLASS": "playground.schema.SandpitAutoSchema",
    "DEFAULT_THROTTLE_CLASSES": ["accounts.throttling.PerKeyRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {"per_key": env_str("SANDPIT_API_RATE", "6000/min")},
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Sandpit API",
    "DESCRIPTION": "Create sandboxes, run code, manage files, terminals and usage.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # The docs page loads Swagger UI from our static files: no CDN, works offline, fits the CSP.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "playground.schema.document_errors",
    ],
}

# --- Sandboxes ----------------------------------------------------------------------
SANDPIT_PROVIDERS = env_list("SANDPIT_PROVIDERS", "local")
SANDPIT_DEFAULT_PROVIDER = env_str(
    "SANDPIT_DEFAULT_PROVIDER", SANDPIT_PROVIDERS[0] if SANDPIT_PROVIDERS else "local"
)
SANDPIT_LOCAL_ROOT = Path(env_str("SANDPIT_LOCAL_ROOT", str(VAR_DIR / "sandboxes")))
# As root, a new (empty) jail root is mounted as a tmpfs: the jails' directories and state
# are made and removed in memory, not journaled on the disk (volume.root_in_memory).
SANDPIT_LOCAL_ROOT_IN_MEMORY = env_bool("SANDPIT_LOCAL_ROOT_IN_MEMORY", True)
# Which cgroup hierarchy limits local jails: auto (v1 where it has memory and pids, else
# v2), v1 or v2 (sandboxes/providers/local/jail_cgroups.py, cgroup_bases).
SANDPIT_LOCAL_CGROUPS = env_str("SANDPIT_LOCAL_CGROUPS", "auto")
if SANDPIT_LOCAL_CGROUPS not in ("auto", "v1", "v2"):
    raise ImproperlyConfigured(
        f"SANDPIT_LOCAL_CGROUPS must be auto, v1 or v2, got {SANDPIT_LOCAL_CGROUPS!r}"
    )
# Pre-started idle jails per web/worker process: a create takes one in about 1 ms.
SANDPIT_LOCAL_WARM_POOL = env_int("SANDPIT_LOCAL_WARM_POOL", 8)
# ... and how many it may grow to after creates found it empty (a burst), refilled at idle
# CPU priority and back to the floor after 10 quiet minutes (~4 MiB per idle jail).
SANDPIT_LOCAL_WARM_POOL_MAX = env_int("SANDPIT_LOCAL_WARM_POOL_MAX", 64)
# Cold local jail starts run at most this many at once per process, the rest queue (0: no
# limit); a start is CPU-bound, so more at once only makes all of them later.
SANDPIT_LOCAL_CREATE_CONCURRENCY = env_int(
    "SANDPIT_LOCAL_CREATE_CONCURRENCY", 2 * len(os.sched_getaffinity(0))
)
# Host uids local jails run as when Sandpit runs as root: one per live sandbox, from the
# base on; none of them may belong to a real account (see sandboxes/providers/local/identity.py).
SANDPIT_LOCAL_UID_BASE = env_int("SANDPIT_LOCAL_UID_BASE", 1_000_000_000)
SANDPIT_LOCAL_UID_COUNT = env_int("SANDPIT_LOCAL_UID_COUNT", 65_536)
SANDPIT_LOCAL_UID_LOCK_DIR = env_str("SANDPIT_LOCAL_UID_LOCK_DIR", "/run/sandpit/local-uids")
SANDPIT_DOCKER_IMAGE = env_str("SANDPIT_DOCKER_IMAGE", "sandpit-sandbox:latest")
# Docker containers kept started per process (and engine) for creates of the common spec to
# claim (0: none; sandboxes/providers/docker/pool.py), and how many cold creates one process
# runs against one engine at once (0: no limit; a short queue halves a burst's median).
SANDPIT_DOCKER_POOL_SIZE = env_int("SANDPIT_DOCKER_POOL_SIZE", 4)
# How far that pool may grow after creates found it empty (a burst), back to the size after
# 10 quiet minutes (sandboxes/providers/burst_sizing.py). An idle one costs the host ~17 MiB
# (4 in the container, 13 in its containerd shim).
SANDPIT_DOCKER_POOL_MAX = env_int("SANDPIT_DOCKER_POOL_MAX", 32)
SANDPIT_DOCKER_CREATE_CONCURRENCY = env_int("SANDPIT_DOCKER_CREATE_CONCURRENCY", 3)
# Templates (sandboxes/templates.py): where their read-only root file systems live (jail
# uids must be able to pass through every directory above it), how builds run ('celery',
# or 'thread' in the web process), and each organization's limits.
SANDPIT_TEMPLATE_ROOT = Path(
    env_str(
        "SANDPIT_TEMPLATE_ROOT",
        "/var/lib/sandpit/templates" if os.geteuid() == 0 else str(VAR_DIR / "templates"),
    )
)
SANDPIT_TEMPLATE_BUILDER = env_str("SANDPIT_TEMPLATE_BUILDER", "celery")
SANDPIT_TEMPLATE_MAX_PER_ORG = env_int("SANDPIT_TEMPLATE_MAX_PER_ORG", 10)
SANDPIT_TEMPLATE_MAX_IMAGE_MB = env_int("SANDPIT_TEMPLATE_MAX_IMAGE_MB", 3072)
SANDPIT_TEMPLATE_BUILD_TIMEOUT_S = env_int("SANDPIT_TEMPLATE_BUILD_TIMEOUT_S", 900)
# The Docker engine the docker provider talks to.
DOCKER_HOST = env_str("DOCKER_HOST", "unix:///var/run/docker.sock")
# Several engines: URLs with #name=..&label=..&tls_ca=.. options, comma or space separated
# (format in sandboxes/providers/docker/engines.py); empty: DOCKER_HOST alone.
SANDPIT_DOCKER_HOSTS = env_str("SANDPIT_DOCKER_HOSTS")
# Engine labels organizations and templates require: "org:<slug>=<label>,template:<name>=<label>".
SANDPIT_DOCKER_ENGINE_REQUIREMENTS = env_str("SANDPIT_DOCKER_ENGINE_REQUIREMENTS")
# Seconds an engine may fail its checks before its sandboxes are marked lost.
SANDPIT_DOCKER_ENGINE_LOST_S = env_int("SANDPIT_DOCKER_ENGINE_LOST_S", 60)
# How often beat checks the engines (sandboxes.tasks.check_docker_engines).
SANDPIT_DOCKER_ENGINE_CHECK_INTERVAL_S = env_int("SANDPIT_DOCKER_ENGINE_CHECK_INTERVAL_S", 30)
# The Docker runtime sandboxes run under: runc, or runsc for gVisor (a user-space kernel
# between sandbox and host; scripts/docker-up.sh registers it). Organizations may override.
SANDPIT_DOCKER_RUNTIME = env_str("SANDPIT_DOCKER_RUNTIME", "runc")
# The gVisor runtime networked sandboxes use (runsc with --network=host; see docker.py).
SANDPIT_DOCKER_GVISOR_NETWORK_RUNTIME = env_str(
    "SANDPIT_DOCKER_GVISOR_NETWORK_RUNTIME", "runsc-net"
)
SANDPIT_INSTALLATION = env_str("SANDPIT_INSTALLATION", "default")
SANDPIT_MAX_CONCURRENT_SANDBOXES = env_int("SANDPIT_MAX_CONCURRENT_SANDBOXES", 10)
SANDPIT_MAX_FILE_BYTES = env_int("SANDPIT_MAX_FILE_BYTES", 10 * 1024 * 1024)
# JSON request bodies (Django's default, named because the web server's ceiling uses it).
DATA_UPLOAD_MAX_MEMORY_SIZE = 2_621_440
# The web server (playground/webserver.py) reads no request body larger than this, in bytes;
# each endpoint then applies its own limit above.
SANDPIT_MAX_REQUEST_BYTES = max(SANDPIT_MAX_FILE_BYTES, DATA_UPLOAD_MAX_MEMORY_SIZE)
SANDPIT_MAX_OUTPUT_BYTES = env_int("SANDPIT_MAX_OUTPUT_BYTES", 1024 * 1024)
SANDPIT_MAX_COMMAND_TIMEOUT_S = env_int("SANDPIT_MAX_COMMAND_TIMEOUT_S", 300)
SANDPIT_IDLE_TIMEOUT_S = env_int("SANDPIT_IDLE_TIMEOUT_S", 15 * 60)
SANDPIT_MAX_LIFETIME_S = env_int("SANDPIT_MAX_LIFETIME_S", 24 * 3600)
# Snapshots, fork, pause/resume (sandboxes/snapshots.py): archives live under this directory;
# per organization at most this many snapshots (the reaper's archives not counted) and this
# many stored bytes (archives counted); a sandbox paused this long is archived by the reaper.
SANDPIT_SNAPSHOT_DIR = Path(env_str("SANDPIT_SNAPSHOT_DIR", str(VAR_DIR / "snapshots")))
SANDPIT_MAX_SNAPSHOTS_PER_ORG = env_int("SANDPIT_MAX_SNAPSHOTS_PER_ORG", 20)
SANDPIT_MAX_SNAPSHOT_BYTES_PER_ORG = env_int("SANDPIT_MAX_SNAPSHOT_BYTES_PER_ORG", 5 * 1024**3)
SANDPIT_PAUSED_ARCHIVE_AFTER_S = env_int("SANDPIT_PAUSED_ARCHIVE_AFTER_S", 3600)
# The E2B-compatible API (e2bcompat/): the domain `sandbox.get_host(port)` answers under
# (`<port>-<sandbox id>.<domain>`, served by the preview proxy); empty: no host-named previews.
SANDPIT_E2B_DOMAIN = env_str("SANDPIT_E2B_DOMAIN", "")

# --- Cloud providers ------------------------------------------------------------------------
# Each is enabled by its credentials (SANDPIT_PROVIDERS=auto picks the first complete set); the
# registry (sandboxes/providers/__init__.py) passes them to the adapter it builds, and nothing
# else reads them. Empty means absent: a provider that needs one names it when it is built.
E2B_API_KEY = env_str("E2B_API_KEY")
E2B_TEMPLATE = env_str("E2B_TEMPLATE", "base")
E2B_DOMAIN = env_str("E2B_DOMAIN")
MODAL_TOKEN_ID = env_str("MODAL_TOKEN_ID")
MODAL_TOKEN_SECRET = env_str("MODAL_TOKEN_SECRET")
MODAL_APP_NAME = env_str("MODAL_APP_NAME", "sandpit")
DAYTONA_API_KEY = env_str("DAYTONA_API_KEY")
DAYTONA_API_URL = env_str("DAYTONA_API_URL", "https://app.daytona.io/api")
CSB_API_KEY = env_str("CSB_API_KEY")
CODESANDBOX_TOKEN = env_str("CODESANDBOX_TOKEN")
# Vercel's and Blaxel's SDKs also read their variables from the environment themselves.
VERCEL_TOKEN = env_str("VERCEL_TOKEN")
VERCEL_TEAM_ID = env_str("VERCEL_TEAM_ID")
VERCEL_PROJECT_ID = env_str("VERCEL_PROJECT_ID")
VERCEL_OIDC_TOKEN = env_str("VERCEL_OIDC_TOKEN")
BL_API_KEY = env_str("BL_API_KEY")
BL_WORKSPACE = env_str("BL_WORKSPACE")
RUNLOOP_API_KEY = env_str("RUNLOOP_API_KEY")

# --- `make run` (scripts/run.sh reads the same two for the server it starts) ------------------
SANDPIT_BIND = env_str("SANDPIT_BIND", "127.0.0.1")
SANDPIT_PORT = env_int("SANDPIT_PORT", 8000)
# Web server processes sharing the port (playground/webprocs.py; SO_REUSEPORT): "auto" = one
# per core with Redis (1 in the embedded mode, or while a cloud provider is enabled), 0 = one
# per core, N. More than 1 needs Redis (the in-memory channel layer is per process).
SANDPIT_WEB_PROCESSES = env_str("SANDPIT_WEB_PROCESSES", "auto")
# On stopping (SIGTERM, SIGINT), how long a web process lets the HTTP requests it is serving
# finish, no longer listening, before it cancels them (below Docker's default 10 s stop timeout).
SANDPIT_WEB_STOP_GRACE_S = env_int("SANDPIT_WEB_STOP_GRACE_S", 8)
# Idle request threads kept per web process for reuse (playground/webthreads.py); not a cap
# on concurrent requests. 0: a new thread per request, as Django does.
SANDPIT_WEB_THREADS = env_int("SANDPIT_WEB_THREADS", 64)
# Sandbox creates admitted at once per web process, the rest queued in order of arrival,
# one line per caller served in turn (playground/admission.py); 0 admits all at once.
SANDPIT_WEB_CONCURRENT_CREATES = env_int(
    "SANDPIT_WEB_CONCURRENT_CREATES", 2 * len(os.sched_getaffinity(0))
)
SANDPIT_DEMO_EMAIL = env_str("SANDPIT_DEMO_EMAIL", "demo@sandpit.local")
SANDPIT_DEMO_PASSWORD = env_str("SANDPIT_DEMO_PASSWORD", "sandpit-demo")

# --- Port previews (sandboxes/preview/) --------------------------------------------------
# Each preview on its own origin, `<port>-<sandbox id>.<domain>`, so a page's absolute URLs
# (`/app.js`) stay in the preview and its cookies and storage are not Sandpit's. Development
# defaults to `localhost:<SANDPIT_PORT>` (browsers resolve every *.localhost to loopback);
# production needs a wildcard DNS record and certificate (README, Port previews); empty
# turns the host form off. The scheme of the URLs the API gives out follows the mode.
SANDPIT_PREVIEW_DOMAIN = env_str(
    "SANDPIT_PREVIEW_DOMAIN", "" if PRODUCTION else f"localhost:{SANDPIT_PORT}"
).lower()
SANDPIT_PREVIEW_SCHEME = env_str("SANDPIT_PREVIEW_SCHEME", "https" if PRODUCTION else "http")
# The older path form, /sandboxes/<id>/ports/<port>/ on Sandpit's own origin (absolute URLs
# in a page escape it): on unless turned off, and what the API gives out without a domain.
SANDPIT_PREVIEW_PATHS = env_bool("SANDPIT_PREVIEW_PATHS", True)
# Path-form previews share Sandpit's origin, so their pages run in an opaque origin.
SANDPIT_PREVIEW_CSP_SANDBOX = env_bool("SANDPIT_PREVIEW_CSP_SANDBOX", True)
for _preview_domain in (SANDPIT_PREVIEW_DOMAIN, SANDPIT_E2B_DOMAIN.lower()):
    # WebSockets on a preview host pass the Origin check against their own host; plain HTTP
    # there never reaches Django (the preview router answers every request to that domain).
    if _preview_domain and "." + _preview_domain.rsplit(":", 1)[0] not in ALLOWED_HOSTS:
        ALLOWED_HOSTS.append("." + _preview_domain.rsplit(":", 1)[0])

# --- Billing ----------------------------------------------------------------------------
SANDPIT_FREE_MONTHLY_EXECUTIONS = env_int("SANDPIT_FREE_MONTHLY_EXECUTIONS", 1000)
METRICS_TOKEN = env_str("SANDPIT_METRICS_TOKEN")

# --- Logging ---------------------------------------------------------------------------
LOG_JSON = env_bool("SANDPIT_LOG_JSON", PRODUCTION)
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"request_context": {"()": "common.logging.RequestContextFilter"}},
    "formatters": {
        "json": {"()": "common.logging.JsonFormatter"},
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "json" if LOG_JSON else "plain",
            "filters": ["request_context"],
        }
    },
    "root": {"handlers": ["console"], "level": env_str("SANDPIT_LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}

# --- Security -----------------------------------------------------------------------------
SESSION_COOKIE_HTTPONLY = True
SESSION_ENGINE = "accounts.sessions"  # Django's database sessions, read by a fixed statement
CSRF_COOKIE_HTTPONLY = False  # the playground's JS reads it to call the API with the session
X_FRAME_OPTIONS = "DENY"
# Sent on every response that has no policy of its own (playground/csp.py; the port-preview proxy
# keeps its stricter `sandbox` one). Scripts only from our static files. Styles also allow inline:
# xterm.js writes its theme into <style> elements it creates, and style cannot run code.
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data:",
        "font-src 'self' data:",
        "connect-src 'self'",
        "frame-src 'self'",
        "worker-src 'self' blob:",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)
SECURE_CONTENT_TYPE_NOSNIFF = True
if PRODUCTION:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", True)
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env_int("DJANGO_SECURE_HSTS_SECONDS", 31536000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SECURE_REFERRER_POLICY = "same-origin"

# --- Operations: reaper, reconciler, metrics (see the README, Operations) ---------------------------
# Idle timeout and max lifetime are SANDPIT_IDLE_TIMEOUT_S / SANDPIT_MAX_LIFETIME_S above.
SANDPIT_ORPHAN_GRACE_S = env_int("SANDPIT_ORPHAN_GRACE_S", 60)
SANDPIT_CREATE_STALE_S = env_int("SANDPIT_CREATE_STALE_S", 600)
SANDPIT_PRE_STOP_HOOK = env_str("SANDPIT_PRE_STOP_HOOK")
SANDPIT_PRE_STOP_HOOK_TIMEOUT_S = env_int("SANDPIT_PRE_STOP_HOOK_TIMEOUT_S", 10)
SANDPIT_REAP_BATCH = env_int("SANDPIT_REAP_BATCH", 500)
# Beat intervals, read by playground/celery.py.
SANDPIT_REAP_INTERVAL_S = env_int("SANDPIT_REAP_INTERVAL_S", 60)
SANDPIT_RECONCILE_INTERVAL_S = env_int("SANDPIT_RECONCILE_INTERVAL_S", 300)
