"""Per-rank wrapper: ``python -m dstk.launch.rank [--local_rank=N] [-m] SCRIPT ARGS...``.

The runner starts this in place of the training script. It runs the script as a child with the
same interpreter and arguments (``--local_rank=N`` moved after the script, where DeepSpeed puts
it), prefixes every line of its output with ``[rank R]``, and on exit prints one report line::

    DSTK_RANK_EXIT {"rank": 1, "returncode": -9, "host": "node-a", "stopped": false}

``run_launch`` reads these lines from the runner's output -- across nodes too, since pdsh and
srun stream it back -- because the runner hides how a rank ended (it exits 0 when its child was
killed by a signal). The wrapper then ends the way the script did: with its exit code, or by
the same signal, so the runner behaves exactly as without it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading

from dstk.launch.command import REPORT_TAG

_RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")


def rank_from_env(environ=os.environ) -> int | None:
    for name in _RANK_VARS:
        value = environ.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def child_argv(argv: list[str], python: str = sys.executable) -> list[str]:
    """Our argv -> the training script's argv (pure)."""
    argv = list(argv)
    local_rank = []
    if argv and argv[0].startswith("--local_rank="):
        local_rank = [argv.pop(0)]
    module = []
    if argv and argv[0] == "-m":
        module = [argv.pop(0)]
    if not argv:
        raise SystemExit("usage: python -m dstk.launch.rank [--local_rank=N] [-m] SCRIPT [ARGS...]")
    return [python, "-u", *module, argv[0], *local_rank, *argv[1:]]


def _pump(src, dst, prefix: bytes) -> None:
    for line in iter(src.readline, b""):
        dst.write(prefix + line if line.endswith(b"\n") else prefix + line + b"\n")
        dst.flush()
    src.close()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    rank = rank_from_env()
    prefix = f"[rank {rank if rank is not None else '?'}] ".encode()
    proc = subprocess.Popen(child_argv(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stopped: list[int] = []

    def forward(signum, _frame):
        # The launcher stops the other ranks with SIGTERM when one fails: pass it on and say so.
        stopped.append(signum)
        proc.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, forward)
    pumps = [threading.Thread(target=_pump, args=(proc.stdout, sys.stdout.buffer, prefix), daemon=True),
             threading.Thread(target=_pump, args=(proc.stderr, sys.stderr.buffer, prefix), daemon=True)]
    for t in pumps:
        t.start()
    returncode = proc.wait()
    for t in pumps:
        t.join(timeout=5)
    report = {"rank": rank, "returncode": returncode, "host": socket.gethostname(), "stopped": bool(stopped)}
    sys.stdout.write(REPORT_TAG + json.dumps(report) + "\n")
    sys.stdout.flush()
    sys.stderr.flush()
    if returncode < 0:
        try:
            signal.signal(-returncode, signal.SIG_DFL)
        except (OSError, ValueError):  # SIGKILL/SIGSTOP cannot be handled, so need no reset
            pass
        os.kill(os.getpid(), -returncode)
    return returncode


def exit_rank(code: int = 0):
    """End a distributed rank: wait for the others, destroy the process group, leave without finalizing.

    Call it last in a rank's script instead of returning. torch 2.13's gloo backend (CPU ranks) can
    abort a rank that has finished its work: a gloo worker thread drops its reference to the last
    collective's Python tensors a moment *after* the collective returned, and when that moment
    falls inside interpreter finalization the thread cannot take the GIL, exits through a
    ``noexcept`` destructor, and ``std::terminate`` kills the rank with SIGABRT ("terminate called
    without an active exception"). ``destroy_process_group`` does not join gloo's threads, so the
    only way out of the race is not to finalize: flush what Python buffered and ``os._exit``.
    Seen here in 2-4 of 15 two-rank runs under load before this function existed (core dumps:
    ``~AsyncAllgatherWork`` -> ``decref_pyobject`` -> ``take_gil`` -> ``pthread_exit``).
    """
    import logging

    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing left to say
            pass
    os._exit(code if isinstance(code, int) else 1)


if __name__ == "__main__":
    sys.exit(main())
