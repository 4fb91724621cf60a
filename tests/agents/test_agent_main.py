"""spurd's settings: spur.toml's [agent] table, overridden by flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.main import build_parser, main, parse_listen, resolve_settings
from scheduler.config import ConfigError

TOML = """
[cluster]
name = "demo"
token = "from-file"

[agent]
name = "sim01"
listen = "127.0.0.1:7001"
controllers = ["http://127.0.0.1:6817"]
devices = "sim:mi300x-8"
spool_dir = "/tmp/spool-sim01"
"""


def _settings(tmp_path: Path, *flags: str, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    config = tmp_path / "spur.toml"
    config.write_text(TOML)
    args = build_parser().parse_args(["--config", str(config), *flags])
    return resolve_settings(args, env or {})


def test_the_agent_table_is_used_as_is(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    assert settings.cluster_name == "demo"
    assert settings.token == "from-file"
    assert settings.agent.name == "sim01"
    assert settings.agent.devices == "sim:mi300x-8"
    assert settings.agent.advertised_url == "http://127.0.0.1:7001"
    assert settings.kill_jobs_on_exit is False


def test_flags_override_the_agent_table(tmp_path: Path) -> None:
    settings = _settings(
        tmp_path,
        "--name=sim02",
        "--listen=127.0.0.1:7002",
        "--devices=sim:h100-8",
        "--controllers=http://a:6817, http://b:6817",
        "--spool-dir=/tmp/other",
        "--kill-jobs-on-exit",
    )
    agent = settings.agent
    assert (agent.name, agent.listen, agent.devices) == ("sim02", "127.0.0.1:7002", "sim:h100-8")
    assert agent.controllers == ("http://a:6817", "http://b:6817")
    assert agent.spool_dir == "/tmp/other"
    assert settings.kill_jobs_on_exit is True


def test_the_token_from_the_environment_wins(tmp_path: Path) -> None:
    assert _settings(tmp_path, env={"SPUR_CLUSTER_TOKEN": "from-env"}).token == "from-env"


def test_without_a_token_spurd_refuses_to_start(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError):
        resolve_settings(build_parser().parse_args([]), {})
    assert main(["--devices", "none"]) == 2
    assert "token" in capsys.readouterr().err


def test_listen_addresses_are_host_and_port() -> None:
    assert parse_listen("127.0.0.1:6818") == ("127.0.0.1", 6818)
    assert parse_listen("[::1]:6818") == ("::1", 6818)
    with pytest.raises(ConfigError):
        parse_listen("6818")
