"""Ctrl-C (SIGINT to the terminal's foreground process group) or SIGTERM stops only this launch.

The deepspeed runner's own handler, on SIGINT/SIGTERM in a pdsh launch, runs
``pdsh -w HOSTS pkill -f "PYTHON -u -m deepspeed.launcher.launch"`` (multinode_runner.py
``PDSHRunner.get_cmd``, runner.py ``sigkill_handler``): every launch.py of that interpreter on those
hosts, another run's too. ``dstk launch --launcher pdsh`` starts the runner in its own session (the
terminal's SIGINT reaches dstk only), never signals it, and stops its own run by its tag
(``dstk.launch.nodefail``). The test runs 2 "nodes" of this machine over the loopback sshd
(tests/services.py) next to a decoy: a real launch.py of the same interpreter, another run's, whose
command line the runner's pkill pattern matches. After the signal the decoy must be alive, the run's
ranks gone within seconds, and dstk must exit 130 (SIGINT) or 143 (SIGTERM) with one line naming what
it stopped. The local launcher's Ctrl-C (the runner and launch.py in the terminal's group stop their
ranks themselves) is checked too.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.launch_support import (SLEEPER, Output, clean_env, cmdlines, hangup_default, python, start_decoy, stop_all,
                                  stop_group)
from tests.services import generate_tiny_run, generate_two_node_run, sshd_fixture

REPO = Path(__file__).resolve().parent.parent
GONE_SECONDS = 20
"""The run's ranks must be gone this soon after the signal (the stop takes about 1-3 s here; 5x for load)."""
EXIT_SECONDS = 120
"""dstk must have exited this soon after the signal (its stop waits up to 5 s + 30 s for a stuck runner)."""

sshd = sshd_fixture()
__all__ = ["python"]  # a fixture from tests/launch_support.py, used by the pdsh test

@pytest.fixture(scope="module")
def two_node_run(tmp_path_factory) -> tuple[Path, Path]:
    return generate_two_node_run(tmp_path_factory.mktemp("interrupt"), repo=REPO)


@pytest.fixture(scope="module")
def local_run(tmp_path_factory) -> Path:
    """The tiny example, generated (1 node, 2 CPU ranks)."""
    return generate_tiny_run(tmp_path_factory.mktemp("interrupt-local"), repo=REPO)


def _signal_and_wait(proc: subprocess.Popen, out: Output, signum: int, *, marker: str) -> tuple[int, float, float]:
    """Send ``signum`` the way a user does (SIGINT: to the foreground process group, as the terminal's
    Ctrl-C; SIGTERM: to dstk's pid, as kill does); return (exit code, seconds until no process whose command
    line holds ``marker`` is left, seconds until dstk exited)."""
    sent = time.monotonic()
    if signum == signal.SIGINT:
        os.killpg(proc.pid, signum)
    else:
        os.kill(proc.pid, signum)
    gone_at = None
    deadline = sent + EXIT_SECONDS
    while time.monotonic() < deadline and (gone_at is None or proc.poll() is None):
        if gone_at is None and not any(marker in c for c in cmdlines().values()):
            gone_at = time.monotonic()
        time.sleep(0.1)
    if proc.poll() is None:
        raise AssertionError(f"dstk launch did not exit after {signal.Signals(signum).name}:\n{out.text()[-4000:]}")
    ended = time.monotonic()
    out.join()
    left = {p: c for p, c in cmdlines().items() if marker in c}
    assert gone_at is not None and not left, (left, out.text()[-4000:])
    return proc.returncode, gone_at - sent, ended - sent


@pytest.mark.distributed
@pytest.mark.parametrize("signum, early", [(signal.SIGINT, False), (signal.SIGTERM, False), (signal.SIGINT, True)],
                         ids=["ctrl-c", "sigterm", "ctrl-c-while-starting"])
def test_a_signal_stops_only_this_pdsh_run(sshd, python, two_node_run, tmp_path, free_port, signum, early):
    """``early``: the signal comes as soon as the runner has started pdsh, before the nodes' launch.py (the
    stop repeats while the runner lives on, so a launch.py that starts after the first stop is stopped too)."""
    run, hostfile = two_node_run
    script = tmp_path / "sleeping_rank.py"
    script.write_text(SLEEPER)
    decoy = proc = None
    try:
        decoy = start_decoy(tmp_path, free_port + 1 if free_port < 65535 else free_port - 1, python=python)
        decoy_out = Output(decoy)
        decoy_out.wait_for(lambda text: "ready" in text, what="the decoy's rank", proc=decoy)
        # dstk hands its own interpreter's path to the runner, which runs it on every node
        argv = [python, "-m", "dstk", "launch", str(run), "--hostfile", str(hostfile), "--launcher", "pdsh",
                "--master-addr", "127.0.0.1", "--master-port", str(free_port), "--", str(script)]
        # start_new_session: dstk's own process group stands for the terminal's foreground group
        proc = subprocess.Popen(argv, env=clean_env(**sshd.env, LOCAL_RANK="0", RANK="0", WORLD_SIZE="1"), cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                preexec_fn=hangup_default)
        out = Output(proc)
        if early:
            out.wait_for(lambda text: "cmd = pdsh " in text, what="the runner's pdsh", proc=proc)
        else:
            out.wait_for(lambda text: "localhost: [rank 0] ready 0" in text and "127.0.0.1: [rank 1] ready 1" in text,
                         what="both ranks", proc=proc)
        rc, gone_seconds, exit_seconds = _signal_and_wait(proc, out, signum, marker=str(script))
        text = out.text()
        name = signal.Signals(signum).name
        print(f"{name}: the run's ranks were gone {gone_seconds:.1f} s after it, dstk exited after {exit_seconds:.1f} s")
        assert rc == 128 + signum, text[-4000:]
        assert decoy.poll() is None, f"the runner's pkill killed another run's launch.py:\n{text[-4000:]}"
        assert any(str(tmp_path / "decoy_rank.py") in c for c in cmdlines().values()), "the decoy's rank is gone"
        assert gone_seconds < GONE_SECONDS, text[-4000:]
        # both "nodes" are this machine and stop at the same time: which stop signals a process, and whether
        # launch.py ended its rank before a stop saw it, is a race (each machine counts what it signalled);
        # each node has launch.py, the rank's wrapper and the script
        stopped = re.findall(rf"^dstk: stopped by {name}: stopped this run's ranks on every node: "
                             r"localhost \((\d+) process(?:es)?\), 127\.0\.0\.1 \((\d+) process(?:es)?\)$", text, re.M)
        assert len(stopped) == 1 and (early or sum(map(int, stopped[0])) >= 2), text[-4000:]
        assert len(re.findall(r"^dstk: stopped by ", text, re.M)) == 1, text[-4000:]
        # nothing else of the run (runner, pdsh, ssh, launch.py) is left either
        left = {p: c for p, c in cmdlines().items() if f"--master_port={free_port}" in c or str(script) in c}
        assert not left, left
        assert "Traceback" not in text and "pkill" not in text, text[-4000:]
    finally:
        stop_all(proc, decoy, patterns=(str(script), str(tmp_path / "decoy_rank.py")))


@pytest.mark.distributed
def test_ctrl_c_stops_a_local_run(local_run, tmp_path, free_port):
    """The local launcher: the runner, launch.py and the ranks share the terminal's process group, so
    each gets the SIGINT; launch.py stops its ranks, and dstk exits 130."""
    script = tmp_path / "sleeping_rank.py"
    script.write_text(SLEEPER)
    proc = None
    try:
        argv = [sys.executable, "-m", "dstk", "launch", str(local_run), "--master-port", str(free_port), "--", str(script)]
        proc = subprocess.Popen(argv, env=clean_env(LOCAL_RANK="0", RANK="0"), cwd=REPO, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True, preexec_fn=hangup_default)
        out = Output(proc)
        out.wait_for(lambda text: "[rank 0] ready 0" in text and "[rank 1] ready 1" in text, what="both ranks", proc=proc)
        rc, gone_seconds, exit_seconds = _signal_and_wait(proc, out, signal.SIGINT, marker=str(script))
        print(f"local SIGINT: ranks gone after {gone_seconds:.1f} s, dstk exited after {exit_seconds:.1f} s")
        text = out.text()
        assert rc == 130, text[-4000:]
        assert gone_seconds < GONE_SECONDS, text[-4000:]
        assert text.splitlines()[-1] == "interrupted", text[-4000:]
        left = {p: c for p, c in cmdlines().items() if f"--master_port={free_port}" in c or str(script) in c}
        assert not left, left
    finally:
        stop_all(proc, patterns=(str(script),))


def test_interrupt_stops_by_tag_never_signals_the_runner_and_ignores_the_nodes_ending(tmp_path):
    """``NodeWatch.interrupt`` with nodes that cannot be reached: it says what it does, the stop over pdsh
    fails for them (said), the runner -- a shell that ignores SIGINT/SIGTERM, so only SIGKILL ends it -- is
    killed with its tree after ``runner_wait_seconds``; the nodes' ends that follow are no failure."""
    import shutil

    from dstk.launch.nodefail import NodeWatch

    if shutil.which("pdsh") is None:
        pytest.skip("pdsh is not installed (python tests/services.py install)")
    runner = subprocess.Popen(["bash", "-c", "trap '' INT TERM; sleep 120 & wait; wait"], start_new_session=True)
    said: list[str] = []
    try:
        watch = NodeWatch(hosts={"node-a.invalid": [0], "node-b.invalid": [0]}, tag="0123456789abcdef",
                          python=sys.executable, cwd=str(tmp_path), grace_seconds=0.5, runner_wait_seconds=1,
                          sink=lambda stream, line: said.append(line))
        watch.start(runner)
        watch.interrupt(signal.SIGINT)
        assert runner.wait(timeout=10) == -signal.SIGKILL
        watch.feed("pdsh@vm: node-b.invalid: ssh exited with exit code 255\n")
        assert watch.failure is None
        assert said == ["dstk: SIGINT: stopping this run's ranks on every node (node-a.invalid, node-b.invalid)\n"]
        messages = watch.messages()
        assert messages[0] == "stopped by SIGINT", messages
        assert messages[1].startswith("could not stop the ranks on node-a.invalid, node-b.invalid"), messages
        assert messages[-1] == "the runner had not ended 1 s after that: killed it"
    finally:
        stop_group(runner)
