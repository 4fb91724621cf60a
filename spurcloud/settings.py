"""The one settings module, read from environment variables (see spurcloud/environ.py).

With nothing set, this is the embedded single-host platform: DEBUG on, SQLite under
`.spur/`, a file-system Celery broker under `.spur/broker`, the in-memory Channels layer,
one controller on 127.0.0.1:6817. Production sets DEBUG=false, and then SECRET_KEY and
SPUR_CLUSTER_TOKEN are required; DATABASE_URL=postgres://..., REDIS_URL=redis://...
switch the database, the broker and the Channels layer without another code path.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from scheduler import filequeue
from scheduler.client import MAX_SUBMIT_BATCH
from scheduler.core.contract.states import JobState
from spurcloud.environ import (
    env_bool,
    env_choice,
    env_float,
    env_int,
    env_list,
    env_match,
    env_str,
)

BASE_DIR = Path(__file__).resolve().parent.parent

# Where the embedded platform keeps its files (database, broker, static). Relative to the
# working directory, so `spurcloud up` in a checkout keeps everything in `./.spur`.
SPUR_STATE_DIR = Path(env_str("SPUR_STATE_DIR", ".spur")).resolve()

# Healthchecks does the same: a fresh checkout runs as a development platform, and a
# deployment says DEBUG=false, which makes the secrets below mandatory.
DEBUG = env_bool("DEBUG", True)

SECRET_KEY = env_str("SECRET_KEY", "spur-dev-secret-key-not-for-production" if DEBUG else "")
if not SECRET_KEY:
    raise ImproperlyConfigured("SECRET_KEY (or SECRET_KEY_FILE) is required when DEBUG is off")

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])
CSRF_FAILURE_VIEW = "spurcloud.api.errors.csrf_failure"  # JSON under /api/

# -- transport security and headers ------------------------------------------------------

# SECURE_COOKIES says "this site is served over HTTPS" (production, behind TLS). The
# embedded platform serves plain HTTP on the machine and sets it false: Secure cookies
# would never come back, and a Strict-Transport-Security header would be meaningless.
SESSION_COOKIE_SECURE = env_bool("SECURE_COOKIES", not DEBUG)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SECURE_HSTS_SECONDS = env_int(
    "SECURE_HSTS_SECONDS", 365 * 24 * 3600 if SESSION_COOKIE_SECURE else 0, minimum=0
)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
# Behind a TLS-terminating proxy Django sees plain HTTP; the proxy says what the client
# used. Only trust the header when a proxy is there to overwrite whatever a client sent.
TRUSTED_PROXY_COUNT = env_int("TRUSTED_PROXY_COUNT", 0, minimum=0)
if env_bool("SECURE_PROXY_SSL_HEADER", TRUSTED_PROXY_COUNT > 0):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# The client's address for rate limits: REMOTE_ADDR, or with proxies in front the
# address the outermost trusted proxy saw (a client can write X-Forwarded-For itself).
ALLAUTH_TRUSTED_PROXY_COUNT = TRUSTED_PROXY_COUNT
X_FRAME_OPTIONS = "DENY"
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",  # allauth.usersessions' list says "3 minutes ago"
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "allauth",
    "allauth.account",
    "allauth.mfa",  # TOTP and recovery codes (the account page links to them)
    "allauth.usersessions",  # the account's signed-in sessions, each can be signed out
    "spurcloud.tenants",
    "spurcloud.jobs",
    "spurcloud.billing",
    "spurcloud.api",
    "spurcloud.portal",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    # Times in the browser's time zone (the portal's `spur_tz` cookie).
    "spurcloud.portal.timezones.ViewerTimeZoneMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "spurcloud.headers.ContentSecurityPolicyMiddleware",
    "allauth.account.middleware.AccountMiddleware",
    # Innermost: a view's redirect, to htmx, is an HX-Redirect (spurcloud/portal/htmx.py).
    "spurcloud.portal.htmx.HtmxRedirectMiddleware",
    # (no UserSessionsMiddleware: it only tracks activity, USERSESSIONS_TRACK_ACTIVITY, off)
]
# What a browser needs and a request to the tenant API's operations (/api/v1/) with a
# bearer token does not: that request is authenticated by its token alone (never by a
# session, so no CSRF: every view there is csrf_exempt anyway), answers JSON in UTC, and
# is no page (no messages, no static file, no htmx, no allauth). It goes through the rest
# of MIDDLEWARE only (spurcloud/asgi_http.py, `TokenApiHandler`): the security headers,
# the host check, the CSP. Every other request, a session's included, passes them all.
# A middleware added above applies to API requests too unless it is named here.
BROWSER_ONLY_MIDDLEWARE = frozenset(
    {
        "whitenoise.middleware.WhiteNoiseMiddleware",
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.middleware.csrf.CsrfViewMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "django.contrib.messages.middleware.MessageMiddleware",
        "spurcloud.portal.timezones.ViewerTimeZoneMiddleware",
        "allauth.account.middleware.AccountMiddleware",
        "spurcloud.portal.htmx.HtmxRedirectMiddleware",
    }
)

ROOT_URLCONF = "spurcloud.urls"
WSGI_APPLICATION = "spurcloud.wsgi.application"
ASGI_APPLICATION = "spurcloud.asgi.application"

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
                "spurcloud.portal.context.current_organization",
                "spurcloud.portal.context.signup",
            ],
        },
    },
]

# -- database ---------------------------------------------------------------------------

DATABASE_URL = env_str("DATABASE_URL", f"sqlite:///{SPUR_STATE_DIR / 'spurcloud.sqlite3'}")
DATABASES = {
    "default": dj_database_url.parse(
        DATABASE_URL, conn_max_age=env_int("DATABASE_CONN_MAX_AGE", 60, minimum=0)
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # SQLite does not create the directory of its file; the embedded default lives here.
    Path(DATABASES["default"]["NAME"]).parent.mkdir(parents=True, exist_ok=True)
    # The web server and the worker's threads write at once. WAL lets readers go on
    # during a write, IMMEDIATE takes the write lock at BEGIN (no failed lock upgrade
    # mid-transaction), and the timeout makes a writer wait instead of failing.
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 20,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# -- authentication (django-allauth, email only) -----------------------------------------

AUTHENTICATION_BACKENDS = [
    "django.contrib.auth.backends.ModelBackend",
    "allauth.account.auth_backends.AuthenticationBackend",
]
ACCOUNT_LOGIN_METHODS = {"email"}
ACCOUNT_SIGNUP_FIELDS = ["email*", "password1*", "password2*"]
ACCOUNT_UNIQUE_EMAIL = True
ACCOUNT_ADAPTER = "spurcloud.tenants.adapter.AccountAdapter"
# Who may create an account (spurcloud/tenants/adapter.py): anyone (open); anyone, who
# must then confirm their email before signing in, holding an API token or submitting
# (verified); only someone with an organisation's invitation link (invite); nobody, the
# operators make the accounts (closed).
SIGNUP_MODE = env_choice("SIGNUP_MODE", "verified", {"open", "verified", "invite", "closed"})
_CONFIRMING_MODES = {"verified", "invite"}
ACCOUNT_EMAIL_VERIFICATION = env_choice(
    "ACCOUNT_EMAIL_VERIFICATION",
    "mandatory" if SIGNUP_MODE in _CONFIRMING_MODES else "optional",
    {"none", "optional", "mandatory"},
)
if SIGNUP_MODE in _CONFIRMING_MODES and ACCOUNT_EMAIL_VERIFICATION != "mandatory":
    raise ImproperlyConfigured(
        f"SIGNUP_MODE={SIGNUP_MODE} needs ACCOUNT_EMAIL_VERIFICATION=mandatory (or unset)"
    )
# How long an invitation link stays good.
INVITATION_TTL_DAYS = env_int("INVITATION_TTL_DAYS", 7, minimum=1)
# Failed sign-ins, in allauth's syntax: per client address, and per account (`key`). The
# admin's login (spurcloud/admin_login.py) counts against the same limits.
_LOGIN_RATE = r"[0-9]+/[0-9]*[smhd]/(ip|key)"
ACCOUNT_RATE_LIMITS = {
    "login_failed": env_match(
        "LOGIN_FAILED_RATE",
        "10/m/ip,5/300s/key",
        rf"{_LOGIN_RATE}(,{_LOGIN_RATE})*",
        expected="allauth rates such as 10/m/ip,5/300s/key",
    ),
}
LOGIN_URL = "account_login"
LOGIN_REDIRECT_URL = "portal:dashboard"
ACCOUNT_LOGOUT_REDIRECT_URL = "account_login"
# Second factors (allauth.mfa): an authenticator app's codes, and recovery codes for when
# it is lost. Passkeys (webauthn) are left out: they need fido2's browser ceremony.
MFA_SUPPORTED_TYPES = ["totp", "recovery_codes"]
MFA_TOTP_ISSUER = "Spur-Cloud"
EMAIL_BACKEND = env_str("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
# The folder where django.core.mail.backends.filebased writes each message (the browser
# test reads its confirmation and invitation links there).
if _email_file_path := env_str("EMAIL_FILE_PATH", ""):
    EMAIL_FILE_PATH = _email_file_path
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "spur@localhost")

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
# The portal speaks English only: without translation machinery, each number a template
# prints no longer asks the active language through asgiref's context-local (under ASGI,
# that lookup was a third of a job list's rendering time).
USE_I18N = False
USE_TZ = True

# -- static files (whitenoise; no collectstatic needed for the embedded platform) --------

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(env_str("STATIC_ROOT", str(SPUR_STATE_DIR / "static")))
# Serving from the finders lets a fresh checkout run without collectstatic; a deployment
# that runs collectstatic may turn it off.
WHITENOISE_USE_FINDERS = env_bool("WHITENOISE_USE_FINDERS", True)
WHITENOISE_AUTOREFRESH = DEBUG
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    # Not the manifest storage: it refuses to render a page before collectstatic has run.
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

# -- REST API ---------------------------------------------------------------------------

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["spurcloud.api.authentication.ApiTokenAuthentication"],
    # A token, and the scope the operation needs (spurcloud/api/permissions.py).
    "DEFAULT_PERMISSION_CLASSES": [
        "rest_framework.permissions.IsAuthenticated",
        "spurcloud.api.permissions.TokenHasScope",
    ],
    "DEFAULT_RENDERER_CLASSES": ["spurcloud.api.renderers.FastJSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["spurcloud.api.parsers.BoundedJSONParser"],
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "spurcloud.api.negotiation.JsonFirstNegotiation",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "spurcloud.api.exceptions.api_exception_handler",
    "UNAUTHENTICATED_USER": None,
    # Per token after authentication; per client address before it (spurcloud/api/views.py),
    # so that a flood of bad tokens costs a cache hit each, not a database query.
    "DEFAULT_THROTTLE_CLASSES": ["spurcloud.api.throttling.TokenRateThrottle"],
    "NUM_PROXIES": TRUSTED_PROXY_COUNT,
}
# Requests a minute (spurcloud/api/throttling.py), counted on the shared cache: over the
# limit the API answers 429 with Retry-After.
# A verified API token is kept this long in each web process (spurcloud/tenants/
# token_cache.py): a token revoked elsewhere is refused here this much later at most.
API_TOKEN_CACHE_S = env_float("API_TOKEN_CACHE_S", 5.0, minimum=0.0)
API_REQUESTS_PER_MINUTE_PER_TOKEN = env_int("API_REQUESTS_PER_MINUTE_PER_TOKEN", 1200, minimum=1)
API_REQUESTS_PER_MINUTE_PER_IP = env_int("API_REQUESTS_PER_MINUTE_PER_IP", 2400, minimum=1)
# A running step's input, resizes and signals (srun outside the job, through the web):
# a keystroke each, or a piece of a piped file. Counted apart from the token's others.
API_STEP_IO_PER_MINUTE_PER_TOKEN = env_int("API_STEP_IO_PER_MINUTE_PER_TOKEN", 6000, minimum=1)
# Job submissions a minute by all the members of one organisation together.
API_SUBMISSIONS_PER_MINUTE_PER_ORGANIZATION = env_int(
    "API_SUBMISSIONS_PER_MINUTE_PER_ORGANIZATION", 600, minimum=1
)
# Job specs in one bulk submission (POST /api/v1/jobs with a list); each counts against
# the submissions a minute. At most the controller's own bound (MAX_SUBMIT_BATCH).
API_MAX_BULK_SUBMIT = env_int("API_MAX_BULK_SUBMIT", 100, minimum=1, maximum=MAX_SUBMIT_BATCH)
# The most bytes of a job's output one request reads from its agent (which serves at most
# 1 MiB a request: agents/output.py, MAX_LIMIT).
API_OUTPUT_MAX_BYTES = env_int("API_OUTPUT_MAX_BYTES", 1024 * 1024, minimum=1)
SPECTACULAR_SETTINGS = {
    "TITLE": "Spur-Cloud API",
    "DESCRIPTION": "Submit and watch GPU jobs; read nodes and partitions.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    # No badge fetched from the public validator: the docs reach nothing off-site (CSP).
    "SWAGGER_UI_SETTINGS": {"deepLinking": True, "validatorUrl": None},
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "spurcloud.api.schema.closed_request_bodies",
        "spurcloud.api.schema.retry_after_headers",
        "spurcloud.api.schema.bulk_submission_bounds",
    ],
    "ENUM_NAME_OVERRIDES": {
        # From the contract: the API's enums are the core's, never a copy. The states are
        # given as their values: JobState is not an `enum.Enum` at run time (it is built
        # on contract/strenum.py), and drf-spectacular takes any other class for a
        # function that returns the choices.
        "JobStateEnum": [s.value for s in JobState],
        "JobActionEnum": "scheduler.core.contract.JobAction",
        "NodeStateEnum": ["idle", "mix", "alloc", "down", "drain"],
    },
}
API_PAGE_SIZE = env_int("API_PAGE_SIZE", 100, minimum=1)
API_MAX_PAGE_SIZE = env_int("API_MAX_PAGE_SIZE", 1000, minimum=1)
# A page cut to a few `fields` (sacct's, about 90 bytes a job) is a small fraction of a
# whole job's size: fifty times the rows in one page (about 4.5 MB), so that a day's
# history of tens of thousands of jobs takes one request, each of which pays the token
# check and a round trip again.
API_MAX_PROJECTED_PAGE_SIZE = env_int("API_MAX_PROJECTED_PAGE_SIZE", 50_000, minimum=1)

# -- Redis, Celery, Channels --------------------------------------------------------------

# One knob for production: REDIS_URL becomes the default of the broker, of the layer and
# of the cache.
REDIS_URL = env_str("REDIS_URL", "")

# The cache holds the rate limits' counters, which every web process must share: Redis in
# production; the embedded platform's one web process keeps them in its memory.
CACHE_URL = env_str("CACHE_URL", REDIS_URL or "locmem://")
if CACHE_URL.startswith(("redis://", "rediss://")):
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": CACHE_URL,
            "KEY_PREFIX": env_str("CACHE_KEY_PREFIX", "spurcloud"),
        }
    }
elif CACHE_URL == "locmem://":
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
else:
    raise ImproperlyConfigured(f"CACHE_URL must be locmem:// or redis://..., not {CACHE_URL!r}")
# What one process writes and another reads (a session's last use: noted by the web,
# read by the worker's idle culling), which a cache in one process's memory would lose:
# the default cache where it is Redis, else files in the state directory, which every
# process of the embedded platform shares.
CACHES["shared"] = (
    CACHES["default"]
    if CACHE_URL != "locmem://"
    else {
        "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
        "LOCATION": str(SPUR_STATE_DIR / "cache"),
    }
)

CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", REDIS_URL or "filesystem://")
CELERY_BROKER_FOLDER = Path(env_str("CELERY_BROKER_FOLDER", str(SPUR_STATE_DIR / "broker")))
CELERY_BROKER_POLL_INTERVAL_S = env_float("CELERY_BROKER_POLL_INTERVAL_S", 0.02, minimum=0.001)
CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, Any] = {}
if CELERY_BROKER_URL.startswith("filesystem://"):
    # One folder for both directions: the controller writes where the workers read.
    # Polling is the file-system transport's only way to notice a message, so it polls
    # often: a job's launch waits on it.
    CELERY_BROKER_TRANSPORT_OPTIONS = filequeue.transport_options(
        CELERY_BROKER_FOLDER, polling_interval=CELERY_BROKER_POLL_INTERVAL_S
    )
elif CELERY_BROKER_URL.startswith(("redis://", "rediss://")):
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
CELERY_RESULT_BACKEND = env_str("CELERY_RESULT_BACKEND", "") or None
CELERY_TASK_IGNORE_RESULT = CELERY_RESULT_BACKEND is None
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
# A task is acknowledged after it ran, and a worker that dies mid-task gives it back: the
# tasks are idempotent, so running one twice is harmless and losing one is not.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = env_int("CELERY_WORKER_PREFETCH_MULTIPLIER", 1, minimum=1)
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# `celery -A spurcloud beat`: billing's periodic tasks (spurcloud/billing/tasks.py) and
# idle sessions' culling (spurcloud/portal/tasks.py).
CELERY_BEAT_SCHEDULE = {
    "billing-meter-tick": {"task": "spur.billing.meter_tick", "schedule": 60.0},
    "billing-stop-unpaid-work": {"task": "spur.billing.stop_unpaid_work", "schedule": 60.0},
    "billing-issue-invoices": {"task": "spur.billing.issue_invoices", "schedule": 3600.0},
    "billing-reconcile-runs": {"task": "spur.billing.reconcile_runs", "schedule": 86400.0},
    "billing-reconcile-topups": {"task": "spur.billing.reconcile_topups", "schedule": 86400.0},
    "billing-roll-up-usage": {"task": "spur.billing.roll_up_usage", "schedule": 3600.0},
    "billing-record-capacity": {"task": "spur.billing.record_capacity", "schedule": 3600.0},
    "sessions-cull-idle": {"task": "spur.sessions.cull_idle", "schedule": 60.0},
    "billing-check-spend-alerts": {"task": "spur.billing.check_spend_alerts", "schedule": 300.0},
    "billing-report-meter-events": {
        "task": "spur.billing.report_meter_events",
        "schedule": 300.0,
    },
}

CHANNEL_LAYER_URL = env_str("CHANNEL_LAYER_URL", REDIS_URL or "memory://")
if CHANNEL_LAYER_URL.startswith(("redis://", "rediss://")):
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [CHANNEL_LAYER_URL]},
        }
    }
elif CHANNEL_LAYER_URL == "memory://":
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
else:
    raise ImproperlyConfigured(
        f"CHANNEL_LAYER_URL must be memory:// or redis://..., not {CHANNEL_LAYER_URL!r}"
    )
CHANNEL_LAYER_IN_MEMORY = CHANNEL_LAYER_URL == "memory://"
# An in-memory layer lives inside one process, so a worker's group_send never reaches the
# web process. There the websocket consumer polls the jobs table instead, this often
# (seconds; 0 turns polling off).
SPUR_JOBS_POLL_INTERVAL_S = env_float(
    "SPUR_JOBS_POLL_INTERVAL_S", 1.0 if CHANNEL_LAYER_IN_MEMORY else 0.0, minimum=0.0
)

# -- the cluster ------------------------------------------------------------------------

SPUR_CONTROLLER_URLS = env_list("SPUR_CONTROLLER_URLS", ["http://127.0.0.1:6817"])
SPUR_CONTROLLER_TIMEOUT_S = env_float("SPUR_CONTROLLER_TIMEOUT_S", 10.0, minimum=0.1)
# How long a request keeps trying while no controller replica answers (an election
# takes a second or two); then it answers 503.
SPUR_CONTROLLER_RETRY_S = env_float("SPUR_CONTROLLER_RETRY_S", 3.0, minimum=0.0)
SPUR_CLUSTER_TOKEN = env_str("SPUR_CLUSTER_TOKEN", "spur-dev-cluster-token" if DEBUG else "")
if not SPUR_CLUSTER_TOKEN:
    raise ImproperlyConfigured(
        "SPUR_CLUSTER_TOKEN (or SPUR_CLUSTER_TOKEN_FILE) is required when DEBUG is off"
    )
SPUR_CLUSTER_NAME = env_str("SPUR_CLUSTER_NAME", "spur")
# The organisations' workspaces, as the nodes mount them ([agent] work_root): a job's
# working directory and files must lie in {SPUR_WORK_ROOT}/{organisation}/, which the
# submit edge checks on the paths' text (scheduler/core/contract/paths.py).
SPUR_WORK_ROOT = Path(env_str("SPUR_WORK_ROOT", str(SPUR_STATE_DIR / "work"))).resolve()
SPUR_AGENT_TIMEOUT_S = env_float("SPUR_AGENT_TIMEOUT_S", 10.0, minimum=0.1)
SPUR_AGENT_MAX_RETRIES = env_int("SPUR_AGENT_MAX_RETRIES", 10, minimum=0)
# How long after its end a job still shows in the live queue (squeue), as Slurm's
# MinJobAge does.
SPUR_QUEUE_ENDED_WINDOW_S = env_int("SPUR_QUEUE_ENDED_WINDOW_S", 300, minimum=0)

# -- interactive sessions (spurcloud/portal/sessions.py) ---------------------------------
# The longest a session may last, and how long before its end its page warns.
SPUR_SESSION_MAX_MINUTES = env_int("SPUR_SESSION_MAX_MINUTES", 24 * 60, minimum=1)
SPUR_SESSION_WARN_MIN = env_int("SPUR_SESSION_WARN_MIN", 10, minimum=0)
# A session nobody used (no terminal or Jupyter traffic) for this long is stopped
# (spurcloud/portal/session_culling.py, every minute); its page warns WARN_MIN before.
SPUR_SESSION_IDLE_MINUTES = env_int("SPUR_SESSION_IDLE_MINUTES", 60, minimum=1)
# The web API's URL as jobs on the nodes reach it: the web terminal's SPUR_API_URL, for the
# Slurm commands in its shell (portal/terminal_api_token.py). Empty: the URL the browser used.
SPUR_NODE_API_URL = env_str("SPUR_NODE_API_URL", "")
# An operator's own templates: a JSON file holding a list of {key, title, description,
# setup, service} objects (docs/architecture.md, "Interactive sessions").
_SESSION_TEMPLATES_FILE = env_str("SPUR_SESSION_TEMPLATES_FILE", "")
SPUR_SESSION_TEMPLATES: list[Any] = (
    json.loads(Path(_SESSION_TEMPLATES_FILE).read_text()) if _SESSION_TEMPLATES_FILE else []
)

# -- billing (spurcloud/billing; docs/architecture.md, "Billing") ---------------------

# Money is counted in micro-units of BILLING_CURRENCY (1 USD = 1,000,000).
BILLING_CURRENCY = env_match(
    "BILLING_CURRENCY", "usd", r"[a-z]{3}", expected="an ISO 4217 code in lower case"
)
# A new organisation's billing mode, and the promotional credit it opens with (once).
BILLING_DEFAULT_MODE = env_choice(
    "BILLING_DEFAULT_MODE", "prepaid", {"prepaid", "postpaid", "exempt"}
)
BILLING_SIGNUP_CREDIT_MICRO = env_int("BILLING_SIGNUP_CREDIT_MICRO", 10_000_000, minimum=0)
# Below this balance the organisation's owners are warned (once, until topped up again).
BILLING_LOW_BALANCE_MICRO = env_int("BILLING_LOW_BALANCE_MICRO", 5_000_000, minimum=0)
# How long running work may go on after a prepaid balance reached zero before it is stopped.
BILLING_GRACE_S = env_int("BILLING_GRACE_S", 900, minimum=0)
# The QoS names billed at the spot (preemptible) price; every other QoS is on-demand.
BILLING_SPOT_QOS = frozenset(env_list("BILLING_SPOT_QOS", ["spot", "preemptible", "scavenger"]))
# Top-ups through Stripe Checkout: bounds of the amount a user picks (micro-units).
BILLING_TOPUP_MIN_MICRO = env_int("BILLING_TOPUP_MIN_MICRO", 5_000_000, minimum=1)
BILLING_TOPUP_MAX_MICRO = env_int("BILLING_TOPUP_MAX_MICRO", 10_000_000_000, minimum=1)
STRIPE_SECRET_KEY = env_str("STRIPE_SECRET_KEY", "")
STRIPE_WEBHOOK_SECRET = env_str("STRIPE_WEBHOOK_SECRET", "")
# Where the stripe library sends its requests (tests: a local fake, tests/fixtures/stripe_fake.py).
STRIPE_API_BASE = env_str("STRIPE_API_BASE", "https://api.stripe.com")
# The Billing Meter event name invoiced organisations' usage is reported under (its value:
# micro-units of BILLING_CURRENCY; billing/meter_events.py).
STRIPE_METER_EVENT_NAME = env_match(
    "STRIPE_METER_EVENT_NAME", "spur_usage_micro", r"[A-Za-z0-9_.:-]{1,100}", expected="a name"
)
# How long after a month ends its invoices wait, so that its usage is final: late end
# events and the daily run reconciliation (which may come up to two days late) correct it
# until then.
BILLING_INVOICE_SETTLE_S = env_int("BILLING_INVOICE_SETTLE_S", 2 * 86_400, minimum=0)
# Where Checkout sends the user back to (the portal).
BILLING_RETURN_URL = env_str("BILLING_RETURN_URL", "http://localhost:8000/")

# -- logging ----------------------------------------------------------------------------

LOG_LEVEL = env_choice("LOG_LEVEL", "info", {"debug", "info", "warning", "error"}).upper()
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {"django.db.backends": {"level": "INFO"}},
}
