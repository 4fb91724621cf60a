"""Slurm hostlists (`gpu[01-04,07]`), over the python-hostlist library.

Slurm keeps a hostlist in the order it was given (allocation order matters: the batch
script runs on the first node), while `hostlist.collect_hostlist` sorts; `compress`
therefore only hands the library runs that are already in its order.
"""

from __future__ import annotations

from collections.abc import Iterable

import hostlist as _hostlist


def expand(text: str) -> list[str]:
    """`gpu[01-02],cpu1` -> `["gpu01", "gpu02", "cpu1"]`, in the given order."""
    if not text.strip():
        return []
    try:
        names: list[str] = _hostlist.expand_hostlist(text, allow_duplicates=True, sort=False)
    except _hostlist.BadHostlist as exc:
        raise ValueError(f"invalid hostlist {text!r}: {exc}") from exc
    return names


def compress(names: Iterable[str]) -> str:
    """`["n01", "n02", "n10"]` -> `n[01-02,10]`, never reordering the names."""
    ordered = [n for n in names if n]
    if not ordered:
        return ""
    if _compresses_in_order(ordered):
        return _collect(ordered)
    parts: list[str] = []
    run: list[str] = []
    for name in ordered:
        if run and not _compresses_in_order([*run, name]):
            parts.append(_collect(run))
            run = []
        run.append(name)
    parts.append(_collect(run))
    return ",".join(parts)


def _collect(names: list[str]) -> str:
    collected: str = _hostlist.collect_hostlist(names)
    return collected


def _compresses_in_order(names: list[str]) -> bool:
    if len(set(names)) != len(names):
        return False
    return expand(_collect(names)) == names
