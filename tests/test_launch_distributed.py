"""Real launches through the deepspeed runner on this machine's CPUs (gloo).

- two "nodes" on one machine: `dstk launch --node-rank 0/1` (runner --no_ssh), one CPU rank each,
  master 127.0.0.1, a real DeepSpeed training step;
- a rank that exits non-zero and one killed by SIGKILL: `dstk launch` exits non-zero and names it;
- `dstk doctor` on 2 CPU ranks prints a bus-bandwidth figure; an unreachable host fails the check.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_launch import write_run_dir

pytestmark = pytest.mark.distributed
SCRIPTS = Path(__file__).parent / "data" / "launch" / "scripts"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def dstk(*args: str, timeout: float = 180, cwd: Path | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "dstk", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=ENV, cwd=cwd)


def finish(proc: subprocess.Popen, timeout: float = 180) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"timed out:\n{out[-3000:]}\n{err[-3000:]}")
    return proc.returncode, out, err


def test_two_nodes_on_one_machine_train_a_step(tmp_path, free_port):
    run_dir = write_run_dir(tmp_path / "run", num_nodes=2, gpus_per_node=1)
    (run_dir / "ds_config.json").write_text(json.dumps({
        "train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}}}))
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node0 slots=1\nnode1 slots=1\n")
    common = [str(run_dir), "--hostfile", str(hostfile), "--master-addr", "127.0.0.1",
              "--master-port", str(free_port)]
    nodes = [dstk("launch", *common, "--node-rank", str(r), "--", str(SCRIPTS / "train_step.py")) for r in (0, 1)]
    results = [finish(p) for p in nodes]
    for node, (rc, out, err) in enumerate(results):
        assert rc == 0, f"node {node}:\n{out[-3000:]}\n{err[-3000:]}"
        steps = re.findall(r"^\[rank (\d)\] STEP rank=(\d) world=2 node=(\d) backend=gloo loss=(\S+) changed=True same=True$",
                           out, re.M)
        assert len(steps) == 1, out[-3000:]
        prefix, rank, cross, _ = steps[0]
        assert prefix == rank == cross == str(node)
    losses = [re.search(r"loss=(\S+)", out).group(1) for _, out, _ in results]
    assert losses[0] != losses[1]  # each node trained on its own data


def test_generated_run_dir_launches_and_trains(tmp_path):
    """`dstk generate` -> `dstk launch`: the run directory of the tiny CPU example trains on 2 ranks."""
    from dstk.cli import main

    intent = Path(__file__).parent.parent / "examples" / "intents" / "tiny-llama-cpu.yaml"
    run_dir = tmp_path / "run"
    assert main(["generate", str(intent), "--output", str(run_dir)]) == 0
    plan = json.loads((run_dir / "plan.json").read_text())
    world = plan["cluster"]["num_nodes"] * plan["cluster"]["gpus_per_node"]
    rc, out, err = finish(dstk("launch", str(run_dir), "--nccl-profile", "single-node", "--",
                               str(SCRIPTS / "train_step.py"), "--steps", "3"))
    assert rc == 0, f"{out[-3000:]}\n{err[-3000:]}"
    steps = re.findall(rf"^\[rank (\d)\] STEP rank=\1 world={world} .* changed=True same=True$", out, re.M)
    assert sorted(steps) == [str(r) for r in range(world)], out[-3000:]
    # the example script the README points at trains the plan's model from the same run directory
    example = Path(__file__).parent.parent / "examples" / "train.py"
    rc, out, err = finish(dstk("launch", str(run_dir), "--", str(example), "--steps", "12"))
    assert rc == 0, f"{out[-3000:]}\n{err[-3000:]}"
    losses = [float(x) for x in re.findall(r"^\[rank 0\] step \d+ loss (\S+)$", out, re.M)]
    assert len(losses) == 12 and losses[-1] < losses[0], losses


def test_a_missing_script_is_refused_before_anything_starts(tmp_path, capsys):
    from dstk.cli import main

    run_dir = write_run_dir(tmp_path / "run", num_nodes=1, gpus_per_node=2)
    assert main(["launch", str(run_dir), "--", str(tmp_path / "nope.py")]) == 2
    err = capsys.readouterr().err
    assert "no such training script" in err and "examples/train.py" in err


@pytest.mark.parametrize("mode,code,says", [
    ("exit", 7, "rank 1 on .* exited with code 7"),
    ("sigkill", 128 + 9, r"rank 1 on .* was killed by SIGKILL \(signal 9\)"),
])
def test_failed_rank_fails_the_launch_and_is_named(tmp_path, mode, code, says):
    run_dir = write_run_dir(tmp_path / "run", num_nodes=1, gpus_per_node=2)
    rc, out, err = finish(dstk("launch", str(run_dir), "--", str(SCRIPTS / "crash.py"), mode), timeout=120)
    assert rc == code, f"{out[-2000:]}\n{err[-2000:]}"
    assert re.search(r"^dstk: " + says, err, re.M), err[-2000:]
    assert re.search(r"^dstk: rank 0 on .* was killed by SIGTERM .*sent by the launcher", err, re.M), err[-2000:]
    assert "[rank 0] started rank=0" in out and "[rank 1] started rank=1" in out
    if mode == "exit":
        assert "[rank 1] rank 1 gives up" in err
        assert "dstk: cause:" not in err  # a plain exit code names no cause it cannot know
    else:
        assert re.search(r"^dstk: cause: a rank was killed by SIGKILL: most often the kernel's OOM killer", err,
                         re.M), err[-2000:]
        assert "dmesg" in err


def test_a_rank_out_of_host_memory_is_named_with_the_fix(tmp_path):
    run_dir = write_run_dir(tmp_path / "run", num_nodes=1, gpus_per_node=2)
    rc, out, err = finish(dstk("launch", str(run_dir), "--", str(SCRIPTS / "crash.py"), "oom"), timeout=180)
    assert rc == 1, f"{out[-2000:]}\n{err[-2000:]}"
    assert re.search(r"^dstk: cause: a rank ran out of host \(CPU\) memory", err, re.M), err[-3000:]
    assert re.search(r"^dstk:   seen: \[rank 1\] .*DefaultCPUAllocator", err, re.M), err[-3000:]
    assert re.search(r"^dstk:   fix: free host memory", err, re.M)


def test_a_taken_rendezvous_port_is_named_with_the_fix(tmp_path, free_port):
    import socket

    run_dir = write_run_dir(tmp_path / "run", num_nodes=1, gpus_per_node=2)
    with socket.socket() as holder:  # another job's server on the port
        holder.bind(("127.0.0.1", free_port))
        holder.listen()
        rc, out, err = finish(dstk("launch", str(run_dir), "--master-port", str(free_port), "--",
                                   str(SCRIPTS / "crash.py"), "rendezvous"), timeout=240)
    assert rc != 0, f"{out[-2000:]}\n{err[-2000:]}"
    assert re.search(r"^dstk: cause: the rendezvous port is taken", err, re.M), err[-3000:]
    assert "--master-port" in err


def test_hostile_env_value_reaches_the_rank_verbatim(tmp_path):
    """A local launch passes --env straight into the environment: nothing is run, nothing mangled."""
    run_dir = write_run_dir(tmp_path / "run", num_nodes=1, gpus_per_node=2)
    marker = tmp_path / "pwned"
    value = f"a b; $(touch {marker}) `touch {marker}` 'q\" \\"
    rc, out, err = finish(dstk("launch", str(run_dir), "--env", f"DSTK_TEST_VALUE={value}", "--",
                               str(SCRIPTS / "crash.py"), "ok"), timeout=120)
    assert rc == 0, err[-2000:]
    assert out.count(f"env={value!r}") == 2
    assert not marker.exists()


def test_doctor_on_two_cpu_ranks_prints_bandwidth():
    rc, out, err = finish(dstk("doctor", "--num-ranks", "2", "--sizes", "1M,4M", "--iters", "3"), timeout=180)
    assert rc == 0, f"{out}\n{err[-3000:]}"
    m = re.search(r"^OK   allreduce: gloo, 2 ranks, 4 MiB: [\d.]+ ms, algbw ([\d.]+) GB/s, busbw ([\d.]+) GB/s", out, re.M)
    assert m, out
    algbw, busbw = float(m.group(1)), float(m.group(2))
    assert busbw > 0 and abs(busbw - algbw) <= 0.002  # n=2: busbw = algbw * 2(n-1)/n = algbw
    assert re.search(r"^\s+4194304\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+True$", out, re.M), out


def test_doctor_reports_an_unreachable_host(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("nohost.invalid slots=1\n")
    rc, out, err = finish(dstk("doctor", "--hostfile", str(hostfile), "--format", "json"), timeout=120)
    assert rc == 1
    checks = {c["name"]: c for c in json.loads(out)["checks"]}
    assert checks["ssh@nohost.invalid"]["status"] == "fail"
    assert "passwordless ssh" in checks["ssh@nohost.invalid"]["hint"]
    assert checks["allreduce"]["status"] == "skip"
