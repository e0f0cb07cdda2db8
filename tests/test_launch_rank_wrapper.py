"""The per-rank wrapper (``python -m dstk.launch.rank``) run for real on small scripts: how it reports a
rank that died of an uncaught exception and then aborted at interpreter exit.

On CPU ranks torch's gloo threads outlive a script that raised, and interpreter finalization then meets
the race ``exit_rank`` avoids on a clean exit: "terminate called without an active exception" and SIGABRT
(seen in CI: the launch reported "rank 1 was killed by SIGABRT" and advised exit_rank, while the rank's
failure was its RuntimeError). The scripts below end that way for real -- an uncaught exception, then
an atexit handler (which runs after Python printed the traceback) that writes the C++ runtime's line and
calls abort() -- without waiting for the race.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from dstk.launch.command import REPORT_TAG
from dstk.launch.rank import TEARDOWN_ABORT_LINE, UncaughtThenAbort

ABORT_AT_EXIT = """
import atexit, os, sys
def _teardown():
    sys.stderr.write("terminate called without an active exception\\n"); sys.stderr.flush()
    os.abort()
atexit.register(_teardown)
"""


def _wrap(tmp_path, body: str) -> tuple[subprocess.CompletedProcess, dict]:
    script = tmp_path / "rank_script.py"
    script.write_text(ABORT_AT_EXIT + textwrap.dedent(body))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "MASTER_PORT")}
    env["RANK"] = "1"
    proc = subprocess.run([sys.executable, "-m", "dstk.launch.rank", str(script)], capture_output=True,
                          timeout=120, env=env)
    reports = [json.loads(line.split(REPORT_TAG.encode(), 1)[1]) for line in proc.stdout.splitlines()
               if REPORT_TAG.encode() in line]
    assert len(reports) == 1, proc.stdout
    return proc, reports[0]


def test_an_uncaught_exception_then_the_teardown_abort_is_exit_1(tmp_path):
    proc, report = _wrap(tmp_path, """
        print("step 1 done", flush=True)
        raise RuntimeError("injected failure after step 1")
    """)
    assert proc.returncode == 1 and report["returncode"] == 1
    err = proc.stderr.decode()
    assert "[rank 1] RuntimeError: injected failure after step 1" in err
    # the C++ line is replaced by one that says what it was, so neither the launcher's why line nor its
    # diagnosis ("a rank aborted in native code") takes it for the cause
    assert "terminate called" not in err
    assert err.rstrip("\n").endswith(TEARDOWN_ABORT_LINE.decode().rstrip("\n"))


def test_torch_distributed_prefixed_and_chained_tracebacks_count(tmp_path):
    # torch.distributed's excepthook writes "[rankN]: " before every line of the traceback
    proc, report = _wrap(tmp_path, """
        import sys, traceback
        def hook(kind, value, tb):
            for line in "".join(traceback.format_exception(kind, value, tb)).splitlines():
                sys.stderr.write(f"[rank1]: {line}\\n")
        sys.excepthook = hook
        try:
            {}["missing"]
        except KeyError as exc:
            raise ValueError("while handling the batch") from exc
    """)
    assert report["returncode"] == proc.returncode == 1, proc.stderr.decode()[-2000:]


def test_an_abort_without_an_exception_stays_sigabrt(tmp_path):
    proc, report = _wrap(tmp_path, """
        print("step 1 done", flush=True)
    """)
    assert proc.returncode == -signal.SIGABRT and report["returncode"] == -signal.SIGABRT
    assert b"terminate called without an active exception" in proc.stderr


def test_a_logged_traceback_the_script_went_on_from_stays_sigabrt(tmp_path):
    proc, report = _wrap(tmp_path, """
        import logging, time
        try:
            1 / 0
        except ZeroDivisionError:
            logging.exception("skipped a bad batch")
        time.sleep(0.5)  # training goes on, and logs (stdout and stderr are read by two threads: only the
        print("step 2 done", flush=True)  # stderr lines are in a sure order, so they decide here)
        for step in range(3, 30):
            logging.warning("step %d: loss scale unchanged", step)
    """)
    assert proc.returncode == -signal.SIGABRT and report["returncode"] == -signal.SIGABRT


def test_the_watcher_needs_the_abort_right_after_the_traceback():
    watch = UncaughtThenAbort()
    for line in (b"Traceback (most recent call last):\n", b'  File "x.py", line 1, in <module>\n',
                 b"RuntimeError: boom\n"):
        assert not watch.stderr_line(line)
    for _ in range(UncaughtThenAbort.MAX_LINES_AFTER + 1):
        watch.stderr_line(b"[W] some warning at exit\n")
    assert not watch.stderr_line(b"terminate called without an active exception\n") and not watch.aborted
