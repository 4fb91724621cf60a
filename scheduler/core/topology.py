"""The network between nodes, from configuration: a switch tree and blocks.

Switch tree, as Slurm's topology.conf (a switch lists nodes or lower switches)::

    {"switches": {"leaf1": {"nodes": "gpu[01-02]"}, "spine": {"switches": "leaf[1-2]"}}}

Blocks, as Slurm's topology/block (racks of `block_size` nodes on one fabric, such as an
NVL72 or MI455 rack)::

    {"block_size": 18, "blocks": {"b1": "gpu[01-18]"}}

Multi-node jobs are gangs: placement asks `groups()` for the candidate nodes grouped
under the lowest switch (or the fewest blocks) that holds enough of them, because
traffic between nodes of one leaf crosses one switch rather than the spine.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import hostlist

from scheduler.core.errors import InvalidSpec


@dataclass(frozen=True)
class Switch:
    name: str
    nodes: frozenset[str]  # attached directly
    switches: tuple[str, ...]  # lower switches
    level: int  # 0 for a leaf; one above its highest child otherwise
    below: frozenset[str]  # every node under it


@dataclass(frozen=True)
class Topology:
    switches: Mapping[str, Switch] = field(default_factory=dict)
    blocks: Mapping[str, frozenset[str]] = field(default_factory=dict)
    block_size: int = 0
    config: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_config(cls, data: Mapping[str, Any] | None) -> Topology:
        if not data:
            return cls()
        if not isinstance(data, Mapping):
            raise InvalidSpec("topology must be an object")
        unknown = set(data) - {"switches", "blocks", "block_size"}
        if unknown:
            raise InvalidSpec(f"topology: unknown field(s) {', '.join(sorted(unknown))}")
        switches = _switch_tree(data.get("switches", {}))
        blocks = {
            str(name): frozenset(_expand(nodes, f"block {name}"))
            for name, nodes in sorted(dict(data.get("blocks", {})).items())
        }
        seen: set[str] = set()
        for name, members in blocks.items():
            if seen & members:
                raise InvalidSpec(f"topology: block {name} shares nodes with another block")
            seen |= members
        size = int(data.get("block_size", 0))
        if size < 0 or any(size and len(m) > size for m in blocks.values()):
            raise InvalidSpec("topology: a block holds more nodes than block_size")
        return cls(switches=switches, blocks=blocks, block_size=size, config=dict(data))

    def to_config(self) -> dict[str, Any]:
        return dict(self.config)

    def leaf_of(self, node: str) -> str | None:
        """The lowest switch the node hangs on, None when the tree does not name it."""
        best: Switch | None = None
        for sw in self.switches.values():
            if node in sw.nodes and (best is None or (sw.level, sw.name) < (best.level, best.name)):
                best = sw
        return best.name if best else None

    def lowest_common_switch(self, nodes: Iterable[str]) -> str | None:
        wanted = frozenset(nodes)
        holders = [sw for sw in self.switches.values() if wanted <= sw.below]
        if not holders:
            return None
        return min(holders, key=lambda sw: (sw.level, len(sw.below), sw.name)).name

    def block_of(self, node: str) -> str | None:
        for name, members in self.blocks.items():
            if node in members:
                return name
        return None

    def groups(self, candidates: Sequence[str], count: int) -> list[list[str]]:
        """Candidate nodes grouped as a gang of `count` should take them, best first.

        Each group holds at least `count` candidates, ordered so that the first `count`
        stay as close as the group allows; the caller keeps the candidates' own order
        (its best-fit order) within a leaf or block. With no topology: one group, as
        given."""
        if self.switches:
            return self._switch_groups(candidates, count)
        if self.blocks:
            return self._block_groups(candidates, count)
        return [list(candidates)] if len(candidates) >= count else []

    def _switch_groups(self, candidates: Sequence[str], count: int) -> list[list[str]]:
        rank = {n: i for i, n in enumerate(candidates)}
        leaf = {n: self.leaf_of(n) for n in candidates}
        holders = []
        for sw in self.switches.values():
            inside = [n for n in candidates if n in sw.below]
            if len(inside) >= count:
                # Lowest level first; then the tightest fit, keeping big switches whole.
                holders.append((sw.level, len(inside), sw.name, inside))
        groups: list[list[str]] = []
        for _, _, _, inside in sorted(holders, key=lambda h: h[:3]):
            by_leaf: dict[str | None, list[str]] = {}
            for n in inside:
                by_leaf.setdefault(leaf[n], []).append(n)
            # Span as few leaves as possible: the fullest leaves first.
            ordered = sorted(by_leaf.values(), key=lambda ns: (-len(ns), rank[ns[0]]))
            groups.append([n for ns in ordered for n in ns])
        unplaced = [n for n in candidates if leaf[n] is None]
        if len(unplaced) >= count:
            groups.append(unplaced)
        return groups

    def _block_groups(self, candidates: Sequence[str], count: int) -> list[list[str]]:
        rank = {n: i for i, n in enumerate(candidates)}
        by_block: dict[str, list[str]] = {}
        for n in candidates:
            block = self.block_of(n)
            if block is not None:
                by_block.setdefault(block, []).append(n)
        single = sorted(
            (ns for ns in by_block.values() if len(ns) >= count),
            key=lambda ns: (len(ns), rank[ns[0]]),
        )
        groups = [list(ns) for ns in single]
        if not groups:
            # No block holds the gang: the fewest blocks, the fullest first.
            ordered = sorted(by_block.values(), key=lambda ns: (-len(ns), rank[ns[0]]))
            merged = [n for ns in ordered for n in ns]
            if len(merged) >= count:
                groups.append(merged)
        return groups


def _expand(value: Any, where: str) -> list[str]:
    if not isinstance(value, str):
        raise InvalidSpec(f"topology: {where} must be a hostlist string")
    try:
        return list(hostlist.expand_hostlist(value))
    except hostlist.BadHostlist as exc:
        raise InvalidSpec(f"topology: {where}: bad hostlist {value!r}: {exc}") from exc


def _switch_tree(raw: Any) -> dict[str, Switch]:
    if not isinstance(raw, Mapping):
        raise InvalidSpec("topology: switches must be an object")
    direct: dict[str, tuple[frozenset[str], tuple[str, ...]]] = {}
    for name, body in sorted(raw.items()):
        if not isinstance(body, Mapping) or set(body) - {"nodes", "switches"}:
            raise InvalidSpec(f"topology: switch {name} takes only nodes and switches")
        nodes = frozenset(_expand(body["nodes"], f"switch {name}")) if "nodes" in body else None
        lower = tuple(_expand(body["switches"], f"switch {name}")) if "switches" in body else ()
        direct[str(name)] = (nodes or frozenset(), lower)
    for name, (_, lower) in direct.items():
        missing = [s for s in lower if s not in direct]
        if missing:
            raise InvalidSpec(f"topology: switch {name} names unknown switch(es) {missing}")
    out: dict[str, Switch] = {}

    def build(name: str, path: tuple[str, ...]) -> Switch:
        if name in out:
            return out[name]
        if name in path:
            raise InvalidSpec(f"topology: switch {name} is its own ancestor")
        nodes, lower = direct[name]
        children = [build(s, (*path, name)) for s in lower]
        below = nodes.union(*(c.below for c in children)) if children else nodes
        level = 1 + max(c.level for c in children) if children else 0
        out[name] = Switch(name, nodes, lower, level, frozenset(below))
        return out[name]

    for name in direct:
        build(name, ())
    return dict(sorted(out.items()))
