"""tests/procs.py, the helpers the distributed tests share, on real processes: a timeout kills
the command's whole group (what a deepspeed runner leaves behind: its ranks), a rank's worker is
found by its command line, and the csv monitor's loss rows split per writing process (until_paused
is exercised by tests/test_hardening_*.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.procs import loss_segments, run_group, worker_pid


def _gone(pid: int) -> bool:
    """Dead or a zombie (no init reaps orphans in some containers)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def test_run_group_returns_what_it_ran():
    done = run_group(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout=30)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")
    merged = run_group(["sh", "-c", "echo out; echo err >&2"], stderr=subprocess.STDOUT, timeout=30)
    assert (merged.stdout, merged.stderr) == ("out\nerr\n", "")


def test_run_group_kills_the_whole_group_on_a_timeout(tmp_path):
    pid_file = tmp_path / "child.pid"
    # the shell stands for the runner; its background sleep for a rank it started, holding the pipes
    # open as ranks do (killing the shell alone would leave communicate() waiting for the sleep)
    started = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match="ran past 1 s"):
        run_group(["sh", "-c", f"sleep 60 & echo $! > {pid_file}; echo started; wait"], timeout=1)
    assert time.monotonic() - started < 30
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while not _gone(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(child), f"the group's other process {child} outlived the timeout"


def test_worker_pid_finds_the_rank_by_its_command_line(tmp_path):
    spec = tmp_path / "finetune.json"
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "-m", "dstk.train.worker",
                             str(spec), "--local_rank=1"])
    try:
        deadline = time.monotonic() + 10
        while worker_pid(spec, 1) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert worker_pid(spec, 1) == proc.pid
        assert worker_pid(spec, 0) is None
        assert worker_pid(tmp_path / "other.json", 1) is None
    finally:
        proc.kill()
        proc.wait()
    assert worker_pid(spec, 1) is None


def test_loss_segments_splits_at_each_header(tmp_path):
    """As DeepSpeed's csv monitor appends: a header from each process that wrote (a run, its resume)."""
    path = tmp_path / "Train_loss.csv"
    assert loss_segments(path) == [] and loss_segments(None) == []
    path.write_text("step,loss\n1,5.5\n2,5.25\nstep,loss\n2,5.25\n3,5.0\n\n")
    assert loss_segments(path) == [[(1, 5.5), (2, 5.25)], [(2, 5.25), (3, 5.0)]]
