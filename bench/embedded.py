"""The embedded platform as the benchmarks start it (`make up`'s: SQLite, file-system
broker, simulated nodes), in a directory of its own, its logs' tails printed if the
benchmark fails (bench/cli.py, bench/e2e.py, bench/portal.py)."""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spurcloud.stack import Stack  # noqa: E402
from tests.fixtures.processes import free_port, free_port_range  # noqa: E402


def on_platform(
    prefix: str,
    nodes: list[tuple[str, str]],
    run: Callable[[Stack, dict[str, str]], int],
    *,
    env: dict[str, str] | None = None,
    config: str = "",
    replicas: int = 1,
    ready_s: float = 180,
) -> int:
    """`run(stack, demo credentials)` on a platform started with `nodes`, `env` added to
    every process's environment, `config` appended to its spur.toml, and `replicas`
    controllers (a Raft group when more than one)."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        # The organisations' accounts pass through it to their workspaces (as root).
        Path(tmp).chmod(0o711)
        stack = Stack(
            state_dir=Path(tmp) / "spur",
            web_port=free_port(),
            ctld_port=free_port(),
            raft_port=free_port(),
            agent_base_port=free_port_range(len(nodes)),
            ssh_base_port=free_port_range(len(nodes)),
            nodes=nodes,
            quiet=True,
            more_controllers=[(free_port(), free_port()) for _ in range(replicas - 1)],
        )
        try:
            stack.prepare()
            stack.env.update(env or {})
            if config:
                with (stack.state_dir / "spur.toml").open("a") as toml:
                    toml.write(config)
            stack.manage("migrate", "--noinput")
            creds = stack.seed()
            stack.start_all()
            stack.wait_ready(timeout=ready_s)
            return run(stack, creds)
        except Exception:
            for name in ("web", "worker", "spurctld"):
                log = stack.logs / f"{name}.log"
                if log.exists():
                    print(f"--- {name}.log (tail) ---", file=sys.stderr)
                    print(log.read_text(errors="replace")[-3000:], file=sys.stderr)
            raise
        finally:
            stack.stop_all()
