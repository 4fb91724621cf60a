"""Where the CLI finds its server and token."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.cli.config import ConfigMissing, load_config


def write(home: Path, text: str) -> None:
    path = home / ".config" / "spur" / "config.toml"
    path.parent.mkdir(parents=True)
    path.write_text(text)


def test_environment_variables_configure_the_cli(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "SPUR_API_URL": "http://api:8000/", "SPUR_TOKEN": "spur_x"}
    config = load_config(env)
    assert (config.api_url, config.token, config.source) == (
        "http://api:8000",
        "spur_x",
        "SPUR_API_URL",
    )


def test_the_config_file_is_used_when_the_environment_is_silent(tmp_path: Path) -> None:
    write(tmp_path, 'api_url = "https://spur.example"\ntoken = "spur_f"\nuser = "alice"\n')
    config = load_config({"HOME": str(tmp_path)})
    assert (config.api_url, config.token, config.me) == ("https://spur.example", "spur_f", "alice")
    assert config.source.endswith("config.toml")


def test_the_environment_wins_key_by_key(tmp_path: Path) -> None:
    write(tmp_path, 'api_url = "https://spur.example"\ntoken = "spur_f"\n')
    config = load_config({"HOME": str(tmp_path), "SPUR_TOKEN": "spur_e"})
    assert (config.api_url, config.token) == ("https://spur.example", "spur_e")


def test_xdg_config_home_moves_the_file(tmp_path: Path) -> None:
    (tmp_path / "spur").mkdir()
    (tmp_path / "spur" / "config.toml").write_text('api_url = "http://x"\ntoken = "t"\n')
    assert load_config({"XDG_CONFIG_HOME": str(tmp_path), "HOME": "/nowhere"}).api_url == "http://x"


def test_it_says_what_to_set_when_nothing_is_configured(tmp_path: Path) -> None:
    with pytest.raises(ConfigMissing, match="set SPUR_API_URL .* and SPUR_TOKEN"):
        load_config({"HOME": str(tmp_path)})
    with pytest.raises(ConfigMissing, match="SPUR_TOKEN"):
        load_config({"HOME": str(tmp_path), "SPUR_API_URL": "http://x"})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("api_url = ", "cannot read"),
        ("apiurl = 'x'", "unknown key"),
        ("token = 3", "must be a string"),
    ],
)
def test_a_broken_config_file_is_an_error_not_a_default(
    tmp_path: Path, text: str, message: str
) -> None:
    write(tmp_path, text)
    with pytest.raises(ConfigMissing, match=message):
        load_config({"HOME": str(tmp_path)})
