"""The layouts of the commands that read the scheduling policy: `sprio` (each pending
job's priority factors), `sshare` (fair share per account and user) and `sacctmgr show`
(associations, users, accounts, QoS, the cluster), as Slurm 22.05 prints them.

The inputs are the web API's answers (`/api/v1/priorities`, `/shares`, `/associations`,
`/qos`, `/config`): plain dicts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from scheduler.slurm.columns import Field, Piece, parse_percent_format, render

Row = Mapping[str, Any]

# -- sprio ----------------------------------------------------------------------------------

# Slurm 22.05's defaults, less the columns whose weight is zero here (site, association
# and TRES: Slurm drops those too, "when all factors have been assigned non-zero weights").
SPRIO_FORMAT = "%.15i %9r %.10Y %.10A %.10F %.10J %.10P %.10Q"
SPRIO_LONG_FORMAT = "%.15i %9r %.8u %.10Y %.10A %.10F %.10J %.10P %.10Q %.11N"
# letter -> (header, factor key in the priorities answer, weight key or "")
SPRIO_FIELDS: dict[str, tuple[str, str, str]] = {
    "i": ("JOBID", "job_id", ""),
    "r": ("PARTITION", "partition", ""),
    "u": ("USER", "user", ""),
    "o": ("ACCOUNT", "account", ""),
    "Y": ("PRIORITY", "priority", ""),
    "y": ("PRIORITY", "priority", ""),
    "S": ("SITE", "", ""),
    "a": ("AGE", "age", ""),
    "A": ("AGE", "age", "age"),
    "b": ("ASSOC", "", ""),
    "B": ("ASSOC", "", ""),
    "f": ("FAIRSHARE", "fairshare", ""),
    "F": ("FAIRSHARE", "fairshare", "fairshare"),
    "j": ("JOBSIZE", "size", ""),
    "J": ("JOBSIZE", "size", "size"),
    "p": ("PARTITION", "partition_factor", ""),
    "P": ("PARTITION", "partition_factor", "partition"),
    "q": ("QOS", "qos_factor", ""),
    "Q": ("QOS", "qos_factor", "qos"),
    "n": ("QOSNAME", "qos", ""),
    "N": ("NICE", "nice", ""),
    "t": ("TRES", "", ""),
    "T": ("TRES", "", ""),
}
_NORMALISED = frozenset("afjpqy")
_WEIGHTED = frozenset("AFJPQ")


def parse_sprio_format(fmt: str) -> list[Piece]:
    return parse_percent_format(fmt, set(SPRIO_FIELDS))


def _sprio_value(letter: str, row: Row, weights: Mapping[str, Any], normalised: bool) -> str:
    _, key, weight_key = SPRIO_FIELDS[letter]
    if not key:
        return "0" if letter in "SB" else ""
    value = row.get(key)
    if letter in ("y", "Y"):
        if letter == "y" or normalised:
            return f"{int(value or 0) / 4294967295:.10f}"
        return str(int(value or 0))
    if letter in _NORMALISED or (normalised and letter in _WEIGHTED):
        return f"{float(value or 0):.7f}"
    if letter in _WEIGHTED:
        return str(round(float(value or 0) * float(weights.get(weight_key) or 0)))
    return str(value if value is not None else "")


def format_sprio(
    rows: Sequence[Row],
    pieces: list[Piece],
    weights: Mapping[str, Any],
    *,
    header: bool = True,
    normalised: bool = False,
    show_weights: bool = False,
) -> list[str]:
    """sprio's lines; `show_weights` (-w) prints the weights instead of the jobs."""
    keys = [p.key for p in pieces if isinstance(p, Field)]
    headers = {k: SPRIO_FIELDS[k][0] for k in keys}
    if show_weights:
        line: dict[str, str] = {}
        for k in keys:
            weight_key = SPRIO_FIELDS[k][2]
            line[k] = str(weights.get(weight_key, "")) if weight_key else ""
        line["i"] = "Weights"
        return render(pieces, [line], headers, header=header)
    table = [{k: _sprio_value(k, row, weights, normalised) for k in keys} for row in rows]
    return render(pieces, table, headers, header=header)


# -- sshare ---------------------------------------------------------------------------------

# name -> (header, width, value key)
SSHARE_FIELDS: dict[str, tuple[str, int, str]] = {
    "account": ("Account", 20, "account"),
    "user": ("User", 10, "user"),
    "rawshares": ("RawShares", 10, "raw_shares"),
    "normshares": ("NormShares", 11, "norm_shares"),
    "rawusage": ("RawUsage", 11, "raw_usage"),
    "normusage": ("NormUsage", 11, "norm_usage"),
    "effectvusage": ("EffectvUsage", 13, "norm_usage"),
    "fairshare": ("FairShare", 10, "fairshare"),
}
SSHARE_FORMAT = "Account,User,RawShares,NormShares,RawUsage,EffectvUsage,FairShare"
SSHARE_LONG_FORMAT = "Account,User,RawShares,NormShares,RawUsage,NormUsage,EffectvUsage,FairShare"


def parse_sshare_format(fmt: str) -> list[str]:
    names = []
    for item in fmt.split(","):
        name = item.strip().lower()
        if not name:
            continue
        if name not in SSHARE_FIELDS:
            raise ValueError(f"Invalid field requested: {item.strip()}")
        names.append(name)
    return names


def _share_value(name: str, row: Row) -> str:
    key = SSHARE_FIELDS[name][2]
    value = row.get(key)
    if name == "account":
        # An account's row is indented one level below root; its users' rows two.
        return (" " if not row.get("user") else "  ") + str(value or "")
    if name in ("normshares", "normusage", "effectvusage", "fairshare"):
        return f"{float(value or 0):.6f}"
    return "" if value is None else str(value)


def format_sshare(
    rows: Sequence[Row],
    names: list[str],
    *,
    header: bool = True,
    delimiter: str | None = None,
    trailing: bool = False,
) -> list[str]:
    """sshare's lines: fixed columns (the account's name left-justified, the rest right,
    each followed by a space, a dashes line under the header), or `delimiter`-separated
    (-P; -p adds a trailing delimiter)."""
    table = [[_share_value(n, row) for n in names] for row in rows]
    heads = [SSHARE_FIELDS[n][0] for n in names]
    widths = [SSHARE_FIELDS[n][1] for n in names]
    lefts = [n == "account" for n in names]
    return table_lines(heads, table, widths, lefts, header, delimiter, trailing)


def table_lines(
    heads: list[str],
    table: list[list[str]],
    widths: list[int],
    lefts: list[bool],
    header: bool,
    delimiter: str | None,
    trailing: bool = False,
) -> list[str]:
    """The accounting commands' table: each cell cut to its width (a `+` marks the cut),
    justified, and followed by a space, with a dashes line under the header; or the
    cells joined by `delimiter`."""
    if delimiter is not None:
        end = delimiter if trailing else ""
        return [delimiter.join(r) + end for r in ([heads] if header else []) + table]
    out: list[str] = []
    if header:
        out.append(
            "".join(
                _cell(h, w, left) + " " for h, w, left in zip(heads, widths, lefts, strict=True)
            )
        )
        out.append("".join("-" * w + " " for w in widths))
    for row in table:
        out.append(
            "".join(_cell(v, w, left) + " " for v, w, left in zip(row, widths, lefts, strict=True))
        )
    return out


def _cell(value: str, width: int, left: bool) -> str:
    """A cell cut to width with a `+` at the end when too long (sacct, sacctmgr, sshare)."""
    if len(value) > width:
        value = value[: width - 1] + "+"
    return value.ljust(width) if left else value.rjust(width)


# -- sacctmgr -------------------------------------------------------------------------------

ASSOC_COLUMNS: tuple[tuple[str, int], ...] = (
    ("Cluster", 10),
    ("Account", 10),
    ("User", 10),
    ("Partition", 10),
    ("Share", 9),
    ("Priority", 10),
    ("GrpJobs", 7),
    ("GrpTRES", 13),
    ("GrpSubmit", 9),
    ("GrpWall", 11),
    ("GrpTRESMins", 13),
    ("MaxJobs", 7),
    ("MaxTRES", 13),
    ("MaxTRESPerNode", 14),
    ("MaxSubmit", 9),
    ("MaxWall", 11),
    ("MaxTRESMins", 13),
    ("QOS", 20),
    ("Def QOS", 9),
    ("GrpTRESRunMins", 13),
)
USER_COLUMNS: tuple[tuple[str, int], ...] = (("User", 10), ("Def Acct", 10), ("Admin", 9))
ACCOUNT_COLUMNS: tuple[tuple[str, int], ...] = (("Account", 10), ("Descr", 20), ("Org", 20))
QOS_COLUMNS: tuple[tuple[str, int], ...] = (
    ("Name", 10),
    ("Priority", 10),
    ("GraceTime", 10),
    ("Preempt", 10),
    ("PreemptMode", 11),
    ("MaxTRESPU", 13),
    ("MaxJobsPU", 9),
    ("MaxTRESPA", 13),
)
CLUSTER_COLUMNS: tuple[tuple[str, int], ...] = (
    ("Cluster", 10),
    ("ControlHost", 15),
    ("ControlPort", 12),
    ("RPC", 5),
    ("Share", 9),
    ("GrpJobs", 7),
    ("GrpTRES", 13),
    ("GrpSubmit", 9),
    ("MaxJobs", 7),
    ("MaxTRES", 13),
    ("MaxSubmit", 9),
    ("MaxWall", 11),
    ("QOS", 20),
    ("Def QOS", 9),
)


def association_cells(row: Row) -> dict[str, str]:
    """An association (the organisation is the account; each member a user of it). An
    empty Def QOS means the cluster's default QoS applies, as in Slurm."""
    return {
        "Cluster": str(row.get("cluster", "")),
        "Account": str(row.get("account", "")),
        "User": str(row.get("user", "")),
        "Share": str(row.get("shares", 1)),
        "QOS": ",".join(row.get("qos") or []),
    }


def user_cells(row: Row) -> dict[str, str]:
    return {"User": str(row.get("user", "")), "Def Acct": str(row.get("account", "")),
            "Admin": "None"}  # fmt: skip


def account_cells(row: Row) -> dict[str, str]:
    account = str(row.get("account", ""))
    return {"Account": account, "Descr": account, "Org": account}


def _grace(seconds: Any) -> str:
    total = int(float(seconds or 0))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}"


def qos_cells(row: Row) -> dict[str, str]:
    per_user = row.get("max_gpus_per_user")
    per_account = row.get("max_gpus_per_account")
    jobs = row.get("max_jobs_per_user")
    return {
        "Name": str(row.get("name", "")),
        "Priority": str(row.get("priority", 0)),
        "GraceTime": _grace(row.get("grace_s")),
        "Preempt": ",".join(row.get("preempt") or []),
        "PreemptMode": "cluster"
        if row.get("preempt_mode") == "requeue"
        else str(row.get("preempt_mode") or ""),  # fmt: skip
        "MaxTRESPU": f"gres/gpu={per_user}" if per_user is not None else "",
        "MaxJobsPU": "" if jobs is None else str(jobs),
        "MaxTRESPA": f"gres/gpu={per_account}" if per_account is not None else "",
    }


def cluster_cells(name: str, qos: Sequence[str]) -> dict[str, str]:
    """The cluster's row. Its controllers' address is not shown to tenants (scontrol ping
    names them neither); the port and RPC version are Slurm 22.05's."""
    return {"Cluster": name, "ControlPort": "6817", "RPC": "9728", "Share": "1",
            "QOS": ",".join(qos)}  # fmt: skip


def format_sacctmgr(
    columns: Sequence[tuple[str, int]],
    rows: Sequence[Mapping[str, str]],
    *,
    header: bool = True,
    delimiter: str | None = None,
    trailing: bool = False,
) -> list[str]:
    """sacctmgr's table: right-justified columns, or `|`-separated with -P (-p adds a
    trailing `|`)."""
    heads = [name for name, _ in columns]
    table = [[row.get(name, "") for name, _ in columns] for row in rows]
    widths = [w for _, w in columns]
    return table_lines(heads, table, widths, [False] * len(heads), header, delimiter, trailing)
