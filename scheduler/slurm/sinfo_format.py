"""sinfo's output from the web API's node and partition dicts.

Partition-oriented (the default): one line per partition and group of nodes that print
alike (same state, same CPUs, ...), nodes merged into one hostlist. Node-oriented
(`-N`): one line per node and partition.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from scheduler.slurm.columns import Field, Piece, parse_percent_format, render
from scheduler.slurm.hostlist import compress
from scheduler.slurm.timefmt import format_banner_time, format_sinfo_limit

Node = Mapping[str, Any]
Partition = Mapping[str, Any]

DEFAULT_FORMAT = "%#P %.5a %.10l %.6D %.6t %N"
LONG_FORMAT = "%#P %.5a %.10l %.10s %.4r %.8h %.10g %.6D %.11T %N"
NODE_FORMAT = "%#N %.6D %#P %6t"
# Slurm 22.05 right-justifies the partition here (see 01_sinfo_idle_default golden).
NODE_LONG_FORMAT = "%#N %.6D %.#P %.11T %4c %.8z %.6m %.8d %.6w %.8f %20E"

# sinfo's node state words, long and short, to the short one it prints (and `-t` takes).
NODE_STATE_WORDS = {
    "idle": "idle",
    "mix": "mix",
    "mixed": "mix",
    "alloc": "alloc",
    "allocated": "alloc",
    "down": "down",
    "drain": "drain",
    "drained": "drain",
    "draining": "drng",
    "drng": "drng",
    "completing": "comp",
    "comp": "comp",
    "reserved": "resv",
    "resv": "resv",
    "maint": "maint",
}
_LONG_STATE = {
    "idle": "idle",
    "mix": "mixed",
    "alloc": "allocated",
    "down": "down",
    "drain": "drained",
    "drng": "draining",
    "comp": "completing",
    "resv": "reserved",
    "maint": "maint",
}
# Rows of one partition: troubled nodes first, as Slurm's `-t` sort shows them.
_STATE_ORDER = {
    s: i for i, s in enumerate(("drng", "drain", "down", "mix", "alloc", "comp", "idle"))
}
# Slurm sizes a `%#N` column one wider than its header (01_sinfo_idle_default golden).
_FIT_MINIMUM = {"N": 9, "n": 9}
# Fields that sum or list over the nodes of a row rather than tell rows apart.
_AGGREGATES = frozenset({"N", "n", "D", "C", "F"})


def node_state(node: Node) -> str:
    """The short state word: a draining node still runs jobs, a drained one does not."""
    state = NODE_STATE_WORDS.get(str(node.get("state", "")).lower(), str(node.get("state", "")))
    if state == "drain" and int(node.get("cpus_alloc") or 0):
        return "drng"
    return state


def _gres(node: Node) -> str:
    counts: dict[str, int] = {}
    for gpu in node.get("gpus") or []:
        model = str(gpu.get("model") or "")
        counts[model] = counts.get(model, 0) + 1
    if not counts:
        return "(null)"
    return ",".join(f"gpu:{m}:{c}" if m else f"gpu:{c}" for m, c in counts.items())


def _cpus_aiot(nodes: Sequence[Node]) -> str:
    alloc = idle = other = total = 0
    for node in nodes:
        cpus = int(node.get("cpus") or 0)
        used = int(node.get("cpus_alloc") or 0)
        total += cpus
        if node_state(node) in ("down", "drain", "drng"):
            other += cpus - used
            alloc += used
        else:
            alloc += used
            idle += cpus - used
    return f"{alloc}/{idle}/{other}/{total}"


def _nodes_aiot(nodes: Sequence[Node]) -> str:
    counts = {"a": 0, "i": 0, "o": 0}
    for node in nodes:
        state = node_state(node)
        if state in ("alloc", "mix", "comp"):
            counts["a"] += 1
        elif state == "idle":
            counts["i"] += 1
        else:
            counts["o"] += 1
    return f"{counts['a']}/{counts['i']}/{counts['o']}/{len(nodes)}"


def _partition_name(partition: Partition) -> str:
    return str(partition["name"]) + ("*" if partition.get("default") else "")


_NodeGetter = Callable[[Node, Partition], str]
_GroupGetter = Callable[[Sequence[Node], Partition], str]

NODE_FIELDS: dict[str, tuple[str, _NodeGetter]] = {
    "P": ("PARTITION", lambda n, p: _partition_name(p)),
    "R": ("PARTITION", lambda n, p: str(p["name"])),
    "a": ("AVAIL", lambda n, p: str(p.get("state") or "up")),
    "l": ("TIMELIMIT", lambda n, p: format_sinfo_limit(p.get("max_time_min"))),
    "L": ("DEFAULTTIME", lambda n, p: _default_time(p)),
    "t": ("STATE", lambda n, p: node_state(n)),
    "T": ("STATE", lambda n, p: _LONG_STATE.get(node_state(n), node_state(n))),
    "G": ("GRES", lambda n, p: _gres(n)),
    "c": ("CPUS", lambda n, p: str(n.get("cpus", 0))),
    "m": ("MEMORY", lambda n, p: str(n.get("memory_mb", 0))),
    "f": ("AVAIL_FEATURES", lambda n, p: ",".join(n.get("features") or []) or "(null)"),
    "b": ("ACTIVE_FEATURES", lambda n, p: ",".join(n.get("features") or []) or "(null)"),
    "E": ("REASON", lambda n, p: str(n.get("reason") or "none")),
    "z": ("S:C:T", lambda n, p: _sct(n)),
    "d": ("TMP_DISK", lambda n, p: "0"),
    "w": ("WEIGHT", lambda n, p: "1"),
    "e": ("FREE_MEM", lambda n, p: "N/A"),
    "O": ("CPU_LOAD", lambda n, p: "N/A"),
    "s": ("JOB_SIZE", lambda n, p: "1-infinite"),
    "r": ("ROOT", lambda n, p: "no"),
    "h": ("OVERSUBSCRIBE", lambda n, p: "NO"),
    "g": ("GROUPS", lambda n, p: "all"),
}
GROUP_FIELDS: dict[str, tuple[str, _GroupGetter]] = {
    "N": ("NODELIST", lambda ns, p: compress(str(n["name"]) for n in ns)),
    "n": ("HOSTNAMES", lambda ns, p: compress(str(n["name"]) for n in ns)),
    "D": ("NODES", lambda ns, p: str(len(ns))),
    "C": ("CPUS(A/I/O/T)", lambda ns, p: _cpus_aiot(ns)),
    "F": ("NODES(A/I/O/T)", lambda ns, p: _nodes_aiot(ns)),
}
LETTERS = frozenset(NODE_FIELDS) | frozenset(GROUP_FIELDS)


def _default_time(partition: Partition) -> str:
    if partition.get("default_time_min") is None:
        return "n/a"
    return format_sinfo_limit(partition.get("default_time_min"))


def _sct(node: Node) -> str:
    sockets = node.get("sockets", 1)
    cores = node.get("cores_per_socket", 1)
    threads = node.get("threads_per_core", 1)
    return f"{sockets}:{cores}:{threads}"


def parse_format(fmt: str) -> list[Piece]:
    """A `-o` format. ValueError for a letter sinfo does not know."""
    return parse_percent_format(fmt, LETTERS)


# sinfo -O names (lower case) -> the letter of the same field.
NAMES: dict[str, str] = {
    "available": "a",
    "cpus": "c",
    "cpusload": "O",
    "cpusstate": "C",
    "defaulttime": "L",
    "disk": "d",
    "features": "f",
    "features_act": "b",
    "freemem": "e",
    "gres": "G",
    "groups": "g",
    "memory": "m",
    "nodeaiot": "F",
    "nodehost": "n",
    "nodelist": "N",
    "nodes": "D",
    "oversubscribe": "h",
    "partition": "P",
    "partitionname": "R",
    "reason": "E",
    "root": "r",
    "size": "s",
    "socketcorethread": "z",
    "statecompact": "t",
    "statelong": "T",
    "time": "l",
    "weight": "w",
}
DEFAULT_LONG_WIDTH = 20


def parse_long_format(fmt: str) -> list[Piece]:
    """A `-O` format, `Name[:[.][width][suffix]],...`, 20 columns wide by default (as
    squeue -O). ValueError names the first unknown field."""
    pieces: list[Piece] = []
    for item in fmt.split(","):
        if not item.strip():
            continue
        # What follows the width is a suffix, spaces included (`Nodes:.6 `).
        name, _, rest = item.lstrip().partition(":")
        name = name.strip()
        letter = NAMES.get(name.lower())
        if letter is None:
            raise ValueError(f"Invalid node format specification: {name}")
        dot = rest.startswith(".")
        rest = rest[1:] if dot else rest
        digits = len(rest) - len(rest.lstrip("0123456789"))
        width = int(rest[:digits]) if digits else DEFAULT_LONG_WIDTH
        pieces.append(Field(letter, width=width, right=dot, suffix=rest[digits:]))
    return pieces


def format_sinfo(
    nodes: Iterable[Node],
    partitions: Iterable[Partition],
    pieces: list[Piece],
    *,
    node_oriented: bool = False,
    header: bool = True,
    states: frozenset[str] | None = None,
    partition_names: frozenset[str] | None = None,
    banner: datetime | None = None,
) -> list[str]:
    """The lines sinfo prints. `banner` puts `-l`'s date line first."""
    by_name = {str(n["name"]): n for n in nodes}
    keys = [p.key for p in pieces if isinstance(p, Field)]
    row_keys = [k for k in keys if k not in _AGGREGATES]
    rows: list[dict[str, str]] = []
    for partition in partitions:
        if partition_names is not None and str(partition["name"]) not in partition_names:
            continue
        members = [by_name[n] for n in partition.get("nodes") or [] if n in by_name]
        if states is not None:
            members = [n for n in members if node_state(n) in states]
        if node_oriented:
            groups = [[n] for n in sorted(members, key=lambda n: str(n["name"]))]
        else:
            groups = _group(members, partition, row_keys)
            if not members and states is None:
                rows.append(_empty_row(partition, keys))
                continue
        for group in groups:
            rows.append(_row(group, partition, keys))
    headers = {k: (NODE_FIELDS.get(k) or GROUP_FIELDS[k])[0] for k in keys}
    lines = render(pieces, rows, headers, header=header, fit_minimum=_FIT_MINIMUM)
    if banner is not None:
        lines.insert(0, format_banner_time(banner))
    return lines


def _group(members: list[Node], partition: Partition, keys: list[str]) -> list[list[Node]]:
    groups: dict[tuple[str, ...], list[Node]] = {}
    for node in members:
        signature = tuple(NODE_FIELDS[k][1](node, partition) for k in keys)
        groups.setdefault(signature, []).append(node)
    return sorted(groups.values(), key=lambda g: _STATE_ORDER.get(node_state(g[0]), 99))


def _row(group: Sequence[Node], partition: Partition, keys: list[str]) -> dict[str, str]:
    row: dict[str, str] = {}
    for key in keys:
        if key in GROUP_FIELDS:
            row[key] = GROUP_FIELDS[key][1](group, partition)
        else:
            row[key] = NODE_FIELDS[key][1](group[0], partition)
    return row


def _empty_row(partition: Partition, keys: list[str]) -> dict[str, str]:
    placeholder: dict[str, Any] = {"name": "", "state": "n/a"}
    row = _row([placeholder], partition, keys)
    for key in keys:
        if key in ("N", "n"):
            row[key] = ""
        elif key == "D":
            row[key] = "0"
        elif key in ("t", "T"):
            row[key] = "n/a"
    return row
