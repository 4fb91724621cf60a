"""Where the CLI finds the web API: `SPUR_API_URL` and `SPUR_TOKEN`, else
`~/.config/spur/config.toml` (`api_url`, `token`, and optionally `user`).

An environment variable wins over the file key by key, so a token can come from the
environment while the URL stays in the file.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at start-up
if TYPE_CHECKING:
    from collections.abc import Mapping

_KEYS = {"api_url": "SPUR_API_URL", "token": "SPUR_TOKEN", "user": "SPUR_USER"}


class ConfigMissing(Exception):
    """The CLI cannot tell which server to talk to, or as whom."""


class CliConfig:
    """Where the API is and as whom to call it. A plain class, not a dataclass: every
    command builds one, and `dataclasses` (with the `inspect` it imports) costs a third
    of the interpreter's own start (tests/scheduler/cli/test_startup.py)."""

    __slots__ = ("api_url", "source", "token", "user")

    def __init__(self, api_url: str, token: str, user: str = "", source: str = "") -> None:
        self.api_url = api_url
        self.token = token
        self.user = user  # the platform user name, for `squeue --me`; default the login name
        self.source = source  # where the URL came from, for `spur config`

    def __repr__(self) -> str:
        return f"CliConfig(api_url={self.api_url!r}, user={self.user!r}, source={self.source!r})"

    @property
    def me(self) -> str:
        if self.user:
            return self.user
        import getpass  # only squeue --me asks

        return getpass.getuser()


def config_path(environ: Mapping[str, str]) -> str:
    # os.path, not pathlib: pathlib imports re and fnmatch, a third of the start.
    base = environ.get("XDG_CONFIG_HOME") or os.path.join(environ.get("HOME") or "~", ".config")
    return os.path.join(os.path.expanduser(base), "spur", "config.toml")


def load_config(environ: Mapping[str, str] | None = None) -> CliConfig:
    env = os.environ if environ is None else environ
    path = config_path(env)
    from_file: dict[str, str] = {}
    if os.path.exists(path):
        import tomllib  # only when there is a file to read (the environment is enough)

        try:
            with open(path, encoding="utf-8") as f:
                data = tomllib.loads(f.read())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigMissing(f"cannot read {path}: {exc}") from exc
        unknown = set(data) - set(_KEYS)
        if unknown:
            raise ConfigMissing(f"{path}: unknown key(s): {', '.join(sorted(unknown))}")
        for key, value in data.items():
            if not isinstance(value, str):
                raise ConfigMissing(f"{path}: {key} must be a string")
            from_file[key] = value
    values: dict[str, str] = {}
    sources: dict[str, str] = {}
    for key, variable in _KEYS.items():
        if env.get(variable):
            values[key], sources[key] = env[variable], variable
        elif from_file.get(key):
            values[key], sources[key] = from_file[key], path
    missing = [k for k in ("api_url", "token") if k not in values]
    if missing:
        wanted = " and ".join(f"{_KEYS[k]} (or {k} in {path})" for k in missing)
        raise ConfigMissing(f"no Spur API configured: set {wanted}")
    return CliConfig(
        api_url=values["api_url"].rstrip("/"),
        token=values["token"],
        user=values.get("user", ""),
        source=sources["api_url"],
    )
