"""sacctmgr (read-only), sshare and sprio: their layouts against Slurm 22.05 (golden file
64 for sacctmgr; sshare and sprio have no capture, so their columns are checked against
the widths and formats of Slurm's man pages), and their refusals.

Differences left:
- `sacctmgr show cluster`: ControlHost is empty (the controllers' addresses are not
  shown to tenants); normalised below.
- `sacctmgr show assoc`: Spur's QoS table has `normal` and `spot`; the capture's cluster
  had only `normal`. The test feeds the capture's table.
"""

from __future__ import annotations

import pytest

from scheduler.cli import sacctmgr, sprio, sshare
from scheduler.slurm import policy_format as pf
from tests.scheduler.slurm.golden import capture, compares, differs

GOLDEN = "64_sacctmgr.txt"


@compares(("64_sacctmgr.txt", "sacctmgr -P show assoc"))
def test_show_assoc_parsable2_matches_slurm_byte_for_byte() -> None:
    rows = [
        {"cluster": "slurmpeer", "account": "root", "user": "", "shares": 1, "qos": ["normal"]},
        {"cluster": "slurmpeer", "account": "root", "user": "root", "shares": 1,
         "qos": ["normal"]},
    ]  # fmt: skip
    args = sacctmgr.parse_args(["-P", "show", "assoc"], {})
    lines = pf.format_sacctmgr(
        pf.ASSOC_COLUMNS,
        [pf.association_cells(r) for r in rows],
        header=args.header,
        delimiter=args.delimiter,
        trailing=args.trailing,
    )
    assert (
        "".join(line + "\n" for line in lines) == capture(GOLDEN, "sacctmgr -P show assoc").stdout
    )


@differs(("64_sacctmgr.txt", "sacctmgr -n show cluster"))
def test_show_cluster_without_header_matches_slurm_but_for_the_control_host() -> None:
    args = sacctmgr.parse_args(["-n", "show", "cluster"], {})
    lines = pf.format_sacctmgr(
        pf.CLUSTER_COLUMNS, [pf.cluster_cells("slurmpeer", ["normal"])], header=args.header
    )
    expected = capture(GOLDEN, "sacctmgr -n show cluster").stdout.replace(
        "      127.0.0.1", " " * 15
    )
    assert "".join(line + "\n" for line in lines) == expected


def test_the_fixed_layout_has_a_dashes_line_and_marks_a_cut_with_a_plus() -> None:
    lines = pf.format_sacctmgr(
        pf.USER_COLUMNS, [pf.user_cells({"user": "alexandrina", "account": "acme"})]
    )
    assert lines == [
        "      User   Def Acct     Admin ",
        "---------- ---------- --------- ",
        "alexandri+       acme      None ",
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["show", "widgets"], "No valid entity in list command"),
        (["list"], "No valid entity in list command"),
        (["frob"], "invalid keyword: frob"),
        (["add", "user", "bob"], "sacctmgr: error: add: accounts and users are read-only here"),
        (["show", "user", "where", "colour=red"], " Unknown condition: colour=red"),
    ],
)
def test_sacctmgr_refuses_with_slurms_words_and_exit_1(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert sacctmgr.main(argv) == 1
    assert capsys.readouterr().err.startswith(message)


def test_sacctmgr_takes_conditions_on_a_show() -> None:
    args = sacctmgr.parse_args(["show", "user", "where", "name=alice,bob", "account=acme"], {})
    assert (args.entity, args.where) == ("user", {"name": {"alice", "bob"}, "account": {"acme"}})


SHARES = [
    {"account": "acme", "user": "", "raw_shares": 1, "norm_shares": 0.5, "raw_usage": 3600,
     "norm_usage": 0.25, "fairshare": 0.707107},
    {"account": "acme", "user": "alice", "raw_shares": 1, "norm_shares": 0.5, "raw_usage": 3600,
     "norm_usage": 0.25, "fairshare": 0.707107},
]  # fmt: skip


def test_sshare_prints_slurms_default_columns() -> None:
    names = pf.parse_sshare_format(pf.SSHARE_FORMAT)
    expected = """\
Account                    User  RawShares  NormShares    RawUsage  EffectvUsage  FairShare \n\
-------------------- ---------- ---------- ----------- ----------- ------------- ---------- \n\
 acme                                    1    0.500000        3600      0.250000   0.707107 \n\
  acme                    alice          1    0.500000        3600      0.250000   0.707107 """
    assert "\n".join(pf.format_sshare(SHARES, names)) == expected


def test_sshare_parsable_output_is_pipe_separated() -> None:
    args = sshare.parse_args(["-p", "-o", "Account,User,FairShare"], {})
    lines = pf.format_sshare(SHARES[1:], args.names, delimiter=args.delimiter,
                             trailing=args.trailing)  # fmt: skip
    assert lines == ["Account|User|FairShare|", "  acme|alice|0.707107|"]


PRIORITIES = [
    {"job_id": 7, "user": "alice", "account": "acme", "partition": "gpu", "qos": "normal",
     "priority": 15500, "age": 0.5, "fairshare": 1.0, "qos_factor": 1.0,
     "partition_factor": 0.0, "size": 0.0, "nice": 0},
]  # fmt: skip
WEIGHTS = {"age": 1000, "fairshare": 10000, "qos": 10000, "partition": 10000, "size": 1000}


def test_sprio_weighs_each_factor_in_slurms_default_columns() -> None:
    lines = pf.format_sprio(PRIORITIES, pf.parse_sprio_format(pf.SPRIO_FORMAT), WEIGHTS)
    expected = """\
          JOBID PARTITION   PRIORITY        AGE  FAIRSHARE    JOBSIZE  PARTITION        QOS
              7 gpu            15500        500      10000          0          0      10000"""
    assert "\n".join(lines) == expected


def test_sprio_w_prints_the_weights_and_n_the_normalised_factors() -> None:
    pieces = pf.parse_sprio_format(pf.SPRIO_FORMAT)
    weights = pf.format_sprio([], pieces, WEIGHTS, show_weights=True, header=False)
    assert weights == [
        "        Weights" + " " * 22 + "      1000      10000       1000      10000      10000"
    ]
    normal = pf.format_sprio(PRIORITIES, pf.parse_sprio_format("%.7i %.10a"), WEIGHTS,
                             normalised=True, header=False)  # fmt: skip
    assert normal == ["      7  0.5000000"]


@pytest.mark.parametrize("command", [sprio, sshare])
def test_sprio_and_sshare_refuse_unknown_options_as_getopt_does(
    command: object, capsys: pytest.CaptureFixture[str]
) -> None:
    prog = command.__name__.rsplit(".", 1)[1]  # type: ignore[attr-defined]
    assert command.main(["--frob"]) == 1  # type: ignore[attr-defined]
    err = capsys.readouterr().err
    assert (
        err == f"{prog}: unrecognized option '--frob'\nTry \"{prog} --help\" for more information\n"
    )
