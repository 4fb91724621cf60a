"""Settings come from the environment through strict readers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from spurcloud.environ import env_bool, env_choice, env_float, env_int, env_list, env_str

ROOT = Path(__file__).resolve().parents[2]


def test_a_malformed_boolean_is_a_configuration_error() -> None:
    with pytest.raises(ImproperlyConfigured, match="DEBUG must be a boolean"):
        env_bool("DEBUG", True, environ={"DEBUG": "ture"})


def test_booleans_accept_the_usual_spellings_and_default_when_unset() -> None:
    assert env_bool("X", False, environ={"X": "Yes"}) is True
    assert env_bool("X", True, environ={"X": "0"}) is False
    assert env_bool("X", True, environ={}) is True


def test_a_malformed_number_is_a_configuration_error() -> None:
    with pytest.raises(ImproperlyConfigured, match="must be an integer"):
        env_int("PORT", 1, environ={"PORT": "80a"})
    with pytest.raises(ImproperlyConfigured, match="at least 1"):
        env_int("PORT", 1, minimum=1, environ={"PORT": "0"})
    with pytest.raises(ImproperlyConfigured, match="must be a number"):
        env_float("POLL", 1.0, environ={"POLL": "fast"})
    with pytest.raises(ImproperlyConfigured, match="finite"):
        env_float("POLL", 1.0, environ={"POLL": "nan"})


def test_lists_are_comma_separated_and_choices_are_checked() -> None:
    assert env_list("L", ["a"], environ={"L": " x, ,y "}) == ["x", "y"]
    assert env_list("L", ["a"], environ={}) == ["a"]
    with pytest.raises(ImproperlyConfigured, match="must be one of"):
        env_choice("C", "info", {"info", "debug"}, environ={"C": "loud"})


def test_a_secret_file_wins_over_the_variable(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("from-file\n")
    environ = {"SECRET_KEY": "from-env", "SECRET_KEY_FILE": str(secret)}
    assert env_str("SECRET_KEY", "", environ=environ) == "from-file"


def test_an_unreadable_secret_file_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ImproperlyConfigured, match="cannot read"):
        env_str("SECRET_KEY", "", environ={"SECRET_KEY_FILE": str(tmp_path / "missing")})


def _load_settings(
    env: dict[str, str], tmp_path: Path, *, code: str | None = None
) -> subprocess.CompletedProcess[str]:
    code = code or (
        "import json; from django.conf import settings as s; "
        "print(json.dumps({'debug': s.DEBUG, 'broker': s.CELERY_BROKER_URL, "
        "'layer': s.CHANNEL_LAYERS['default']['BACKEND'], 'poll': s.SPUR_JOBS_POLL_INTERVAL_S, "
        "'db': s.DATABASES['default']['ENGINE'], 'folder': str(s.CELERY_BROKER_FOLDER), "
        "'cache': s.CACHES['default']['BACKEND']}))"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SPUR_", "CELERY_"))}
    for key in ("DEBUG", "SECRET_KEY", "DATABASE_URL", "REDIS_URL", "CHANNEL_LAYER_URL",
                "CACHE_URL", "SIGNUP_MODE", "ACCOUNT_EMAIL_VERIFICATION", "SECURE_COOKIES",
                "SECURE_HSTS_SECONDS", "TRUSTED_PROXY_COUNT"):  # fmt: skip
        clean.pop(key, None)
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**clean, "DJANGO_SETTINGS_MODULE": "spurcloud.settings", **env},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_production_refuses_to_start_without_a_secret_key(tmp_path: Path) -> None:
    result = _load_settings({"DEBUG": "false"}, tmp_path)
    assert result.returncode != 0
    assert "SECRET_KEY" in result.stderr


def test_production_refuses_to_start_without_a_cluster_token(tmp_path: Path) -> None:
    result = _load_settings({"DEBUG": "false", "SECRET_KEY": "s3cret"}, tmp_path)
    assert result.returncode != 0
    assert "SPUR_CLUSTER_TOKEN" in result.stderr


def test_the_embedded_defaults_need_nothing_set(tmp_path: Path) -> None:
    import json

    result = _load_settings({}, tmp_path)
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout)
    assert loaded["debug"] is True
    assert loaded["broker"] == "filesystem://"
    assert loaded["layer"] == "channels.layers.InMemoryChannelLayer"
    assert loaded["poll"] == 1.0  # the in-memory layer cannot carry a worker's pushes
    assert loaded["db"] == "django.db.backends.sqlite3"
    assert loaded["cache"] == "django.core.cache.backends.locmem.LocMemCache"
    assert (tmp_path / ".spur" / "broker" / "processed").is_dir()


def test_a_sessions_use_noted_by_one_embedded_process_is_read_by_another(
    tmp_path: Path,
) -> None:
    """The web notes a session's last use; the worker's idle culling reads it. The
    embedded platform's default cache lives in each process's memory: the shared cache
    must not."""
    django = "import django; django.setup(); "
    noted = _load_settings(
        {},
        tmp_path,
        code=django + "from spurcloud.portal.session_activity import note_session_activity as n; "
        "n(41, now=1234.5)",
    )
    assert noted.returncode == 0, noted.stderr
    read = _load_settings(
        {},
        tmp_path,
        code=django + "from spurcloud.portal.session_activity import last_session_activity as l; "
        "print(l(41), l(42))",
    )
    assert read.returncode == 0, read.stderr
    assert read.stdout.split() == ["1234.5", "None"]


def test_redis_url_moves_the_broker_and_the_channel_layer_to_redis(tmp_path: Path) -> None:
    import json

    result = _load_settings({"REDIS_URL": "redis://127.0.0.1:6379/0"}, tmp_path)
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout)
    assert loaded["broker"] == "redis://127.0.0.1:6379/0"
    assert loaded["layer"] == "channels_redis.core.RedisChannelLayer"
    assert loaded["poll"] == 0.0
    # The rate limits' counts are shared by every web process.
    assert loaded["cache"] == "django.core.cache.backends.redis.RedisCache"


def test_an_unknown_channel_layer_url_is_a_configuration_error(tmp_path: Path) -> None:
    result = _load_settings({"CHANNEL_LAYER_URL": "kafka://x"}, tmp_path)
    assert result.returncode != 0
    assert "CHANNEL_LAYER_URL" in result.stderr


def test_rates_and_sign_in_limits_are_read_strictly() -> None:
    from spurcloud.environ import env_match

    pattern = r"[0-9]+/[0-9]*[smhd]/(ip|key)(,[0-9]+/[0-9]*[smhd]/(ip|key))*"
    assert env_match("R", "10/m/ip", pattern, expected="rates", environ={}) == "10/m/ip"
    with pytest.raises(ImproperlyConfigured, match="R must be rates, not '10 a minute'"):
        env_match("R", "", pattern, expected="rates", environ={"R": "10 a minute"})


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"SIGNUP_MODE": "anyone"}, "SIGNUP_MODE"),
        ({"SIGNUP_MODE": "verified", "ACCOUNT_EMAIL_VERIFICATION": "optional"}, "SIGNUP_MODE"),
        ({"API_REQUESTS_PER_MINUTE_PER_TOKEN": "lots"}, "API_REQUESTS_PER_MINUTE_PER_TOKEN"),
        ({"API_SUBMISSIONS_PER_MINUTE_PER_ORGANIZATION": "0"}, "API_SUBMISSIONS_PER_MINUTE"),
        ({"LOGIN_FAILED_RATE": "5 per minute"}, "LOGIN_FAILED_RATE"),
        ({"CACHE_URL": "memcached://x"}, "CACHE_URL"),
    ],
)
def test_a_malformed_sign_up_or_rate_setting_stops_the_start(
    env: dict[str, str], named: str, tmp_path: Path
) -> None:
    result = _load_settings(env, tmp_path)
    assert result.returncode != 0
    assert named in result.stderr


@pytest.mark.parametrize(
    ("mode", "verification"),
    [
        ("open", "optional"),
        ("verified", "mandatory"),
        ("invite", "mandatory"),
        ("closed", "optional"),
    ],  # fmt: skip
)
def test_each_sign_up_mode_sets_email_verification(
    mode: str, verification: str, tmp_path: Path
) -> None:
    code = (
        "from django.conf import settings as s; print(s.SIGNUP_MODE, s.ACCOUNT_EMAIL_VERIFICATION)"
    )
    result = _load_settings({"SIGNUP_MODE": mode}, tmp_path, code=code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [mode, verification]
