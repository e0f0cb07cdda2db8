"""Per-rank wrapper: ``python -m dstk.launch.rank [--exec] [--local_rank=N] [-m] SCRIPT ARGS...``.

The runner starts this in place of the training script. It runs the script as a child with the
same interpreter and arguments (``--local_rank=N`` moved after the script, where DeepSpeed puts
it), prefixes every line of its output with ``[rank R]``, and on exit prints one report line::

    DSTK_RANK_EXIT {"rank": 1, "returncode": -9, "host": "node-a", "stopped": false}

``run_launch`` reads these lines from the runner's output -- across nodes too, since pdsh and
srun stream it back -- because the runner hides how a rank ended (it exits 0 when its child was
killed by a signal). The wrapper then ends the way the script did: with its exit code, or by
the same signal, so the runner behaves exactly as without it. One exception: a script that died of an
uncaught exception and then aborted in gloo's teardown at interpreter exit ends with exit code 1, as
Python's does for an uncaught exception (``UncaughtThenAbort``), so the launcher names the exception.

Under ``--launcher slurm`` srun starts the wrapper with Slurm's task variables only: it gives the script
the torch.distributed ones (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, ...; ``srun_rank_env``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading

from dstk.launch.command import RANK_EXEC_FLAG, REPORT_TAG, SRUN_MASTER_VARS

_RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")


def _tasks_per_node(value: str) -> list[int]:
    """Slurm's compressed task counts (``SLURM_STEP_TASKS_PER_NODE``: ``2(x3),1``) -> [2, 2, 2, 1] (pure);
    [] for anything else."""
    counts: list[int] = []
    for part in value.split(","):
        num, sep, repeat = part.partition("(x")
        if not num.isdigit() or (sep and not (repeat.endswith(")") and repeat[:-1].isdigit())):
            return []
        counts += [int(num)] * (int(repeat[:-1]) if sep else 1)
    return counts


def srun_rank_env(*, environ=os.environ) -> dict[str, str]:
    """The torch.distributed variables for a rank that srun started, missing from ``environ`` (pure).

    ``dstk launch --launcher slurm`` runs the runner's srun backend (``srun -n N --export=ALL,... PYTHON -u
    -m dstk.launch.rank SCRIPT``; multinode_runner.py ``SlurmRunner.get_cmd``, DeepSpeed 0.19.8), which sets
    no RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT, so ``deepspeed.init_distributed`` falls back to
    MPI discovery (comm/comm.py ``required_env``) and fails without mpi4py. They come from srun's task
    variables (srun(1) "OUTPUT ENVIRONMENT VARIABLES"): RANK = ``SLURM_PROCID``, WORLD_SIZE =
    ``SLURM_STEP_NUM_TASKS`` (else ``SLURM_NTASKS``), LOCAL_RANK = ``SLURM_LOCALID``, LOCAL_SIZE = this node's
    entry of ``SLURM_STEP_TASKS_PER_NODE``, CROSS_RANK = ``SLURM_NODEID``, CROSS_SIZE = ``SLURM_STEP_NUM_NODES``
    (else ``SLURM_NNODES``): what launch.py sets for its ranks (launcher/launch.py ``current_env``); and
    MASTER_ADDR/MASTER_PORT from what ``dstk launch`` chose (``SRUN_MASTER_VARS``). Only where srun started
    the rank: with RANK set (launch.py, torchrun, or the user) or no ``SLURM_PROCID`` it is ``{}``, and a
    variable already set is never replaced -- except MASTER_ADDR/MASTER_PORT when ``dstk launch`` chose them:
    srun's ``--export=ALL`` hands every rank the launching shell's environment, where a MASTER_PORT is most
    likely left over (an earlier in-process DeepSpeed run leaves its own; seen in the test suite), and dstk's
    choice is the one ``--master-addr``/``--master-port`` set and the shm clean-up looks for, as under
    launch.py, which always passes dstk's values."""
    if "RANK" in environ or not environ.get("SLURM_PROCID", "").isdigit():
        return {}
    counts = _tasks_per_node(environ.get("SLURM_STEP_TASKS_PER_NODE", ""))
    node = environ.get("SLURM_NODEID", "")
    found = {
        "RANK": environ["SLURM_PROCID"],
        "WORLD_SIZE": environ.get("SLURM_STEP_NUM_TASKS") or environ.get("SLURM_NTASKS"),
        "LOCAL_RANK": environ.get("SLURM_LOCALID"),
        "LOCAL_SIZE": str(counts[int(node)]) if node.isdigit() and int(node) < len(counts) else None,
        "CROSS_RANK": node or None,
        "CROSS_SIZE": environ.get("SLURM_STEP_NUM_NODES") or environ.get("SLURM_NNODES"),
        **{torch_var: environ.get(ours) for torch_var, ours in SRUN_MASTER_VARS},
    }
    chosen = {torch_var for torch_var, ours in SRUN_MASTER_VARS if environ.get(ours)}
    return {k: v for k, v in found.items() if v and (k not in environ or k in chosen)}


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


_TORCH_RANK_PREFIX = re.compile(rb"^\[rank\d+\]: ?")
"""What torch.distributed's excepthook puts before each line of an uncaught exception's traceback."""
_TRACEBACK_HEAD = b"Traceback (most recent call last):"
_CHAINED = (b"During handling of the above exception", b"The above exception was the direct cause")
_TERMINATE = b"terminate called without an active exception"
TEARDOWN_ABORT_LINE = (b"dstk: the interpreter then aborted at exit (std::terminate in a gloo thread's teardown, "
                       b"not the cause: the uncaught exception above is); exit code 1, as Python's for an uncaught "
                       b"exception\n")
"""Written in place of the ``terminate called`` line that follows an uncaught exception's traceback."""


class UncaughtThenAbort:
    """Watches a rank's output for gloo's abort at interpreter exit right after an uncaught exception.

    A script that dies of an uncaught exception on CPU ranks finalizes the interpreter with gloo's
    threads alive, and then meets the race ``exit_rank`` avoids on a clean exit: ``terminate called
    without an active exception`` and SIGABRT. The rank's failure is the exception; reported as
    SIGABRT, the launcher would blame native code. So: the last line of a traceback on stderr,
    followed by that ``terminate`` line within ``MAX_LINES_AFTER`` stderr lines and no stdout line,
    is an uncaught exception, and the rank exits 1 as Python does for one. A traceback that logging
    printed (the script went on) is followed by more output and does not count."""

    MAX_LINES_AFTER = 20

    def __init__(self):
        self.in_traceback = False
        self.exception: bytes | None = None
        """The last traceback's exception line, while nothing but a few stderr lines followed it."""
        self.lines_after = 0
        self.aborted = False
        """True once the ``terminate`` line came right after an uncaught exception."""

    def stderr_line(self, line: bytes) -> bool:
        """Note one stderr line; True when it is the teardown abort after an uncaught exception."""
        body = _TORCH_RANK_PREFIX.sub(b"", line.rstrip(b"\r\n"), count=1)
        if body.startswith(_TRACEBACK_HEAD):
            self.in_traceback, self.exception = True, None
            return False
        if self.in_traceback:
            if body and not body[:1].isspace() and not body.startswith(_CHAINED):
                self.in_traceback, self.exception, self.lines_after = False, body, 0
            return False
        if self.exception is not None:
            if body.strip() == _TERMINATE:
                self.aborted = True
                return True
            self.lines_after += 1
            if self.lines_after > self.MAX_LINES_AFTER:
                self.exception = None
        return False

    def stdout_line(self, _line: bytes) -> None:
        """The script printed after the traceback: it was not its end."""
        self.exception = None


def _pump(src, dst, prefix: bytes, watch=None) -> None:
    for line in iter(src.readline, b""):
        if watch is not None and watch(line):
            line = TEARDOWN_ABORT_LINE
        dst.write(prefix + line if line.endswith(b"\n") else prefix + line + b"\n")
        dst.flush()
    src.close()


def stale_lock_message(*, environ=os.environ) -> str | None:
    """What a rank says instead of starting when its node's torch extensions cache (its own
    ``TORCH_EXTENSIONS_DIR``) holds a stale op-build lock (``dstk.launch.locks``): DeepSpeed would wait for
    it forever, and under srun (``--launcher slurm``) nothing checked that node before. None: none there."""
    from dstk.launch.locks import extensions_root, find_stale_locks, rm_command

    stale = find_stale_locks(extensions_root(environ))
    if not stale:
        return None
    return (f"dstk: stale op-build lock(s) in the torch extensions cache of {socket.gethostname()}, left by a build "
            f"that was killed: {' '.join(map(str, stale))}; DeepSpeed would wait for them forever, so this rank did "
            f"not start\n  fix: no process holds them open, so remove them on that node: {rm_command(stale)}\n")


def _write_report(*, rank: int | None, returncode: int, stopped: bool) -> None:
    """The ``DSTK_RANK_EXIT`` line ``run_launch`` reads (the module docstring)."""
    report = {"rank": rank, "returncode": returncode, "host": socket.gethostname(), "stopped": stopped}
    sys.stdout.write(REPORT_TAG + json.dumps(report) + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    stale = stale_lock_message()
    if argv[:1] == [RANK_EXEC_FLAG]:
        if stale:
            sys.stderr.write(stale)
            return 1
        # only the variables, then the script in this process: srun sees its exit code and signals directly
        child = child_argv(argv[1:])
        os.execve(child[0], child, {**os.environ, **srun_rank_env()})
    rank = rank_from_env()
    prefix = f"[rank {rank if rank is not None else '?'}] ".encode()
    if stale:
        sys.stderr.buffer.write(b"".join(prefix + line.encode() + b"\n" for line in stale.splitlines()))
        sys.stderr.flush()
        _write_report(rank=rank, returncode=1, stopped=False)
        return 1
    proc = subprocess.Popen(child_argv(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, **srun_rank_env()})
    stopped: list[int] = []

    def forward(signum, _frame):
        # The launcher stops the other ranks with SIGTERM when one fails: pass it on and say so.
        stopped.append(signum)
        proc.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, forward)
    teardown = UncaughtThenAbort()
    pumps = [threading.Thread(target=_pump, args=(proc.stdout, sys.stdout.buffer, prefix, teardown.stdout_line),
                              daemon=True),
             threading.Thread(target=_pump, args=(proc.stderr, sys.stderr.buffer, prefix, teardown.stderr_line),
                              daemon=True)]
    for t in pumps:
        t.start()
    returncode = proc.wait()
    for t in pumps:
        t.join(timeout=5)
    if returncode == -signal.SIGABRT and teardown.aborted:
        returncode = 1  # the uncaught exception was the end (``UncaughtThenAbort``)
    _write_report(rank=rank, returncode=returncode, stopped=bool(stopped))
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
