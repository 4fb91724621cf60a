"""`-M/--clusters`: a Spur platform is one cluster. The commands take its own name (or
`all`), as Slurm's do for a cluster of a federation, and refuse any other name in Slurm
22.05's words (checked against the Slurm peer of ../shared/peers/slurm): each unknown
name gets `No cluster 'x' known by database.`, and a list that names none known gets
`'x,y' can't be reached now, ...` and exit 1; a list that names ours goes on (exit 0).
With `-M`, `sbatch --parsable` prints `N;cluster`, `sbatch` `Submitted batch job N on
cluster c`, and squeue and sinfo a `CLUSTER: c` line before their header.

The name is the one the API reports (`GET /api/v1/config`: ClusterName, the platform's
SPUR_CLUSTER_NAME), asked for only when `-M` was given: no other command line pays.
"""

from __future__ import annotations

import sys

from scheduler.cli.api import ApiClient


def cluster_name(client: ApiClient) -> str:
    config = client.object("GET", "api/v1/config").get("config") or {}
    return str(config.get("ClusterName") or "")


def names(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def choose(prog: str, value: str, client: ApiClient, *, quiet: bool = False) -> str | None:
    """The platform's name if `value` (a `-M` list) names it; otherwise None, once the
    reasons are printed (the command then exits 1). Each other name is reported, as
    Slurm reports names its database does not know; sacct, which only filters, asks
    `quiet`ly."""
    ours = cluster_name(client)
    wanted = names(value)
    if "all" in (n.lower() for n in wanted):
        return ours
    if not quiet:
        for name in wanted:
            if name != ours:
                print(f"{prog}: error: No cluster '{name}' known by database.", file=sys.stderr)
    if ours in wanted:
        return ours
    if not quiet:
        print(
            f"{prog}: error: '{value}' can't be reached now, or it is an invalid entry for "
            "--cluster.  Use 'sacctmgr list clusters' to see available clusters.",
            file=sys.stderr,
        )
    return None
