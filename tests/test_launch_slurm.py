"""`dstk launch --slurm` run for real: a one-node Slurm cluster on this machine (tests/services.py).

`dstk generate` -> `dstk launch --slurm` -> `sbatch` (from another directory, as users do) -> the job
trains the tiny example on 2 CPU ranks; squeue no longer lists it and `scontrol show job` says
COMPLETED. A job whose rank exits non-zero or is SIGKILLed ends FAILED, with the rank named by dstk
(``dstk: rank 1 on HOST ...``) in the job's output. Skipped, with the reason, where the cluster cannot
start (not root, no apt to install slurm-wlm/munge).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dstk.launch.command import REPORT_TAG
from tests.services import Unavailable, generate_tiny_run, start_slurm

REPO = Path(__file__).resolve().parent.parent
CRASH = Path(__file__).parent / "data" / "launch" / "scripts" / "crash.py"
JOB_TIMEOUT_SECONDS = 420  # a fresh machine builds DeepSpeed's ops on the first start (about 2 minutes)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    try:
        cluster = start_slurm(tmp_path_factory.mktemp("slurm"))
    except Unavailable as exc:
        pytest.skip(f"no Slurm cluster: {exc}")
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """The README's tiny example, generated (1 node, 2 CPU ranks)."""
    return generate_tiny_run(tmp_path_factory.mktemp("gen"), repo=REPO)


def submit(slurm, run_dir: Path, tmp_path: Path, *script: str, name: str,
           flags: tuple[str, ...] = ()) -> tuple[dict[str, str], str]:
    """`dstk launch --slurm` in the repository (relative script path), `sbatch` from ``tmp_path``;
    wait for the job to leave the queue; return its final record and its output."""
    sbatch = tmp_path / f"{name}.sbatch"
    env = {**os.environ, **slurm.env}
    done = subprocess.run([sys.executable, "-m", "dstk", "launch", str(run_dir), "--slurm", "--partition", slurm.partition,
                           "--job-name", name, "--sbatch-out", str(sbatch), *flags, "--", *script],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr
    log = tmp_path / f"{name}.out"
    done = subprocess.run(["sbatch", "--parsable", f"--output={log}", str(sbatch)], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=30)
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip().split(";")[0]
    state = slurm.wait_job(job_id, timeout_seconds=JOB_TIMEOUT_SECONDS)
    assert not slurm.in_queue(job_id)
    return state, log.read_text(errors="replace")


@pytest.mark.distributed
def test_generated_run_trains_as_a_slurm_job(slurm, run_dir, tmp_path):
    state, out = submit(slurm, run_dir, tmp_path, "examples/train.py", "--steps", "5", name="tiny")
    assert (state["JobState"], state["ExitCode"]) == ("COMPLETED", "0:0"), out[-3000:]
    losses = re.findall(r"^\[rank 0\] step (\d) loss (\d+\.\d+)$", out, re.M)
    assert [s for s, _ in losses] == ["1", "2", "3", "4", "5"], out[-3000:]
    assert all(0 < float(loss) < 10 for _, loss in losses)
    # both ranks reported a clean exit to the node's judge
    assert f"dstk: rank(s) 0, 1 on {socket.gethostname()} finished\n" in out, out[-3000:]


@pytest.mark.distributed
def test_the_ranks_of_a_node_get_all_its_cpus(slurm, run_dir, tmp_path):
    """The cluster pins tasks with task/affinity; one task per node must still leave every rank all the
    node's CPUs (Slurm's default of 1 CPU per task pinned both ranks to CPU 0)."""
    script = tmp_path / "affinity.py"
    script.write_text("import os\nprint(f\"cpus={len(os.sched_getaffinity(0))}\", flush=True)\n")
    state, out = submit(slurm, run_dir, tmp_path, str(script), name="affinity")
    assert state["JobState"] == "COMPLETED", out[-3000:]
    assert sorted(re.findall(r"^\[rank (\d)\] cpus=(\d+)$", out, re.M)) == [
        ("0", str(slurm.cpus)), ("1", str(slurm.cpus))], out[-3000:]


@pytest.mark.distributed
@pytest.mark.parametrize("mode, launcher, exit_code, says", [
    ("exit", "local", "7:0", "rank 1 on {node} exited with code 7"),
    ("sigkill", "local", "137:0", "rank 1 on {node} was killed by SIGKILL (signal 9)"),
    ("sigkill", "torchrun", "137:0", "rank 1 on {node} was killed by SIGKILL (signal 9)"),
])
def test_failed_rank_fails_the_job_and_is_named(slurm, run_dir, tmp_path, mode, launcher, exit_code, says):
    state, out = submit(slurm, run_dir, tmp_path, str(CRASH.relative_to(REPO)), mode, name=f"crash-{mode}",
                        flags=("--launcher", launcher))
    assert (state["JobState"], state["ExitCode"]) == ("FAILED", exit_code), out[-3000:]
    assert f"dstk: {says.format(node=socket.gethostname())}\n" in out, out[-3000:]
    if mode == "sigkill":
        assert "dstk: cause: a rank was killed by SIGKILL" in out, out[-3000:]


@pytest.mark.distributed
def test_a_cancelled_job_stops_every_rank(slurm, run_dir, tmp_path):
    script = tmp_path / "sleeper.py"
    script.write_text("import time\nprint('sleeping', flush=True)\ntime.sleep(300)\n")
    sbatch, log = tmp_path / "sleep.sbatch", tmp_path / "sleep.out"
    env = {**os.environ, **slurm.env}
    subprocess.run([sys.executable, "-m", "dstk", "launch", str(run_dir), "--slurm", "--sbatch-out", str(sbatch), "--",
                    str(script)], check=True, capture_output=True, env=env, cwd=REPO, timeout=60)
    job_id = subprocess.run(["sbatch", "--parsable", f"--output={log}", str(sbatch)], check=True, capture_output=True,
                            text=True, env=env, cwd=tmp_path, timeout=30).stdout.strip().split(";")[0]
    deadline = time.monotonic() + JOB_TIMEOUT_SECONDS
    while not (log.is_file() and log.read_text().count("] sleeping") == 2):
        assert time.monotonic() < deadline and slurm.in_queue(job_id), log.read_text() if log.is_file() else job_id
        time.sleep(0.5)
    assert slurm.command("scancel", job_id).returncode == 0
    state = slurm.wait_job(job_id, timeout_seconds=60)
    assert state["JobState"] == "CANCELLED", log.read_text()
    assert "dstk: stopped by a signal (scancel, a time limit, or another node failed)\n" in log.read_text()
    # no rank, runner or judge of the job is left (proc cmdlines name the script)
    left = [p for p in Path("/proc").glob("[0-9]*") if str(script).encode() in _cmdline(p)]
    assert not left, [_cmdline(p) for p in left]


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""


def _node(tmp_path: Path, reports: list[dict], runner_exit: int) -> subprocess.CompletedProcess:
    """``python -m dstk.launch.slurm`` over a stand-in runner that prints rank reports and exits."""
    lines = "".join(f"print({REPORT_TAG + json.dumps(r)!r})\n" for r in reports)
    fake = tmp_path / "runner.py"
    fake.write_text(f"import sys\nprint('[rank 0] training')\n{lines}sys.exit({runner_exit})\n")
    return subprocess.run([sys.executable, "-m", "dstk.launch.slurm", "--ranks", "2", "--", sys.executable, str(fake)],
                          capture_output=True, text=True, timeout=60)


def test_node_judge_fails_a_node_whose_rank_was_killed_though_the_runner_exited_0(tmp_path):
    done = _node(tmp_path, [{"rank": 1, "returncode": -9, "host": "n1"},
                            {"rank": 0, "returncode": -15, "host": "n1", "stopped": True}], runner_exit=0)
    assert done.returncode == 137, done.stderr
    assert "[rank 0] training\n" in done.stdout and REPORT_TAG not in done.stdout
    assert done.stderr.splitlines()[:2] == [
        "dstk: rank 1 on n1 was killed by SIGKILL (signal 9)",
        "dstk: rank 0 on n1 was killed by SIGTERM (signal 15), sent by the launcher after another rank failed"]
    assert "dstk: cause: a rank was killed by SIGKILL" in done.stderr


def test_a_node_with_a_stale_op_build_lock_fails_its_task_and_names_itself(tmp_path):
    """Each Slurm task runs its node's launcher under the judge, on that node: a stale lock in the node's own
    cache (the task's TORCH_EXTENSIONS_DIR) would hang its ranks; the task fails first, naming the node."""
    lock = tmp_path / "ext" / "fused_adam" / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    marker = tmp_path / "ran"
    done = subprocess.run([sys.executable, "-m", "dstk.launch.slurm", "--ranks", "1", "--", sys.executable, "-c",
                           f"open({str(marker)!r}, 'w')"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")})
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith(f"dstk: on {socket.gethostname()}: error: stale op-build lock(s) in the torch "
                                  f"extensions cache, left by a build that was killed: {lock}"), done.stderr
    assert not marker.exists()


def test_node_judge_counts_this_nodes_ranks(tmp_path):
    done = _node(tmp_path, [{"rank": 2, "returncode": 0, "host": "n1"}], runner_exit=0)
    assert done.returncode == 1
    assert "dstk: 1 rank(s) of this node did not report how they ended" in done.stderr
    done = _node(tmp_path, [{"rank": 3, "returncode": 0, "host": "n1"}, {"rank": 2, "returncode": 0, "host": "n1"}],
                 runner_exit=0)
    assert done.returncode == 0, done.stderr
    assert f"dstk: rank(s) 2, 3 on {socket.gethostname()} finished" in done.stdout


# --- `dstk launch --launcher slurm`: the runner's srun backend ------------------------------------

SRUN_RANK = """\
import os, sys, time
rank = os.environ["SLURM_PROCID"]
print(f"ready {rank}", flush=True)
if rank == "1":
    time.sleep(1)
    print("rank 1 gives up", file=sys.stderr, flush=True)
    sys.exit(3)
time.sleep(float(os.environ["DSTK_TEST_WAIT_SECONDS"]))
print("rank 0 waited it out", flush=True)
"""
WAIT_SECONDS = 60
"""How long rank 0 waits after rank 1 failed (as a rank blind to a dead peer waits for its collective's timeout)."""
STEP_STOP_SECONDS = 45
"""The step must end this soon after rank 1 failed with --kill-on-bad-exit (seconds here; generous for load)."""


@pytest.mark.distributed
@pytest.mark.parametrize("launcher_args, prefix", [("", True), ("", False), ("--kill-on-bad-exit=0", True)],
                         ids=["dstk-default", "no-prefix", "user-said-0"])
def test_runner_srun_ends_the_step_when_a_rank_fails(slurm, run_dir, tmp_path, launcher_args, prefix):
    """`dstk launch --launcher slurm` (runner -> ``srun -n 2 PYTHON -u -m dstk.launch.rank SCRIPT``): rank 1 exits
    3, rank 0 would wait ``WAIT_SECONDS``; srun's --kill-on-bad-exit=1 (added by dstk) ends the step within
    seconds and dstk names rank 1. A user's own ``--kill-on-bad-exit=0`` is kept: then rank 0 waits it out
    (what every launch did before dstk added the flag)."""
    from dstk.launch.command import LaunchSpec
    from dstk.launch.hosts import Host

    script = tmp_path / "srun_rank.py"
    script.write_text(SRUN_RANK)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(f"{slurm.node} slots=2\n")
    spec = LaunchSpec(script=str(script), num_nodes=1, gpus_per_node=2, hosts=(Host(name=slurm.node, num_slots=2),),
                      hostfile=str(hostfile), launcher="slurm", master_addr="127.0.0.1", run_dir=str(run_dir),
                      prefix_output=prefix, cpu=True, launcher_args=launcher_args)
    # run_launch in a child, as `dstk launch` runs it (no CLI flag takes launcher args yet)
    code = ("import sys; from dstk.launch.command import LaunchSpec; from dstk.launch.hosts import Host\n"
            "from dstk.launch.run import run_launch\n"
            f"sys.exit(run_launch({spec!r}))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT",
                                                             "MASTER_ADDR", "SLURM_KILL_ON_BAD_EXIT")}
    env.update(slurm.env, DSTK_TEST_WAIT_SECONDS=str(WAIT_SECONDS))
    started = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path,
                              timeout=JOB_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"timed out:\n{exc.stdout}\n{exc.stderr}") from None
    took = time.monotonic() - started
    out = done.stdout + done.stderr
    print(f"{launcher_args or 'dstk default'}, prefix={prefix}: the launch ended after {took:.1f} s, exit {done.returncode}")
    assert re.search(r"cmd = srun -n 2 " + re.escape(launcher_args or "--kill-on-bad-exit=1") + " ", out), out[-3000:]
    assert "ready 0" in out and "ready 1" in out and "rank 1 gives up" in out, out[-3000:]
    assert done.returncode != 0, out[-3000:]
    if prefix:
        assert f"dstk: rank 1 on {socket.gethostname()} exited with code 3\n" in out, out[-3000:]
        assert done.returncode == 3, out[-3000:]
    elif not launcher_args:  # srun's own lines name the rank (srun_task_exits): its exit code, not srun's 143
        assert f"dstk: rank 1 on {slurm.node} exited with code 3\n" in out, out[-3000:]
        assert done.returncode == 3, out[-3000:]
    if launcher_args:
        assert took >= WAIT_SECONDS and "rank 0 waited it out" in out, out[-3000:]
    else:
        assert took < STEP_STOP_SECONDS and "rank 0 waited it out" not in out, out[-3000:]


def _slurm_spec(**kw):
    from dstk.launch.command import LaunchSpec
    from dstk.launch.hosts import Host

    hosts = (Host(name="n0", num_slots=2), Host(name="n1", num_slots=2))
    return LaunchSpec(**{"script": "train.py", **kw}, num_nodes=2, gpus_per_node=2, hosts=hosts, hostfile="/tmp/h")


@pytest.mark.parametrize("user_args, environ_kill, want", [
    ("", None, "--kill-on-bad-exit=1"),
    ("--exclusive -p 'debug q'", None, "--exclusive -p 'debug q' --kill-on-bad-exit=1"),
    # the user's own choice is kept, in any spelling srun takes
    ("--kill-on-bad-exit=0", None, "--kill-on-bad-exit=0"),
    ("--kill-on-bad-exit", None, "--kill-on-bad-exit"),
    ("-K0 --exclusive", None, "-K0 --exclusive"),
    ("-K", "0", "-K"),
    # $SLURM_KILL_ON_BAD_EXIT, which the flag would override, becomes the flag
    ("", "0", "--kill-on-bad-exit=0"),
    ("--exclusive", "1", "--exclusive --kill-on-bad-exit=1"),
])
def test_srun_gets_kill_on_bad_exit_unless_the_user_chose(user_args, environ_kill, want):
    from dstk.launch.command import slurm_launcher_args

    assert slurm_launcher_args(user_args, environ_kill=environ_kill) == want


def test_slurm_launcher_command_passes_launcher_args_and_runs_the_rank_wrapper_as_a_module():
    from dstk.launch.command import plan_launch

    cmd = plan_launch(_slurm_spec(launcher="slurm", ds_config="/r/ds.json")).command
    # one word: argparse would take a separate "--kill-on-bad-exit=1" for a flag of its own (seen: exit 2)
    assert "--launcher_args=--kill-on-bad-exit=1" in cmd and "--no_ssh_check" in cmd
    assert cmd[cmd.index("--"):] == ["--", "-m", "dstk.launch.rank", "train.py", "--deepspeed_config", "/r/ds.json"]
    cmd = plan_launch(_slurm_spec(launcher="slurm", launcher_args="-K0", module=True, prefix_output=False,
                                  script="my.train")).command
    # --no-prefix: the wrapper only sets the ranks' torch.distributed variables and execs the module
    assert "--launcher_args=-K0" in cmd and cmd[cmd.index("--"):] == ["--", "-m", "dstk.launch.rank", "--exec",
                                                                      "-m", "my.train"]
    cmd = plan_launch(_slurm_spec(launcher="slurm", prefix_output=False)).command
    assert cmd[cmd.index("--"):] == ["--", "-m", "dstk.launch.rank", "--exec", "train.py"]
    # pdsh: the user's launcher args only, nothing added
    cmd = plan_launch(_slurm_spec(launcher="pdsh", launcher_args="-f 64")).command
    assert "--launcher_args=-f 64" in cmd and "--no_ssh_check" not in cmd and "--" not in cmd
    assert not any(a.startswith("--launcher_args") for a in plan_launch(_slurm_spec(launcher="pdsh")).command)


def test_launcher_args_without_a_multi_node_launcher_are_refused():
    from dstk.errors import DstkError
    from dstk.launch.command import LaunchSpec, plan_launch, slurm_launcher_args

    with pytest.raises(DstkError, match="need a multi-node launcher"):
        plan_launch(LaunchSpec(script="train.py", launcher_args="--exclusive"))
    with pytest.raises(DstkError, match="srun takes 0 or 1"):
        slurm_launcher_args("", environ_kill="yes")
    with pytest.raises(DstkError, match="No closing quotation"):
        slurm_launcher_args("-p 'debug", environ_kill=None)


# --- `dstk launch --launcher slurm`: the ranks find each other and train -------------------------

DIST_RANK = """\
import argparse, os
import deepspeed, torch
import torch.distributed as dist
from dstk.launch.rank import exit_rank

parser = argparse.ArgumentParser()
parser.add_argument("--deepspeed_config", required=True)
args = parser.parse_args()
deepspeed.init_distributed("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
assert (rank, world) == (int(os.environ["SLURM_PROCID"]), 2), (rank, world)
total = torch.tensor([rank + 1.0])
dist.all_reduce(total)
print(f"ALLREDUCE rank={rank} world={world} sum={total.item():g} local={os.environ['LOCAL_RANK']} "
      f"local_size={os.environ.get('LOCAL_SIZE')} port={os.environ['MASTER_PORT']}", flush=True)
# a real DeepSpeed engine step of a tiny model, with the run directory's ds_config.json (bf16, AdamW, warm-up)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=args.deepspeed_config)
dtype = next(engine.module.parameters()).dtype
torch.manual_seed(1 + rank)
x = torch.randn(engine.train_micro_batch_size_per_gpu(), 8).to(dtype)
y = torch.randn(engine.train_micro_batch_size_per_gpu(), 1).to(dtype)
before = [p.detach().clone() for p in engine.module.parameters()]
for _ in range(3):  # the warm-up starts at lr 0
    loss = torch.nn.functional.mse_loss(engine(x), y)
    engine.backward(loss)
    engine.step()
changed = any(not torch.equal(a, b) for a, b in zip(before, engine.module.parameters()))
flat = torch.cat([p.detach().flatten() for p in engine.module.parameters()])
gathered = [torch.empty_like(flat) for _ in range(world)]
dist.all_gather(gathered, flat)
same = all(torch.equal(gathered[0], g) for g in gathered)
print(f"STEP rank={rank} loss={loss.item():.4f} changed={changed} same={same}", flush=True)
exit_rank()
"""
LEAKED_RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE",
                    "MASTER_ADDR", "MASTER_PORT", "DSTK_MASTER_ADDR", "DSTK_MASTER_PORT")
"""What an in-process DeepSpeed test of this session may have left in os.environ: not for a launcher."""


def _launcher_env(slurm) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LEAKED_RANK_VARS and not k.startswith("SLURM_")}
    return {**env, **slurm.env, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


@pytest.mark.distributed
@pytest.mark.parametrize("prefix", [True, False], ids=["prefix", "no-prefix"])
def test_runner_srun_ranks_init_distributed_and_train(slurm, run_dir, tmp_path, free_port, prefix):
    """`dstk launch --launcher slurm` (runner -> srun -n 2 -> dstk.launch.rank): srun gives the ranks only
    SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID; without RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT
    deepspeed.init_distributed tried MPI discovery and every rank died (``No module named 'mpi4py'``).
    Now the wrapper sets them (``--exec`` under --no-prefix): the gloo all-reduce sums both ranks and a
    DeepSpeed engine trains. With the prefix, `dstk launch` runs with a stale RANK/LOCAL_RANK/WORLD_SIZE (as
    left by an in-process DeepSpeed run): dstk drops them from the runner's environment
    (run.RANK_IDENTITY_VARS), or srun's --export=ALL would hand them to every rank; and a stale
    MASTER_ADDR/MASTER_PORT, which the ranks' own rendezvous must not take over dstk's."""
    env = _launcher_env(slurm)
    if prefix:
        env.update(RANK="7", LOCAL_RANK="5", WORLD_SIZE="9", MASTER_ADDR="10.255.255.1", MASTER_PORT="1")
    script = tmp_path / "dist_rank.py"
    script.write_text(DIST_RANK)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(f"{slurm.node} slots=2\n")
    started = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "dstk", "launch", str(run_dir), "--hostfile", str(hostfile),
                               "--launcher", "slurm", "--master-addr", "127.0.0.1", "--master-port", str(free_port),
                               *([] if prefix else ["--no-prefix"]), "--", str(script)],
                              capture_output=True, text=True, env=env, cwd=tmp_path, timeout=JOB_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"timed out:\n{exc.stdout}\n{exc.stderr}") from None
    print(f"dstk launch --launcher slurm{'' if prefix else ' --no-prefix'}: 2 ranks, init + all-reduce + 3 engine "
          f"steps in {time.monotonic() - started:.1f} s, exit {done.returncode}")
    out = done.stdout + done.stderr
    (tmp_path / "launch.out").write_text(out)  # kept under --basetemp, to read a slow run's timeline
    assert "mpi4py" not in out, out[-3000:]
    assert done.returncode == 0, out[-3000:]
    assert re.search(r"cmd = srun -n 2 ", out), out[-3000:]
    tag = r"\[rank (\d)\] " if prefix else "()"
    reduced = sorted(re.findall(f"^{tag}ALLREDUCE rank=(\\d) world=2 sum=3 local=(\\d) local_size=2 port=(\\d+)$",
                                out, re.M))
    who = ("0", "1") if prefix else ("", "")
    assert reduced == [(who[0], "0", "0", str(free_port)), (who[1], "1", "1", str(free_port))], out[-3000:]
    steps = sorted(re.findall(f"^{tag}STEP rank=(\\d) loss=\\S+ changed=True same=True$", out, re.M))
    assert steps == [(who[0], "0"), (who[1], "1")], out[-3000:]
    assert "dstk: rank" not in done.stderr, done.stderr[-3000:]  # no rank failed or went missing


@pytest.mark.distributed
def test_runner_srun_ranks_refuse_to_start_on_a_stale_lock_in_their_cache(slurm, run_dir, tmp_path, free_port):
    """Under `--launcher slurm` the runner's srun starts every rank directly: no dstk process runs on a node
    before them to look at its cache. The ranks' wrapper does: with a stale op-build lock in the cache the
    ranks use (here ``--env TORCH_EXTENSIONS_DIR``, which dstk's own check on this machine does not read),
    each rank says so instead of starting its script, which DeepSpeed would have hung, and the launch fails
    naming the rank."""
    cache = tmp_path / "ranks_ext"
    lock = cache / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    script = tmp_path / "dist_rank.py"
    script.write_text(DIST_RANK)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(f"{slurm.node} slots=2\n")
    done = subprocess.run([sys.executable, "-m", "dstk", "launch", str(run_dir), "--hostfile", str(hostfile),
                           "--launcher", "slurm", "--master-addr", "127.0.0.1", "--master-port", str(free_port),
                           "--env", f"TORCH_EXTENSIONS_DIR={cache}", "--", str(script)],
                          capture_output=True, text=True, env=_launcher_env(slurm), cwd=tmp_path,
                          timeout=JOB_TIMEOUT_SECONDS)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]
    for rank in (0, 1):
        assert (f"[rank {rank}] dstk: stale op-build lock(s) in the torch extensions cache of {socket.gethostname()}, "
                f"left by a build that was killed: {lock}") in out, out[-3000:]
    assert "ALLREDUCE" not in out and re.search(r"^dstk: rank [01] on \S+ exited with code 1", out, re.M), out[-3000:]


def test_a_rank_wrapper_does_not_start_its_script_on_a_stale_lock(tmp_path):
    """The wrapper itself, both ways the runner starts it (``--exec`` under --no-prefix): exit 1 with the lock
    and the rm that clears it, the report (rank 1, code 1) with the prefix, and the script never run."""
    lock = tmp_path / "ext" / "cpu_adam" / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    marker = tmp_path / "ran"
    script = tmp_path / "script.py"
    script.write_text(f"open({str(marker)!r}, 'w')\n")
    env = {**os.environ, "RANK": "1", "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}
    for flags in ([], ["--exec"]):
        done = subprocess.run([sys.executable, "-m", "dstk.launch.rank", *flags, str(script)], capture_output=True,
                              text=True, env=env, timeout=60)
        assert done.returncode == 1 and f"so remove them on that node: rm {lock}" in done.stderr, done.stderr
        assert ('DSTK_RANK_EXIT {"rank": 1, "returncode": 1' in done.stdout) == (not flags), done.stdout
        assert not marker.exists()
    lock.unlink()  # gone: the script runs
    assert subprocess.run([sys.executable, "-m", "dstk.launch.rank", str(script)], env=env, timeout=60,
                          capture_output=True).returncode == 0 and marker.exists()


def test_srun_rank_env_maps_slurms_task_variables():
    from dstk.launch.rank import srun_rank_env

    task = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "4", "SLURM_LOCALID": "1",
            "SLURM_NODEID": "1", "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
            "DSTK_MASTER_ADDR": "n0", "DSTK_MASTER_PORT": "29511"}
    assert srun_rank_env(environ=task) == {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_SIZE": "2",
                                   "CROSS_RANK": "1", "CROSS_SIZE": "2", "MASTER_ADDR": "n0", "MASTER_PORT": "29511"}
    # the step's task count, not the job's (srun -n 2 inside a 4-task allocation)
    assert srun_rank_env(environ={**task, "SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "1"})["WORLD_SIZE"] == "2"
    assert srun_rank_env(environ={**task, "SLURM_STEP_TASKS_PER_NODE": "3,1", "SLURM_NODEID": "1"})["LOCAL_SIZE"] == "1"
    # what the user (or srun --export) set is kept, except a MASTER_* that dstk launch chose: srun's
    # --export=ALL hands every rank the launching shell's MASTER_PORT, most likely a stale one
    mine = srun_rank_env(environ={**task, "MASTER_PORT": "1234", "LOCAL_RANK": "0"})
    assert "LOCAL_RANK" not in mine and (mine["MASTER_ADDR"], mine["MASTER_PORT"]) == ("n0", "29511")
    no_choice = {k: v for k, v in task.items() if not k.startswith("DSTK_MASTER")}
    assert "MASTER_PORT" not in srun_rank_env(environ={**no_choice, "MASTER_PORT": "1234"})
    # launch.py (local/pdsh inside an allocation), torchrun: RANK is set, the wrapper changes nothing
    assert srun_rank_env(environ={**task, "RANK": "0"}) == {}
    assert srun_rank_env(environ={"RANK": "0", "WORLD_SIZE": "2"}) == {}
    assert srun_rank_env(environ={}) == {}
    # no dstk master (srun run by hand): the rest is still given; nothing is made up
    bare = srun_rank_env(environ={"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "garbage"})
    assert bare == {"RANK": "0", "WORLD_SIZE": "2"}


def test_slurm_launcher_passes_the_master_to_the_ranks_in_the_runners_environment():
    from dstk.launch.command import plan_launch

    plan = plan_launch(_slurm_spec(launcher="slurm", master_addr="10.0.0.1", master_port=29511))
    assert (plan.env["DSTK_MASTER_ADDR"], plan.env["DSTK_MASTER_PORT"]) == ("10.0.0.1", "29511")
    assert plan_launch(_slurm_spec(launcher="slurm")).env["DSTK_MASTER_ADDR"] == "n0"  # the first host
    # the other backends pass --master_addr/--master_port to launch.py, which sets the ranks' variables
    assert not any(k.startswith("DSTK_MASTER") for k in plan_launch(_slurm_spec(launcher="pdsh")).env)


def test_srun_task_exits_name_the_first_failure_and_the_tasks_srun_stopped():
    # srun 22.05's lines, as seen when rank 1 exited 3 under --kill-on-bad-exit=1 (--no-prefix)
    from dstk.launch.run import RankExit, judge
    from dstk.launch.slurm import srun_task_exits

    lines = ["ready 1\n", "rank 1 gives up\n",
             "srun: error: vm: task 1: Exited with exit code 3\n",
             "srun: launch/slurm: _step_signal: Terminating StepId=1.0\n",
             "slurmstepd-vm: error: *** STEP 1.0 ON vm CANCELLED AT 2026-12-03T17:23:19 ***\n",
             "srun: error: vm: task 0: Terminated\n", "srun: Force Terminated StepId=1.0\n"]
    exits = srun_task_exits(lines)
    assert exits == [RankExit(rank=1, returncode=3, host="vm"), RankExit(rank=0, returncode=-15, host="vm", stopped=True)]
    result = judge(runner_returncode=143, ranks=exits, world_size=2, expect_reports=True)
    assert result.returncode == 3 and result.messages[0] == "rank 1 on vm exited with code 3"
    # task lists, signals with a core dump, and lines that only look like srun's
    assert srun_task_exits(["srun: error: n1: tasks 0,2-3: Killed\n"]) == [
        RankExit(rank=r, returncode=-9, host="n1") for r in (0, 2, 3)]
    assert srun_task_exits(["srun: error: n1: task 4: Segmentation fault (core dumped)\n"]) == [
        RankExit(rank=4, returncode=-11, host="n1")]
    assert srun_task_exits(["[rank 1] srun: error: vm: task 1: Exited with exit code 3\n",
                            "srun: error: vm: task x: Exited with exit code 3\n",
                            "srun: error: vm: task 1: Something else\n"]) == []
