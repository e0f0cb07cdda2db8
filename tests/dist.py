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
    # Every rank's pipe is drained at once: reading rank 0 to the end first would block a rank that
    # fills its 64 KiB pipe while rank 0 waits for it in a collective (a deadlock, seen with warnings).
    import threading
    import time

    outputs: list[list[str]] = [[] for _ in procs]

    def drain(i: int) -> None:
        for line in procs[i].stdout:
            outputs[i].append(line)

    readers = [threading.Thread(target=drain, args=(i,), daemon=True) for i in range(len(procs))]
    for t in readers:
        t.start()
    results = []
    deadline = time.monotonic() + timeout
    try:
        for rank, p in enumerate(procs):
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                for t in readers:
                    t.join(timeout=10)
                report = "\n".join(f"--- rank {i} ---\n{''.join(o)[-6000:]}" for i, o in enumerate(outputs))
                raise AssertionError(f"ranks still running after {timeout} s:\n{report}") from None
        for t in readers:
            t.join(timeout=30)
        results = [RankResult(rank, p.returncode, "".join(outputs[rank])) for rank, p in enumerate(procs)]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if check and any(r.returncode != 0 for r in results):
        report = "\n".join(f"--- rank {r.rank} (exit {r.returncode}) ---\n{r.output[-6000:]}" for r in results)
        raise AssertionError(f"a rank failed:\n{report}")
    return results
