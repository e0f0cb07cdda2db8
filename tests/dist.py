"""Start N real ranks of a Python script on this machine (CPU, gloo) and collect their output.

Each rank gets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT as torch.distributed
expects. A rank that fails or hangs fails the test with every rank's output attached.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass
class RankResult:
    rank: int
    returncode: int
    output: str


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(
    script: str | Path,
    *args: str,
    world_size: int = 2,
    env: dict[str, str] | None = None,
    timeout: float = 600,
    cwd: str | Path | None = None,
    check: bool = True,
) -> list[RankResult]:
    port = _port()
    procs = []
    for rank in range(world_size):
        rank_env = dict(os.environ)
        rank_env.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world_size),
            LOCAL_WORLD_SIZE=str(world_size),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
            PYTHONUNBUFFERED="1",
        )
        rank_env.update(env or {})
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script), *args],
                env=rank_env,
                cwd=cwd,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    results = []
    try:
        for rank, p in enumerate(procs):
            out, _ = p.communicate(timeout=timeout)
            results.append(RankResult(rank, p.returncode, out))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    if check and any(r.returncode != 0 for r in results):
        report = "\n".join(f"--- rank {r.rank} (exit {r.returncode}) ---\n{r.output[-6000:]}" for r in results)
        raise AssertionError(f"a rank failed:\n{report}")
    return results
