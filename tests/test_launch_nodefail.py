"""One failed node stops the whole pdsh launch (``dstk.launch.nodefail``).

The distributed test runs the deepspeed runner's pdsh path over the loopback sshd (tests/services.py)
with two "nodes" of this machine, 1 gloo rank each. Node 1's rank raises after its first step. Rank 0
then waits the way an NCCL rank waits for a dead peer: without noticing it. gloo itself notices a closed
peer socket at once ("Connection closed by peer", seen here), so rank 0 waits outside a collective for
``HANG_SECONDS`` instead, and only then takes its next step (which fails on the closed socket, as the
short gloo timeout would). Without dstk's watcher the launch ends only after that wait; with it, within
seconds of the failure, naming node 127.0.0.1 and rank 1 with the traceback's last line, and no process
of the run is left.

The unit tests cover the parts that need no cluster: which output lines are a node's failure, which
processes of a machine belong to a run (a fake /proc, and real processes signalled for real), and the
tag that plan_launch hands the runner.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dstk.launch.command import LaunchSpec, plan_launch
from dstk.launch.hosts import Host
from dstk.launch.nodefail import (RUN_TAG_VAR, NodeFailure, NodeWatch, failure_from_line, runs_launch_module,
                                  stop_command, stop_tagged, tagged_pids, why_line)
from tests.services import generate_two_node_run, sshd_fixture

REPO = Path(__file__).resolve().parent.parent
TIMEOUT_SECONDS = 420  # a fresh machine builds DeepSpeed's ops on the first start (about 2 minutes)
HANG_SECONDS = 150
"""How long rank 0 waits after rank 1 failed (an NCCL rank would wait 10-30 min)."""
STOP_SECONDS = 45
"""The launch must end this soon after the failure is printed (the watcher's stop takes about 1-6 s)."""

FAILING_RANK = """\
import argparse, datetime, os, time

import deepspeed
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--deepspeed_config", required=True)
parser.add_argument("--local_rank", type=int, default=0)
args = parser.parse_args()
hang = float(os.environ["DSTK_TEST_HANG_SECONDS"])
deepspeed.init_distributed(dist_backend="gloo", timeout=datetime.timedelta(seconds=hang))
torch.manual_seed(0)
model = torch.nn.Linear(8, 8)
engine, *_ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()), config=args.deepspeed_config)
rank = torch.distributed.get_rank()
dtype = next(engine.module.parameters()).dtype
for step in (1, 2):
    x = torch.randn(engine.train_micro_batch_size_per_gpu(), 8, dtype=dtype)
    loss = engine(x).float().pow(2).mean()
    engine.backward(loss)
    engine.step()
    print(f"step {step} done", flush=True)
    if os.environ["DSTK_TEST_FAIL"] == "none":
        time.sleep(hang)  # both ranks: the test cuts node 1's ssh connection meanwhile
        continue
    if rank == 1 and os.environ["DSTK_TEST_FAIL"] == "sigkill":
        os.kill(os.getpid(), 9)  # as the kernel's OOM killer does
    if rank == 1:
        raise RuntimeError("injected failure on node 1 after its first step")
    time.sleep(hang)  # rank 0: blind to the dead peer, as NCCL is
from dstk.launch.rank import exit_rank
exit_rank()
"""

sshd = sshd_fixture()


@pytest.fixture(scope="module")
def two_node_run(tmp_path_factory) -> tuple[Path, Path]:
    return generate_two_node_run(tmp_path_factory.mktemp("nodefail"), repo=REPO)


def _cmdlines() -> dict[int, str]:
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                out[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                pass
    return out


def _tags_of(pids) -> set[str]:
    tags = set()
    for pid in pids:
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        tags |= {e.split(b"=", 1)[1].decode() for e in env if e.startswith(RUN_TAG_VAR.encode() + b"=")}
    return tags


# (how rank 1 fails, dstk launch flags, exit code, the failure line, the line that says why)
CASES = {
    # the rank wrapper's report names the rank
    "raise": ("raise", [], 1, "dstk: node 127.0.0.1 failed: rank 1 exited with code 1 first\n",
              r"^dstk:   why: 127\.0\.0\.1: \[rank 1\] .*RuntimeError: injected failure on node 1"),
    # no wrapper: pdsh's "ssh exited with exit code 247" (launch.py's sys.exit(-9)) is all there is
    "sigkill-no-prefix": ("sigkill", ["--no-prefix"], 247,
                          "dstk: node 127.0.0.1 failed: its launcher exited with code 247 (a rank was killed by SIGKILL; "
                          "rank 1 ran there) first\n",
                          r"^dstk:   why: 127\.0\.0\.1: .*\[launch\.py:\d+:sigkill_handler\] .* exits with return code = -9"),
    # node 1's connection drops (the test kills pdsh's ssh to it): its ranks live on, orphaned (sshd sends no
    # SIGHUP to a command without a tty) -- the stop reaches them over a new connection
    "ssh-drop": ("none", [], 128 + 9,
                 "dstk: node 127.0.0.1 failed: its ssh connection was killed by SIGKILL (rank 1 ran there) first\n", None),
}


@pytest.mark.distributed
@pytest.mark.parametrize("case", list(CASES))
def test_a_failed_node_stops_every_node_and_is_named(sshd, two_node_run, tmp_path, free_port, case):
    how, flags, want_rc, want_failure, want_why = CASES[case]
    run, hostfile = two_node_run
    script = tmp_path / "failing_rank.py"
    script.write_text(FAILING_RANK)
    argv = [sys.executable, "-m", "dstk", "launch", str(run), "--hostfile", str(hostfile), "--launcher", "pdsh",
            "--master-addr", "127.0.0.1", "--master-port", str(free_port), *flags,
            "--env", f"DSTK_TEST_HANG_SECONDS={HANG_SECONDS}", "--env", f"DSTK_TEST_FAIL={how}", "--", str(script)]
    # A caller's own rank identity (a test session that ran DeepSpeed in-process leaves LOCAL_RANK
    # and RANK behind) must not reach the runner: the stopper would take pdsh and ssh for ranks.
    stale = {"LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "1"}
    proc = subprocess.Popen(argv, env={**os.environ, **sshd.env, **stale}, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    started = time.monotonic()
    lines: list[tuple[float, str]] = []
    tags: set[str] = set()

    def read() -> None:
        nonlocal how
        for line in proc.stdout:
            lines.append((time.monotonic(), line))
            if "step 1 done" in line and not tags:
                # the run's tag, from its processes (found by the test's own port)
                tags.update(_tags_of(p for p, c in _cmdlines().items() if f"--master_port={free_port}" in c))
            if how == "none" and sum("step 1 done" in text for _, text in lines) == 2:
                ssh = [p for p, c in _cmdlines().items()
                       if c.startswith(("ssh ", "/usr/bin/ssh ")) and " 127.0.0.1 " in c and f"--master_port={free_port}" in c]
                assert len(ssh) == 1, ssh
                os.kill(ssh[0], signal.SIGKILL)
                how = "dropped"

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError("timed out:\n" + "".join(line for _, line in lines)[-4000:]) from None
    ended = time.monotonic()
    reader.join(timeout=10)
    out = "".join(line for _, line in lines)
    assert rc == want_rc, out[-4000:]
    failed_at = next((t for t, line in lines if line.startswith(want_failure.removesuffix(" first\n"))), None)
    assert failed_at is not None, out[-4000:]
    print(f"{case}: dstk launch ended {ended - failed_at:.1f} s after it printed the failure ({ended - started:.1f} s in all)")
    assert ended - failed_at < STOP_SECONDS, f"ended {ended - failed_at:.0f} s after the failure\n{out[-4000:]}"
    # the node, the rank, and the line that says why
    assert want_failure in out, out[-4000:]
    if want_why is not None:
        assert re.search(want_why, out, re.M), out[-4000:]
    assert re.search(r"^dstk: stopped this run's ranks on every node: ", out, re.M), out[-4000:]
    # rank 0 was stopped by the watcher, not by its own timeout
    assert "step 2 done" not in out, out[-4000:]
    if not flags:
        assert "rank 0 on " in out and "sent by the launcher after another rank failed" in out, out[-4000:]
    # nothing of the run is left on this machine (both "nodes" are this machine)
    assert len(tags) == 1, (tags, out[-4000:])
    time.sleep(1)
    left = {p: c for p, c in _cmdlines().items() if str(script) in c or f"--master_port={free_port}" in c}
    assert not left, left
    assert tagged_pids(tag=tags.pop()) == []


# --- units -------------------------------------------------------------------------------------

@pytest.mark.parametrize("line, want", [
    ("pdsh@vm: 127.0.0.1: ssh exited with exit code 1\n", NodeFailure(node="127.0.0.1", rank=None, returncode=1,
                                                                       line="pdsh@vm: 127.0.0.1: ssh exited with exit code 1")),
    ("pdsh@login-1.cluster: node-7.cluster: ssh exited with exit code 255\n",
     NodeFailure(node="node-7.cluster", rank=None, returncode=255,
                 line="pdsh@login-1.cluster: node-7.cluster: ssh exited with exit code 255")),
    ("pdsh@vm: localhost: ssh exited with exit code 0\n", None),
    ("pdsh@vm: 127.0.0.1: ssh killed by signal 9\n", NodeFailure(node="127.0.0.1", rank=None, returncode=-9,
                                                                   line="pdsh@vm: 127.0.0.1: ssh killed by signal 9")),
    ('node-3: DSTK_RANK_EXIT {"rank": 5, "returncode": -9, "host": "n3", "stopped": false}\n',
     NodeFailure(node="node-3", rank=5, returncode=-9,
                 line='node-3: DSTK_RANK_EXIT {"rank": 5, "returncode": -9, "host": "n3", "stopped": false}')),
    # a rank the launcher stopped, or one that finished, is not the failure
    ('node-3: DSTK_RANK_EXIT {"rank": 4, "returncode": -15, "host": "n3", "stopped": true}\n', None),
    ('node-3: DSTK_RANK_EXIT {"rank": 4, "returncode": 0, "host": "n3", "stopped": false}\n', None),
    ("node-3: [rank 4] pdsh@vm: 127.0.0.1: ssh exited with exit code 1\n", None),
    ("node-3: [rank 4] RuntimeError: boom\n", None),
])
def test_failure_lines(line, want):
    assert failure_from_line(line) == want


def test_failure_descriptions_name_node_and_rank():
    assert NodeFailure(node="n1", rank=3, returncode=1, line="").describe() == "node n1 failed: rank 3 exited with code 1"
    assert NodeFailure(node="n1", rank=3, returncode=-9, line="").describe() == "node n1 failed: rank 3 was killed by SIGKILL"
    assert NodeFailure(node="n1", rank=None, returncode=3, line="").describe() == \
        "node n1 failed: its launcher exited with code 3"
    assert NodeFailure(node="n1", rank=None, returncode=247, line="").describe(node_ranks=(2, 3)) == \
        "node n1 failed: its launcher exited with code 247 (a rank was killed by SIGKILL; ranks 2, 3 ran there)"
    assert "ssh's code" in NodeFailure(node="n1", rank=None, returncode=255, line="").describe()


def test_why_is_the_failed_ranks_last_error_line():
    lines = ["n0: [rank 0] RuntimeError: Connection closed by peer\n",
             "n1: [rank 1] Traceback (most recent call last):\n",
             "n1: [rank 1]   File \"train.py\", line 3\n",
             "n1: [rank 1] ValueError: bad batch\n",
             "n1: [rank 10] KeyError: 'x'\n",
             "n1: [2026-12-03 11:13:55,584] [ERROR] [launch.py:259:sigkill_handler] ... exits with return code = 1\n",
             "pdsh@vm: n1: ssh exited with exit code 1\n"]
    assert why_line(lines, failure=NodeFailure(node="n1", rank=1, returncode=1, line="")) == "n1: [rank 1] ValueError: bad batch"
    # a node without a rank (pdsh's line): the last error of any of its ranks
    assert why_line(lines, failure=NodeFailure(node="n1", rank=None, returncode=1, line="")) == "n1: [rank 10] KeyError: 'x'"
    assert why_line(lines, failure=NodeFailure(node="n2", rank=None, returncode=1, line="")) is None


@pytest.mark.parametrize("argv, want", [
    ([b"/venv/bin/python", b"-u", b"-m", b"deepspeed.launcher.launch", b"--world_info=e30="], True),
    ([b"python3", b"-m", b"deepspeed.launcher.launch"], True),
    ([b"python", b"-u", b"-m", b"deepspeed.launcher.runner", b"--hostfile", b"h"], False),
    # pdsh and ssh carry the remote command's words, the tag in their environment too: not launch.py
    ([b"pdsh", b"-S", b"-f", b"1024", b"-w", b"a,b", b"cd /w;", b"python", b"-u", b"-m", b"deepspeed.launcher.launch"], False),
    ([b"/usr/bin/ssh", b"-x", b"a", b"export X=1; cd /w; python -u -m deepspeed.launcher.launch"], False),
    ([b"python", b"-u", b"train.py", b"-m", b"deepspeed.launcher.launch"], False),
])
def test_launch_py_is_told_from_pdsh_and_ssh(argv, want):
    assert runs_launch_module(argv) is want


def _fake_proc(root: Path, pid: int, *, env: dict[str, str], argv: list[str]) -> None:
    d = root / str(pid)
    d.mkdir()
    (d / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))
    (d / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in argv))


def test_tagged_pids_are_the_runs_ranks_and_launchers_only(tmp_path):
    tag = "0123456789abcdef"
    mine = {RUN_TAG_VAR: tag}
    _fake_proc(tmp_path, 11, env={**mine, "LOCAL_RANK": "0"}, argv=["python", "-u", "-m", "dstk.launch.rank"])
    _fake_proc(tmp_path, 12, env={**mine, "LOCAL_RANK": "0"}, argv=["python", "-u", "train.py"])
    _fake_proc(tmp_path, 13, env=mine, argv=["python", "-u", "-m", "deepspeed.launcher.launch", "--node_rank=0"])
    _fake_proc(tmp_path, 21, env=mine, argv=["python", "-u", "-m", "deepspeed.launcher.runner"])
    _fake_proc(tmp_path, 22, env=mine, argv=["pdsh", "-S", "-w", "a", "python", "-m", "deepspeed.launcher.launch"])
    _fake_proc(tmp_path, 31, env={RUN_TAG_VAR: "fedcba9876543210", "LOCAL_RANK": "0"}, argv=["python", "train.py"])
    _fake_proc(tmp_path, 32, env={"LOCAL_RANK": "0"}, argv=["python", "train.py"])
    assert tagged_pids(tag=tag, proc_root=tmp_path) == [11, 12, 13]
    # another user's processes are never touched, whatever they hold
    assert tagged_pids(tag=tag, proc_root=tmp_path, uid=os.getuid() + 1) == []


def test_stop_tagged_signals_only_the_runs_processes(tmp_path):
    """Real processes: two of the run (a rank that ignores SIGTERM gets SIGKILL), one of another run,
    one with the tag but no rank (the runner's side) -- only the first two end."""
    tag, other = "a1b2c3d4e5f60718", "99999999aaaaaaaa"
    sleeper = [sys.executable, "-c", "import signal, sys, time\n"
                                     "if sys.argv[1] == 'stubborn': signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                                     "print('up', flush=True); time.sleep(120)"]
    # An earlier in-process DeepSpeed test may have left LOCAL_RANK in this process's environment.
    base = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", RUN_TAG_VAR)}
    procs = {name: subprocess.Popen(sleeper + [name], env={**base, **env}, stdout=subprocess.PIPE, text=True)
             for name, env in (("rank", {RUN_TAG_VAR: tag, "LOCAL_RANK": "0"}),
                               ("stubborn", {RUN_TAG_VAR: tag, "LOCAL_RANK": "1"}),
                               ("other-run", {RUN_TAG_VAR: other, "LOCAL_RANK": "0"}),
                               ("runner-side", {RUN_TAG_VAR: tag}))}
    try:
        for p in procs.values():
            assert p.stdout.readline() == "up\n"
        report = stop_tagged(tag=tag, grace_seconds=1)
        assert sorted(report.terminated) == sorted([procs["rank"].pid, procs["stubborn"].pid])
        assert report.killed == (procs["stubborn"].pid,) and report.left == ()
        assert procs["rank"].wait(timeout=10) == -signal.SIGTERM
        assert procs["stubborn"].wait(timeout=10) == -signal.SIGKILL
        assert procs["other-run"].poll() is None and procs["runner-side"].poll() is None
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


def _spec(**kw) -> LaunchSpec:
    hosts = (Host(name="n0", num_slots=1), Host(name="n1", num_slots=1))
    return LaunchSpec(script="train.py", num_nodes=2, hosts=hosts, hostfile="/tmp/h", launcher="pdsh", **kw)


def test_the_tag_reaches_the_runner_env_only_when_given():
    assert RUN_TAG_VAR not in plan_launch(_spec()).env
    plan = plan_launch(_spec(run_tag="00ff00ff00ff00ff"))
    assert plan.env[RUN_TAG_VAR] == "00ff00ff00ff00ff"
    # the runner exports PYTHON* variables to every node (deepspeed/launcher/runner.py EXPORT_ENVS)
    assert RUN_TAG_VAR.startswith("PYTHON")
    with pytest.raises(ValueError, match="run_tag"):
        _spec(run_tag="x; rm -rf /")


def test_stop_command_runs_the_stopper_on_every_host():
    argv = stop_command(hosts=["n0", "n1"], tag="00ff00ff00ff00ff", python="/venv/bin/python", cwd="/work dir")
    assert argv[:4] == ["pdsh", "-S", "-w", "n0,n1"]
    assert argv[4] == ("cd '/work dir'; /venv/bin/python -m dstk.launch.nodefail --tag 00ff00ff00ff00ff "
                       "--grace-seconds 5")


def test_a_runner_that_does_not_end_is_killed_with_its_tree(tmp_path):
    """A node that cannot be reached: the stop over pdsh fails for it (said), and the runner -- here a
    shell with a child, as the runner has pdsh and ssh below it -- is SIGKILLed with its tree."""
    if shutil.which("pdsh") is None:
        pytest.skip("pdsh is not installed (python tests/services.py install)")
    child_pid = tmp_path / "child.pid"
    runner = subprocess.Popen(["bash", "-c", f"sleep 120 & echo $! > {child_pid}; wait"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not child_pid.is_file() or not child_pid.read_text().strip():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        child = int(child_pid.read_text())
        watch = NodeWatch(hosts={"node-a.invalid": [0], "node-b.invalid": [0]}, tag="0123456789abcdef",
                          python=sys.executable, cwd=str(tmp_path), grace_seconds=0.5, runner_wait_seconds=1)
        watch.start(runner)
        watch.feed('node-b.invalid: DSTK_RANK_EXIT {"rank": 1, "returncode": 3, "host": "b", "stopped": false}\n')
        watch.feed('node-b.invalid: DSTK_RANK_EXIT {"rank": 0, "returncode": 5, "host": "a", "stopped": false}\n')
        watch.join(timeout=90)
        assert runner.wait(timeout=10) == -signal.SIGKILL
        deadline = time.monotonic() + 10
        while Path(f"/proc/{child}").exists() and Path(f"/proc/{child}/stat").read_text().split(") ")[-1][:1] != "Z":
            assert time.monotonic() < deadline, "the runner's child is still alive"
            time.sleep(0.05)
        messages = watch.messages()
        assert messages[0] == "node node-b.invalid failed: rank 1 exited with code 3 first"  # the first failure only
        assert any(m.startswith("could not stop the ranks on node-a.invalid, node-b.invalid") for m in messages)
        assert messages[-1] == "the runner had not ended 1 s after that: killed it"
    finally:
        try:
            os.killpg(runner.pid, signal.SIGKILL)  # the shell and its sleep, if a check above failed
        except ProcessLookupError:
            pass
        runner.wait()
