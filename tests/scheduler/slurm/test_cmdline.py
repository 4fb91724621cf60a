"""getopt_long as the Slurm commands use it."""

from __future__ import annotations

import pytest

from scheduler.slurm.cmdline import Arg, GetoptError, Option, OptionTable

TABLE = OptionTable(
    [
        Option("job-name", "J", Arg.REQUIRED),
        Option("nodes", "N", Arg.REQUIRED),
        Option("parsable", "", Arg.NONE),
        Option("partition", "p", Arg.REQUIRED),
        Option("hold", "H", Arg.NONE),
        Option("verbose", "v", Arg.NONE),
        Option("exclusive", "", Arg.OPTIONAL),
    ]
)


def pairs(argv: list[str], stop: bool = True) -> tuple[list[tuple[str, str | None]], list[str]]:
    parsed = TABLE.parse(argv, stop_at_operand=stop)
    return [(o.name, v) for o, v in parsed.options], parsed.operands


def test_short_options_take_a_separate_or_glued_argument() -> None:
    assert pairs(["-J", "x", "-Ny"]) == ([("job-name", "x"), ("nodes", "y")], [])


def test_long_options_take_an_equals_or_a_separate_argument() -> None:
    assert pairs(["--job-name=a=b", "--nodes", "2"]) == ([("job-name", "a=b"), ("nodes", "2")], [])


def test_an_unambiguous_prefix_names_a_long_option() -> None:
    assert pairs(["--job=x", "--no", "2", "--parsa"])[0] == [
        ("job-name", "x"),
        ("nodes", "2"),
        ("parsable", None),
    ]


def test_an_ambiguous_prefix_lists_the_possibilities() -> None:
    with pytest.raises(GetoptError) as caught:
        pairs(["--par"])
    assert str(caught.value) == (
        "option '--par' is ambiguous; possibilities: '--parsable' '--partition'"
    )


def test_flags_cluster_and_the_last_may_take_the_rest() -> None:
    assert pairs(["-vHJname"])[0] == [("verbose", None), ("hold", None), ("job-name", "name")]


def test_optional_arguments_need_an_equals_sign() -> None:
    assert pairs(["--exclusive", "script"]) == ([("exclusive", None)], ["script"])
    assert pairs(["--exclusive=user"])[0] == [("exclusive", "user")]


def test_parsing_stops_at_the_first_operand_when_asked() -> None:
    assert pairs(["-v", "job.sh", "-J", "x"]) == ([("verbose", None)], ["job.sh", "-J", "x"])


def test_options_and_operands_mix_otherwise() -> None:
    assert pairs(["12", "-v", "13"], stop=False) == ([("verbose", None)], ["12", "13"])


def test_a_double_dash_ends_the_options() -> None:
    assert pairs(["--", "-v"], stop=False) == ([], ["-v"])
    assert pairs(["-"], stop=False) == ([], ["-"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--bogus"], "unrecognized option '--bogus'"),
        (["-Z"], "invalid option -- 'Z'"),
        (["-J"], "option requires an argument -- 'J'"),
        (["--job-name"], "option '--job-name' requires an argument"),
        (["--parsable=yes"], "option '--parsable' doesn't allow an argument"),
    ],
)
def test_errors_use_glibcs_words(argv: list[str], message: str) -> None:
    with pytest.raises(GetoptError) as caught:
        pairs(argv)
    assert str(caught.value) == message
