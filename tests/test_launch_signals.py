"""SIGTERM and SIGHUP to ``dstk launch`` stop this run's ranks, and only this run's.

On a single-node launch the deepspeed runner has no signal handler (runner.py installs ``sigkill_handler``
only for a multi-node pdsh launch): ``kill``, ``timeout``, a CI job's cancel or Slurm's scancel of a batch
script used to end dstk alone, and launch.py and the ranks trained on, reparented to init. SIGHUP (an ssh
session dropped) did the same, and on a pdsh launch left every node's ranks running. ``dstk launch`` now
handles both (``dstk.launch.run._LocalStop``, and ``_StopOnSignals`` with ``NodeWatch.interrupt`` for pdsh):
it stops the run's processes by its tag, says so, and exits 128 + the signal (143, 129).

Each test runs a real launch next to a decoy: a real launch.py of the same interpreter, another run's, with
one sleeping rank; it must survive. The run's processes are found by the copy of the training script this
test made (its path is the test's own) and the run's master port.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.launch_support import (SLEEPER, Output, clean_env, cmdlines, hangup_default, python, start_decoy,
                                  stop_all)
from tests.services import generate_tiny_run, generate_two_node_run, sshd_fixture

REPO = Path(__file__).resolve().parent.parent
GONE_SECONDS = 20
"""Every process of the run must be gone this soon after the signal (about 1-3 s here; more under load)."""
EXIT_SECONDS = 120
"""dstk must have exited this soon after the signal."""

sshd = sshd_fixture()
__all__ = ["python", "sshd"]  # fixtures from other modules, used by the pdsh test


@pytest.fixture(scope="module")
def local_run(tmp_path_factory) -> Path:
    """The tiny example, generated (1 node, 2 CPU ranks)."""
    return generate_tiny_run(tmp_path_factory.mktemp("signals-local"), repo=REPO)


def _signal_dstk(proc: subprocess.Popen, out: Output, signum: int, *, markers: tuple[str, ...],
                 group: bool = False) -> tuple[float, float]:
    """Send ``signum`` to dstk's pid alone (as ``kill`` does), or with ``group`` to its process group (as a
    terminal's hangup, ``timeout`` or systemd do: the runner, launch.py and the ranks get it too); return
    (seconds until no process whose command line holds a marker is left, seconds until dstk exited). Fails
    when either takes too long."""
    sent = time.monotonic()
    if group:
        os.killpg(proc.pid, signum)
    else:
        proc.send_signal(signum)
    gone_at = None
    while time.monotonic() < sent + EXIT_SECONDS and (proc.poll() is None or (
            gone_at is None and time.monotonic() < sent + GONE_SECONDS)):
        if gone_at is None and not any(m in c for c in cmdlines().values() for m in markers):
            gone_at = time.monotonic()
        time.sleep(0.1)
    left = {p: c for p, c in cmdlines().items() if any(m in c for m in markers)}
    assert proc.poll() is not None, f"dstk did not exit after {signal.Signals(signum).name}:\n{out.text()[-4000:]}"
    ended = time.monotonic()
    out.join()
    assert gone_at is not None and not left, (f"the run's processes were not gone {GONE_SECONDS} s after the signal "
                                              f"(left now: {left})\n{out.text()[-4000:]}")
    return gone_at - sent, ended - sent


@pytest.mark.distributed
@pytest.mark.parametrize("signum, early, launcher, group", [
    (signal.SIGTERM, False, "local", False), (signal.SIGHUP, False, "local", False),
    (signal.SIGTERM, True, "local", False), (signal.SIGINT, False, "local", False),
    (signal.SIGHUP, False, "local", True), (signal.SIGTERM, False, "torchrun", False)],
    ids=["sigterm", "sighup", "sigterm-while-starting", "sigint-to-dstk-alone", "sighup-to-the-group",
         "torchrun-sigterm"])
def test_a_signal_stops_this_local_run(local_run, tmp_path, free_port, signum, early, launcher, group):
    """2 CPU ranks training the example script; the signal once rank 0 printed a step (``early``: as soon as
    the runner exists, while it still imports DeepSpeed, before it starts launch.py: the stop must come again
    while the runner lives on). SIGINT to dstk alone (``kill -INT``, not a terminal's Ctrl-C, which reaches
    the runner's whole group) keeps Ctrl-C's handling -- SIGINT to the runner, which leaves 0.25 s later
    -- and the launch.py that runner leaves behind must be stopped too. ``group``: SIGHUP to the whole group,
    as a terminal that closed sends it (every process dies by it; dstk must still exit 129 and say so).
    ``--launcher torchrun``: torchrun gets the signal and stops its workers itself."""
    script = tmp_path / "train_copy.py"
    shutil.copy(REPO / "examples" / "train.py", script)
    decoy = proc = None
    markers = (str(script), f"--master_port={free_port}", f"--master_port {free_port}")
    try:
        decoy = start_decoy(tmp_path, free_port + 1 if free_port < 65535 else free_port - 1, python=sys.executable)
        Output(decoy).wait_for(lambda text: "ready" in text, what="the decoy's rank", proc=decoy)
        argv = [sys.executable, "-m", "dstk", "launch", str(local_run), "--master-port", str(free_port),
                "--launcher", launcher, "--", str(script), "--steps", "100000"]
        # start_new_session: a test's signal must not reach pytest; dstk stands for a job's top process
        proc = subprocess.Popen(argv, env=clean_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True, preexec_fn=hangup_default)
        out = Output(proc)
        if early:
            out.wait_for(lambda _text: any("deepspeed.launcher.runner" in c and str(script) in c
                                           for c in cmdlines().values()), what="the runner", proc=proc)
        else:
            out.wait_for(lambda text: re.search(r"^\[rank 0\] step \d+ loss", text, re.M), what="a training step",
                         proc=proc)
        gone_seconds, exit_seconds = _signal_dstk(proc, out, signum, markers=markers, group=group)
        text, name = out.text(), signal.Signals(signum).name
        print(f"{name}{' (early)' if early else ''}{' to the group' if group else ''} ({launcher}): the run's "
              f"processes were gone {gone_seconds:.1f} s after it, dstk exited after {exit_seconds:.1f} s")
        assert proc.returncode == 128 + signum, text[-4000:]
        assert gone_seconds < GONE_SECONDS, text[-4000:]
        assert decoy.poll() is None, f"another run's launch.py was stopped:\n{text[-4000:]}"
        assert any(str(tmp_path / "decoy_rank.py") in c for c in cmdlines().values()), "the decoy's rank is gone"
        if signum == signal.SIGINT:
            assert text.splitlines()[-1] == "interrupted" and "dstk: stop" not in text, text[-4000:]
            return
        if launcher == "torchrun":
            assert f"dstk: {name}: stopping torchrun and its ranks on this machine\n" in text, text[-4000:]
            assert text.splitlines()[-1] == f"dstk: stopped by {name}: torchrun stopped its ranks", text[-4000:]
            return
        assert f"dstk: {name}: stopping this run's launch.py and ranks on this machine\n" in text, text[-4000:]
        stopped = re.findall(rf"^dstk: stopped by {name}: stopped this run's processes on this machine "
                             r"\((\d+) process(?:es)?\)$", text, re.M)
        # launch.py, and each rank's wrapper and script: 5 (early: what had started by then)
        assert len(stopped) == 1 and (early or group or int(stopped[0]) >= 5), text[-4000:]
        assert text.splitlines()[-1].startswith(f"dstk: stopped by {name}: "), text[-4000:]
        assert "was killed by" not in text and "did not report" not in text, text[-4000:]
    finally:
        stop_all(proc, decoy, patterns=(*markers, str(tmp_path / "decoy_rank.py")))


@pytest.mark.distributed
def test_sighup_stops_only_this_pdsh_run(sshd, python, tmp_path_factory, tmp_path, free_port):
    """pdsh: 2 "nodes" x 1 sleeping rank over the loopback sshd; SIGHUP to dstk (an ssh session dropped) stops
    both nodes' ranks by the run's tag, never by the runner's pkill (the decoy lives), and dstk exits 129."""
    run, hostfile = generate_two_node_run(tmp_path_factory.mktemp("signals-pdsh"), repo=REPO)
    script = tmp_path / "sleeping_rank.py"
    script.write_text(SLEEPER)
    decoy = proc = None
    try:
        decoy = start_decoy(tmp_path, free_port + 1 if free_port < 65535 else free_port - 1, python=python)
        Output(decoy).wait_for(lambda text: "ready" in text, what="the decoy's rank", proc=decoy)
        argv = [python, "-m", "dstk", "launch", str(run), "--hostfile", str(hostfile), "--launcher", "pdsh",
                "--master-addr", "127.0.0.1", "--master-port", str(free_port), "--", str(script)]
        proc = subprocess.Popen(argv, env=clean_env(**sshd.env), cwd=REPO, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True, preexec_fn=hangup_default)
        out = Output(proc)
        out.wait_for(lambda text: "localhost: [rank 0] ready 0" in text and "127.0.0.1: [rank 1] ready 1" in text,
                     what="both ranks", proc=proc)
        gone_seconds, exit_seconds = _signal_dstk(proc, out, signal.SIGHUP,
                                                  markers=(str(script), f"--master_port={free_port}"))
        text = out.text()
        print(f"pdsh SIGHUP: the run's ranks were gone {gone_seconds:.1f} s after it, dstk exited after "
              f"{exit_seconds:.1f} s")
        assert proc.returncode == 129, text[-4000:]
        assert gone_seconds < GONE_SECONDS, text[-4000:]
        assert decoy.poll() is None, f"the runner's pkill killed another run's launch.py:\n{text[-4000:]}"
        assert len(re.findall(r"^dstk: stopped by SIGHUP: stopped this run's ranks on every node: localhost \(\d+ "
                              r"process(?:es)?\), 127\.0\.0\.1 \(\d+ process(?:es)?\)$", text, re.M)) == 1, text[-4000:]
        assert "Traceback" not in text and "pkill" not in text, text[-4000:]
    finally:
        stop_all(proc, decoy, patterns=(str(script), str(tmp_path / "decoy_rank.py")))


@pytest.mark.distributed
@pytest.mark.parametrize("calibrate", [False, True], ids=["doctor", "doctor-calibrate"])
def test_sigterm_to_doctor_stops_its_benchmark_ranks_and_leaves_no_files(tmp_path, free_port, calibrate):
    """``dstk doctor`` starts ranks of its own (the all-reduce benchmark; ``--calibrate``: the hardware
    sweep) with the same runner a launch uses. SIGTERM to dstk alone (a job's cancel, ``kill``) used to end
    dstk with no word while the runner, launch.py and both ranks ran on, orphaned (holding the GPUs on a
    cluster), and its temporary directory and the ranks' /dev/shm buffers stayed behind. It must stop them as
    ``dstk launch`` does, say so, exit 143, and leave nothing: no temporary directory, no buffer of its port,
    no half-written profile. The ranks are made to run long (many iterations) and signalled once both run."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    profile = tmp_path / "hardware.yaml"
    argv = [sys.executable, "-m", "dstk", "doctor", "--num-ranks", "2", "--master-port", str(free_port),
            "--sizes", "4M", "--iters", "1000000"]
    argv += ["--calibrate", "--quick", "--output", str(profile)] if calibrate else []
    script = "dstk.launch.measure" if calibrate else "dstk.launch.allreduce"
    # launch.py and the runner carry the port; the ranks (wrapper and script) only the module's name
    markers = (f"--master_port={free_port}", f"--master_port {free_port}", f"-m {script} --local_rank=")
    proc = None
    try:
        proc = subprocess.Popen(argv, env=clean_env(TMPDIR=str(tmp)), cwd=tmp_path, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True, preexec_fn=hangup_default)
        out = Output(proc)
        out.wait_for(lambda _text: _ranks_past_op_load(script), what="both benchmark ranks", proc=proc)
        assert list(tmp.iterdir()), "doctor's temporary directory is not under TMPDIR: the check below would be void"
        gone_seconds, _ = _signal_dstk(proc, out, signal.SIGTERM, markers=markers)
        text = out.text()
        print(f"doctor{' --calibrate' if calibrate else ''}: SIGTERM; its ranks were gone {gone_seconds:.1f} s after")
        assert proc.returncode == 143, text[-4000:]
        assert re.search(r"^dstk: stopped by SIGTERM: stopped this run's processes on this machine \(\d+ processes\)$",
                         text, re.M), text[-4000:]
        assert "Traceback" not in text and "internal error" not in text, text[-4000:]
        if not calibrate:  # the checks done before the signal, then the benchmark as stopped
            assert re.search(r"^OK   op-build locks: ", text, re.M), text[-4000:]
            assert "SKIP allreduce: stopped by SIGTERM before it finished\n" in text, text[-4000:]
        assert list(tmp.iterdir()) == [], "doctor left its temporary directory"
        assert not [b for b in Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{free_port}_*")], \
            "doctor left its ranks' shm buffers"
        assert not profile.exists()
    finally:
        stop_all(proc, patterns=markers)


def _ranks_past_op_load(script: str) -> bool:
    """Both ranks of ``script`` run, past loading DeepSpeed's ``deepspeed_shm_comm`` (they map it): torch holds
    the op's build lock while a rank loads it, and a stop then would leave it behind."""
    ranks = [pid for pid, c in cmdlines().items() if c.split()[1:4] == ["-u", "-m", script]]

    def loaded(pid: int) -> bool:
        try:
            return "deepspeed_shm_comm" in Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            return False

    return len(ranks) == 2 and all(loaded(pid) for pid in ranks)


@pytest.mark.distributed
def test_sigterm_to_doctor_on_a_hostfile_stops_every_nodes_benchmark_ranks(sshd, tmp_path, free_port):
    """``dstk doctor --hostfile``: its benchmark is a pdsh launch (this machine twice, over the test sshd). SIGTERM
    to dstk stops both nodes' ranks by the run's tag (``NodeWatch``), as a pdsh training launch's, and exits 143.
    This venv's interpreter (a copy under another path would rebuild the shared cache's ops), signalled once the
    ranks loaded their op: dstk leaves the locks of a multi-node run alone (``clear_locks_left``)."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=1\n127.0.0.1 slots=1\n")
    argv = [sys.executable, "-m", "dstk", "doctor", "--hostfile", str(hostfile), "--master-addr", "127.0.0.1",
            "--master-port", str(free_port), "--sizes", "4M", "--iters", "1000000"]
    markers = (f"--master_port={free_port}", f"--master_port {free_port}", "-m dstk.launch.allreduce --local_rank=")
    proc = None
    try:
        proc = subprocess.Popen(argv, env=clean_env(**sshd.env), cwd=tmp_path, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True, preexec_fn=hangup_default)
        out = Output(proc)
        out.wait_for(lambda _text: _ranks_past_op_load("dstk.launch.allreduce"), what="both nodes' ranks", proc=proc)
        gone_seconds, _ = _signal_dstk(proc, out, signal.SIGTERM, markers=markers)
        text = out.text()
        print(f"doctor --hostfile (pdsh): SIGTERM; both nodes' ranks were gone {gone_seconds:.1f} s after")
        assert proc.returncode == 143, text[-4000:]
        assert re.search(r"^dstk: stopped by SIGTERM: stopped this run's ranks on every node: localhost \(\d+ "
                         r"process(?:es)?\), 127\.0\.0\.1 \(\d+ process(?:es)?\)$", text, re.M), text[-4000:]
        assert "Traceback" not in text and "internal error" not in text, text[-4000:]
    finally:
        stop_all(proc, patterns=markers)


@pytest.mark.distributed
def test_a_run_stopped_while_deepspeed_builds_its_op_removes_the_lock_it_left(tmp_path, free_port):
    """The first start on a machine builds DeepSpeed's ops, silently, for minutes; a user who stops it then
    (SIGTERM from a job's cancel; a terminal's Ctrl-C kills the build the same way) used to leave the build's
    lock in the torch extensions cache, and the next start refused to go on (or, without dstk, waited
    forever). Here the ranks build ``deepspeed_shm_comm`` into an empty cache and dstk gets SIGTERM while
    they do: the lock must be gone, with a line saying so. Another build's lock, there before the run (held by
    a process while dstk starts, which ends during the run), must stay: it is not the run's to remove."""
    from dstk.launch.locks import find_stale_locks

    ext = tmp_path / "ext"
    other = ext / "someone_elses_op" / "lock"
    other.parent.mkdir(parents=True)
    other.touch()
    holder = subprocess.Popen([sys.executable, "-c", f"import os, time; fd = os.open({str(other)!r}, os.O_RDONLY); "
                               "print('held', flush=True); time.sleep(600)"], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "held\n"
    argv = [sys.executable, "-m", "dstk", "doctor", "--num-ranks", "2", "--master-port", str(free_port), "--iters",
            "1000000"]
    markers = (f"--master_port={free_port}", f"--master_port {free_port}", "-m dstk.launch.allreduce --local_rank=")
    proc = None
    try:
        proc = subprocess.Popen(argv, env=clean_env(TORCH_EXTENSIONS_DIR=str(ext)), cwd=tmp_path,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                preexec_fn=hangup_default)
        out = Output(proc)
        out.wait_for(lambda _text: (ext / "deepspeed_shm_comm" / "lock").exists(), what="the op's build", proc=proc)
        holder.kill()
        holder.wait()
        _signal_dstk(proc, out, signal.SIGTERM, markers=markers)
        text = out.text()
        assert proc.returncode == 143, text[-4000:]
        lock = ext / "deepspeed_shm_comm" / "lock"
        assert f"dstk: removed {lock}: the run's build of DeepSpeed's op deepspeed_shm_comm was stopped half-way" \
            in text, text[-4000:]
        assert find_stale_locks(ext) == [other], text[-4000:]
    finally:
        holder.kill()
        stop_all(proc, patterns=markers)


def test_a_signal_ignored_when_dstk_started_stays_ignored():
    """``nohup dstk launch ...`` ignores SIGHUP, and so do the runner, launch.py and the ranks (an ignored signal
    survives exec): a closed terminal must not stop that run, so dstk installs no handler for it; SIGTERM's
    handler is installed and put back (also over an ignored SIGTERM: only nohup's SIGHUP is kept)."""
    from dstk.launch.run import _LocalStop, _StopOnSignals

    before = {signum: signal.getsignal(signum) for signum in _LocalStop.SIGNALS}
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        stopper = _StopOnSignals(signals=_LocalStop.SIGNALS)
        stopper.install()
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) == stopper._handler
        stopper.restore()
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
