"""Helpers shared by the tests that start real runs (the deepspeed runner, its ranks, dstk's training
workers, a CLI child killed at each step): one command in its own session, killed as a whole group on
a timeout; the pid of one rank's training worker; a kill-point child's step; the loss rows a run's
csv monitor wrote."""

from __future__ import annotations

import csv
import io
import os
import signal
import subprocess
from pathlib import Path

import pytest


def run_group(argv: list[str], *, timeout: float = 600, stderr=subprocess.PIPE,
              **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(capture_output=True, text=True)`` in a new session whose whole process group
    (the deepspeed runner and the ranks too) is killed on a timeout: killing ``dstk`` alone leaves
    its ranks running. ``stderr=subprocess.STDOUT`` merges it into ``stdout`` (``stderr`` is then "");
    ``kwargs`` go to ``Popen`` (``env``, ``cwd``). A timeout fails the test with the tails of both."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=stderr, text=True, start_new_session=True,
                            **kwargs)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{argv} ran past {timeout} s:\n{out[-3000:]}\n{(err or '')[-3000:]}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err or "")


def worker_pid(spec: Path, rank: int) -> int | None:
    """The pid of the ``dstk.train.worker`` of ``rank`` training ``spec`` (its finetune.json), read
    from each visible process's ``/proc/PID/cmdline``; None while there is none."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"dstk.train.worker" in args and str(spec).encode() in args and f"--local_rank={rank}".encode() in args:
            return int(proc.name)
    return None


def until_paused(proc: subprocess.Popen) -> str | None:
    """Read a kill-point child's stdout (the ``CHILD`` scripts of tests/test_hardening_*.py, whose
    chosen step prints ``PAUSED <step>`` and sleeps until killed) past the command's own output: the
    step it paused at, or None once it printed ``DONE <exit code>``. Anything else (the child died)
    fails the test with its stderr."""
    line = proc.stdout.readline()
    while line and not line.startswith(("PAUSED", "DONE")):
        line = proc.stdout.readline()
    if line.startswith("DONE"):
        return None
    assert line.startswith("PAUSED"), (line, proc.stderr.read() if proc.poll() is not None else "")
    return line.split(" ", 1)[1].strip()


def loss_segments(path: Path | None) -> list[list[tuple[int, float]]]:
    """The (step, loss) rows of DeepSpeed's csv monitor file ``path`` (``Train_loss.csv``), one segment
    per process that wrote them (each writes the ``step,loss`` header again when it first writes);
    [] while there is no file."""
    segments: list[list[tuple[int, float]]] = []
    text = path.read_text() if path is not None and path.exists() else ""
    for row in csv.reader(io.StringIO(text)):
        if row == ["step", "loss"]:
            segments.append([])
        elif row:
            segments[-1].append((int(row[0]), float(row[1])))
    return segments
