"""docker-compose.yml cannot be run here (no Docker engine); check its shape instead."""

from __future__ import annotations

import shlex
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
OUR_SCRIPTS = set(PROJECT["project"]["scripts"])
THIRD_PARTY = {"celery", "redis-server", "pg_isready"}


def test_it_has_the_production_shape():
    services = COMPOSE["services"]
    assert {"postgres", "redis", "web", "worker", "beat"} <= set(services)
    assert sorted(s for s in services if s.startswith("ctld")) == ["ctld1", "ctld2", "ctld3"]
    assert sorted(s for s in services if s.startswith("agent")) == ["agent1", "agent2"]


def test_every_service_command_exists():
    for name, service in COMPOSE["services"].items():
        command = service.get("command")
        if command is None:
            assert "image" in service and not service.get("build"), name
            continue
        argv = command if isinstance(command, list) else shlex.split(command)
        assert argv[0] in OUR_SCRIPTS | THIRD_PARTY, f"{name}: unknown command {argv[0]}"


def test_the_controller_replicas_name_each_other_as_raft_peers():
    addresses = {}
    peers = {}
    for name in ("ctld1", "ctld2", "ctld3"):
        argv = COMPOSE["services"][name]["command"]
        addresses[name] = argv[argv.index("--raft-address") + 1]
        peers[name] = set(argv[argv.index("--raft-peers") + 1].split(","))
    for name, own in addresses.items():
        assert peers[name] == set(addresses.values()) - {own}


def test_the_embedded_config_in_compose_is_a_valid_spur_toml():
    from scheduler import config

    text = COMPOSE["configs"]["spur_toml"]["content"]
    parsed = config.parse(tomllib.loads(text), env={"SPUR_CLUSTER_TOKEN": "t"})
    assert parsed.default_partition == "gpu"
    assert len(parsed.agent.controllers) == 3


def test_it_has_no_default_secret_and_refuses_to_start_without_one():
    text = (ROOT / "docker-compose.yml").read_text()
    assert "change-me" not in text
    for name in ("SPUR_CLUSTER_TOKEN", "SPUR_RAFT_PASSWORD", "SECRET_KEY", "POSTGRES_PASSWORD"):
        # `${NAME:?message}`: compose stops with the message when NAME is unset or empty.
        assert f"${{{name}:?" in text, name
