"""evalsite settings: one file, read from the environment (see docs/configuration.md).

Nothing here needs configuring on a laptop: with no DATABASE_URL the site starts an embedded
PostgreSQL in .data/, and with no CELERY_BROKER_URL an embedded Redis. Production sets both.
"""

from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from evalsite import embedded
from evalsite.env import env_bool, env_choice, env_float, env_int, env_list, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(env_str("EVALSITE_DATA_DIR", str(BASE_DIR / ".data")))

DEBUG = env_bool("DEBUG", default=False)
SECRET_KEY = env_str("SECRET_KEY")
if not SECRET_KEY:
    if env_bool("EVALSITE_REQUIRE_SECRET_KEY", default=False):
        raise ImproperlyConfigured(
            "SECRET_KEY is not set, and EVALSITE_REQUIRE_SECRET_KEY=1 asks for it: set SECRET_KEY "
            "to a long random string, e.g. python -c 'import secrets; print(secrets.token_urlsafe(50))'."
        )
    # Zero-config and never predictable: a random key made once and kept in the data folder, so
    # sessions and sealed secrets survive restarts and every process of this machine shares it.
    # Hosts that do not share DATA_DIR must set SECRET_KEY (docs/configuration.md).
    SECRET_KEY = embedded.secret_key(DATA_DIR)

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])
SITE_URL = env_str("SITE_URL", "http://127.0.0.1:8000")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "template_partials",
    "axes",
    "evalsite",
    "evaluators",
    "runs",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "evalsite.middleware.BadInputMiddleware",
    # Last, as django-axes asks: it turns a locked-out sign-in into the lockout page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "evalsite.urls"
WSGI_APPLICATION = "evalsite.wsgi.application"

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
                "evalsite.context_processors.navigation",
            ],
            "builtins": [
                "evalsite.templatetags.evalsite_tags",
                "template_partials.templatetags.partials",
            ],
        },
    },
]

# --- Database: PostgreSQL only, external or embedded ------------------------------------------
DATABASE_URL = env_str("DATABASE_URL")
if DATABASE_URL:
    if not DATABASE_URL.startswith(("postgres://", "postgresql://")):
        raise ImproperlyConfigured(
            "DATABASE_URL must be a postgres:// URL; evalsite runs on PostgreSQL only."
        )
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=60)}
else:
    DATABASES = {"default": embedded.postgres_settings(DATA_DIR)}
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
# Django's PostgreSQL backend, with a health check that needs no round trip while the server has
# said nothing on the connection (evalsite/postgres/base.py).
DATABASES["default"]["ENGINE"] = "evalsite.postgres"
# Session settings every connection starts with (libpq's ``options``). JIT off: evalsite's
# statements are short, and any whose estimate crosses jit_above_cost (a comparison's gated
# row scans of a million-scenario run, which never execute) paid ~70 ms compiling each time.
# Empty it for a pooler that refuses startup parameters (PgBouncer without
# ignore_startup_parameters = options).
DATABASE_SESSION_OPTIONS = env_str("EVALSITE_DATABASE_OPTIONS", "-c jit=off")
if DATABASE_SESSION_OPTIONS:
    _options = DATABASES["default"].setdefault("OPTIONS", {})
    _options["options"] = f"{_options.get('options', '')} {DATABASE_SESSION_OPTIONS}".strip()
DATABASES["default"]["TEST"] = {"NAME": env_str("TEST_DATABASE_NAME") or None}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Broker and Redis ------------------------------------------------------------------------
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL") or embedded.redis_url(DATA_DIR)
# Rate limits and other shared counters need Redis even when the broker is RabbitMQ.
# Every host must share it, or limits stop being shared: a broker other than Redis needs
# REDIS_URL, unless EVALSITE_SINGLE_HOST=1 says this machine is the whole deployment.
REDIS_URL = env_str("REDIS_URL")
if not REDIS_URL and CELERY_BROKER_URL.startswith("redis"):
    REDIS_URL = CELERY_BROKER_URL
elif not REDIS_URL and env_bool("EVALSITE_SINGLE_HOST", default=False):
    REDIS_URL = embedded.redis_url(DATA_DIR)
elif not REDIS_URL:
    raise ImproperlyConfigured(
        "REDIS_URL is required when the broker is not Redis: rate limits, spend caps and metric "
        "refreshes must be shared by every host. Set REDIS_URL, or EVALSITE_SINGLE_HOST=1 to "
        "use an embedded Redis on this machine only."
    )
# Only tasks that someone waits for keep results (the celery code runner's code_* tasks).
CELERY_RESULT_BACKEND = REDIS_URL
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# A worker stays up when the broker drops with a task in hand (evalsite/worker_consumer.py).
CELERY_WORKER_CONSUMER = "evalsite.worker_consumer:BrokerLossConsumer"
CELERY_TASK_SOFT_TIME_LIMIT = env_int("CELERY_TASK_SOFT_TIME_LIMIT", 300, minimum=1)
CELERY_TASK_TIME_LIMIT = env_int("CELERY_TASK_TIME_LIMIT", 360, minimum=1)
CELERY_TASK_DEFAULT_QUEUE = "default"
# One queue per kind of work (declared in evalsite/celery.py) so each can get its own workers.
# The first matching pattern wins: the specific ones come first.
CELERY_TASK_ROUTES = {
    "runs.tasks.ingest_*": {"queue": "ingest"},
    "runs.tasks.*": {"queue": "runs"},
    "evaluators.tasks.code_*": {"queue": "code"},
    "evaluators.tasks.llm_*": {"queue": "llm"},
}
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": env_int("CELERY_VISIBILITY_TIMEOUT", 900)}
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", default=False)
CELERY_BEAT_SCHEDULE = {
    # Expired leases, units that keep killing workers, messages a broker lost (runs/engine/units.py).
    "sweep-units": {
        "task": "runs.tasks.units_sweep",
        "schedule": env_float("EVALSITE_UNIT_SWEEP_SECONDS", 5.0),
    },
    # Session rules: judge the sessions that went idle (runs/online/sessions.py). The period only
    # sets how late after the idle time a session is judged, never whether it is.
    "sweep-sessions": {
        "task": "runs.tasks.ingest_sessions_sweep",
        "schedule": env_float("EVALSITE_SESSION_SWEEP_SECONDS", 30.0),
    },
    # Span partitions for the coming days, then retention (runs/traces/partitions.py). Both
    # take PostgreSQL advisory locks, so a second beat running them at once does no harm.
    # Finished runs whose pack task was lost get another (runs/engine/progress.py).
    "sweep-packs": {"task": "runs.tasks.values_pack_sweep", "schedule": 600.0},
    # Traces waiting for online rules whose dispatch message was lost (runs/queue.py).
    "sweep-online-dispatch": {"task": "runs.tasks.ingest_online_dispatch_sweep", "schedule": 60.0},
    "partitions-ensure": {"task": "runs.tasks.partitions_ensure", "schedule": 3600.0},
    "traces-retention": {"task": "runs.tasks.traces_retention", "schedule": 3600.0},
}

# --- Auth, sessions, security ------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", default=False)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SECURE_PROXY_SSL_HEADER = (
    ("HTTP_X_FORWARDED_PROTO", "https") if env_bool("BEHIND_TLS_PROXY") else None
)
X_FRAME_OPTIONS = "DENY"

# Sign-in throttling (django-axes, failures kept in the database so every host sees them): after
# AXES_FAILURE_LIMIT failed sign-ins, that account, and separately that address, wait
# EVALSITE_LOGIN_COOLOFF_MINUTES. The address is REMOTE_ADDR unless the site is told which proxy
# header to trust (a client can write any X-Forwarded-For it likes).
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env_int("EVALSITE_LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("EVALSITE_LOGIN_COOLOFF_MINUTES", 15, minimum=1))
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AXES_IPWARE_META_PRECEDENCE_ORDER = [
    env_str("EVALSITE_CLIENT_IP_HEADER", "REMOTE_ADDR") or "REMOTE_ADDR"
]
AXES_VERBOSE = False

# --- Static files -----------------------------------------------------------------------------
STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(env_str("STATIC_ROOT", str(BASE_DIR / "staticfiles")))
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": (
            "django.contrib.staticfiles.storage.StaticFilesStorage"
            if DEBUG or env_bool("EVALSITE_PLAIN_STATIC")
            else "whitenoise.storage.CompressedManifestStaticFilesStorage"
        )
    },
}
WHITENOISE_USE_FINDERS = DEBUG

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

# --- REST API ---------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "evalsite.auth.ApiKeyAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["evalsite.auth.ProjectRolePermission"],
    "DEFAULT_PAGINATION_CLASS": "evalsite.rest.CursorPagination",
    "PAGE_SIZE": 50,
    "EXCEPTION_HANDLER": "evalsite.rest.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": [
        "evalsite.parsers.JSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "evalsite API",
    "DESCRIPTION": (
        "Evaluate LLM applications and agents. Authenticate with `Authorization: Bearer <key>`; "
        "a key belongs to one project and every object you see is that project's."
    ),
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # Swagger UI comes from our own static files (drf-spectacular-sidecar), never a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# --- evalsite -------------------------------------------------------------------------------
EVALSITE_MAX_BODY_BYTES = env_int("EVALSITE_MAX_BODY_BYTES", 20 * 1024 * 1024, minimum=1024)
DATA_UPLOAD_MAX_MEMORY_SIZE = EVALSITE_MAX_BODY_BYTES
# Interactive work (try it, playground, example cases, prompt previews) a project may have
# running at once across every host (evalsite/quotas.py); 0 turns the quota off.
EVALSITE_INTERACTIVE_SLOTS = env_int("EVALSITE_INTERACTIVE_SLOTS", 2, minimum=0)
EVALSITE_INTERACTIVE_LEASE_SECONDS = env_int("EVALSITE_INTERACTIVE_LEASE_SECONDS", 300, minimum=10)
# Example cases run at every save, while the person waits: at most this many, this long in all.
EVALSITE_EXAMPLES_MAX = env_int("EVALSITE_EXAMPLES_MAX", 20, minimum=0)
EVALSITE_EXAMPLES_SECONDS = env_float("EVALSITE_EXAMPLES_SECONDS", 10.0)
EVALSITE_CODE_RUNNER = env_choice(
    "EVALSITE_CODE_RUNNER", "sandbox", ("sandbox", "inprocess", "celery")
)
EVALSITE_WEBHOOK_ALLOW_PRIVATE = env_bool("EVALSITE_WEBHOOK_ALLOW_PRIVATE", default=False)
API_KEY_TOUCH_INTERVAL_SECONDS = 60
EVALSITE_RUN_CHUNK_SIZE = env_int("EVALSITE_RUN_CHUNK_SIZE", 250, minimum=1)
# A worker renews its unit's lease every third of this; a dead worker's unit is redone after it.
EVALSITE_UNIT_LEASE_SECONDS = env_float("EVALSITE_UNIT_LEASE_SECONDS", 15.0)
EVALSITE_UNIT_SWEEP_SECONDS = env_float("EVALSITE_UNIT_SWEEP_SECONDS", 5.0)
EVALSITE_UNIT_MAX_ATTEMPTS = env_int("EVALSITE_UNIT_MAX_ATTEMPTS", 3, minimum=1)
EVALSITE_UNIT_RESEND_SECONDS = env_float("EVALSITE_UNIT_RESEND_SECONDS", 30.0)
EVALSITE_METRICS_REFRESH_SECONDS = env_float("EVALSITE_METRICS_REFRESH_SECONDS", 2.0)
EVALSITE_APPLICATIONS_ALLOW_PRIVATE = env_bool("EVALSITE_APPLICATIONS_ALLOW_PRIVATE", default=False)
# Comma-separated, newest first: the first encrypts, all decrypt (empty: SECRET_KEY encrypts).
EVALSITE_ENCRYPTION_KEY = env_list("EVALSITE_ENCRYPTION_KEY", [])
EVALSITE_JUDGE_CONCURRENCY = env_int("EVALSITE_JUDGE_CONCURRENCY", 64, minimum=1)
EVALSITE_JUDGE_MAX_WAIT_SECONDS = env_float("EVALSITE_JUDGE_MAX_WAIT_SECONDS", 120.0)
EVALSITE_JUDGE_MAX_BACKOFF_SECONDS = env_float("EVALSITE_JUDGE_MAX_BACKOFF_SECONDS", 30.0)
EVALSITE_MODELS_ALLOW_PRIVATE = env_bool("EVALSITE_MODELS_ALLOW_PRIVATE", default=False)
# Model calls one judge alignment (base and candidate on the held-out gold items) may make.
EVALSITE_ALIGNMENT_MAX_CALLS = env_int("EVALSITE_ALIGNMENT_MAX_CALLS", 2000, minimum=2)
EVALSITE_ONLINE_DELAY_SECONDS = env_int("EVALSITE_ONLINE_DELAY_SECONDS", 5, minimum=0)
EVALSITE_ONLINE_CHUNK_SIZE = env_int("EVALSITE_ONLINE_CHUNK_SIZE", 50, minimum=1)
EVALSITE_SESSION_SWEEP_SECONDS = env_float("EVALSITE_SESSION_SWEEP_SECONDS", 30.0)
EVALSITE_SESSION_SWEEP_LIMIT = env_int("EVALSITE_SESSION_SWEEP_LIMIT", 200, minimum=1)
EVALSITE_TESTSET_MAX_BYTES = env_int("EVALSITE_TESTSET_MAX_BYTES", 50 * 1024 * 1024, minimum=1024)
EVALSITE_TESTSET_MAX_ROWS = env_int("EVALSITE_TESTSET_MAX_ROWS", 100_000, minimum=1)
EVALSITE_TRACE_MAX_SPANS = env_int("EVALSITE_TRACE_MAX_SPANS", 10_000, minimum=1)
EVALSITE_TRACE_MAX_ATTRIBUTES_BYTES = env_int(
    "EVALSITE_TRACE_MAX_ATTRIBUTES_BYTES", 1024 * 1024, minimum=1024
)
# Spans live in one partition per UTC day (runs/traces/partitions.py says why daily). A project
# keeps its traces this many whole days plus today unless it sets its own; 0 or unset: forever.
EVALSITE_TRACE_RETENTION_DAYS = env_int("EVALSITE_TRACE_RETENTION_DAYS", 0, minimum=0) or None
# Days of partitions the beat keeps created beyond today; spans of a day without one land in
# the default partition (never refused), so this is how long beat may be down without effect.
EVALSITE_PARTITIONS_AHEAD = env_int("EVALSITE_PARTITIONS_AHEAD", 7, minimum=1)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        # The model client logs every request at INFO; a judge makes hundreds a second.
        "httpx": {"level": "WARNING"},
        "httpcore": {"level": "WARNING"},
    },
}
