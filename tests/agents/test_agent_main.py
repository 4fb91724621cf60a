"""spurd's settings: spur.toml's [agent] table, overridden by flags."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest

from agents.confinement import confine, hidden_paths
from agents.main import build_parser, main, parse_listen, resolve_settings
from scheduler.config import AgentConfig, ConfigError
from tests.agents.conftest import root_only

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


def test_the_agent_table_holds_how_jobs_are_contained(tmp_path: Path) -> None:
    config = tmp_path / "spur.toml"
    config.write_text(
        TOML
        + 'work_root = "/srv/work"\ntenancy = "site"\nuid_range = [500000, 500999]\n'
        + "personal = true\npids_max = 99\n"
        + 'sandbox_hide = ["/etc/spur"]\nsandbox_binds = ["/scratch"]\n'
        + '[agent.site_users]\nalice = "alice1"\n'
    )
    agent = resolve_settings(build_parser().parse_args(["--config", str(config)]), {}).agent
    assert (agent.work_root, agent.tenancy, agent.uid_range) == (
        "/srv/work",
        "site",
        (500000, 500999),
    )
    assert (agent.personal, agent.pids_max, agent.site_users) == (True, 99, (("alice", "alice1"),))
    assert (agent.sandbox_hide, agent.sandbox_binds) == (("/etc/spur",), ("/scratch",))
    assert _settings(tmp_path).agent.work_root == ".spur/work"
    assert _settings(tmp_path).agent.tenancy == "cloud"


@pytest.mark.parametrize(
    "line", ["uid_range = [0, 10]", "uid_range = [5]", 'tenancy = "shared"', "pids_max = 0"]
)
def test_a_bad_containment_setting_is_refused_by_name(tmp_path: Path, line: str) -> None:
    config = tmp_path / "spur.toml"
    config.write_text(TOML + line + "\n")
    with pytest.raises(ConfigError, match="agent"):
        resolve_settings(build_parser().parse_args(["--config", str(config)]), {})


def test_an_agent_that_is_not_root_refuses_to_start_unless_personal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "spur.toml"
    config.write_text(TOML.replace("/tmp/spool-sim01", str(tmp_path / "spool")))
    monkeypatch.setattr(os, "geteuid", lambda: 4242)
    assert main(["--config", str(config), "--devices", "none"]) == 2
    err = capsys.readouterr().err
    assert "not root" in err and "personal = true" in err
    assert not (tmp_path / "spool").exists()  # it stopped before anything else


def test_a_personal_agent_runs_jobs_as_itself_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 4242)
    agent = AgentConfig(work_root=str(tmp_path / "work"), personal=True)
    with caplog.at_level(logging.INFO):
        confinement = confine(agent)
    assert confinement.identities.mode == "personal"
    assert "personal mode" in caplog.text and "own user" in caplog.text


def test_spurd_refuses_to_start_without_bubblewrap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(ConfigError, match="bubblewrap"):
        confine(AgentConfig(work_root=str(tmp_path / "work"), personal=True))


@root_only
def test_a_work_root_the_jobs_cannot_reach_refuses_to_start(tmp_path: Path) -> None:
    # pytest's temporary directories are root's and 0700.
    with pytest.raises(ConfigError, match="cannot be reached"):
        confine(AgentConfig(work_root=str(tmp_path / "work")))


def test_the_agents_config_token_and_spool_are_hidden_from_jobs(tmp_path: Path) -> None:
    config = tmp_path / "etc" / "spur.toml"
    config.parent.mkdir()
    config.write_text('[cluster]\ntoken_file = "/var/lib/spur/token"\n')
    hidden = hidden_paths(config_path=str(config), spool_dir="/var/spool/spurd", extra=["/x"])
    assert hidden == [
        "/var/spool/spurd",
        str(config),
        str(config.parent),
        "/var/lib/spur/token",
        "/x",
    ]
    assert "/etc" not in hidden_paths(config_path="/etc/spur.toml", spool_dir="")


def test_ssh_is_off_unless_the_agent_table_or_a_flag_turns_it_on(tmp_path: Path) -> None:
    assert _settings(tmp_path).agent.ssh_listen == ""
    config = tmp_path / "on.toml"
    config.write_text(TOML + 'ssh_listen = "0.0.0.0:2222"\nssh_address = "node1.example:22"\n')
    agent = resolve_settings(build_parser().parse_args(["--config", str(config)]), {}).agent
    assert (agent.ssh_listen, agent.ssh_address) == ("0.0.0.0:2222", "node1.example:22")
    flagged = _settings(tmp_path, "--ssh-listen=127.0.0.1:2223").agent
    assert flagged.ssh_listen == "127.0.0.1:2223"


@pytest.mark.parametrize(
    "line",
    ['ssh_listen = "2222"', 'ssh_listen = "host:0"', 'ssh_listen = "host:99999"',
     'ssh_address = "node1:22"', "ssh_listen = 2222"],
)  # fmt: skip
def test_a_bad_ssh_setting_is_refused_by_name(tmp_path: Path, line: str) -> None:
    config = tmp_path / "spur.toml"
    config.write_text(TOML + line + "\n")
    with pytest.raises(ConfigError, match="agent.ssh_"):
        resolve_settings(build_parser().parse_args(["--config", str(config)]), {})


def test_a_steps_grace_without_srun_is_the_agent_tables_and_a_positive_number(
    tmp_path: Path,
) -> None:
    assert _settings(tmp_path).agent.step_grace_s == 30.0  # Slurm cancels within seconds
    config = tmp_path / "spur.toml"
    config.write_text(TOML + "step_grace_s = 5\n")
    args = build_parser().parse_args(["--config", str(config)])
    assert resolve_settings(args, {}).agent.step_grace_s == 5.0
    for bad in ("0", "-1", '"soon"'):
        config.write_text(TOML + f"step_grace_s = {bad}\n")
        with pytest.raises(ConfigError, match="agent.step_grace_s"):
            resolve_settings(build_parser().parse_args(["--config", str(config)]), {})
