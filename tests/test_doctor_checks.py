"""`dstk doctor`'s static checks (issue 15): /dev/shm size and free space against what the plan's ranks
put there, memlock, DeepSpeed's op build status (as ds_report reports it, without building), and,
with a hostfile, the same versions on every host (over real ssh to this machine, tests/services.py).
Each finding says the fix. Oracles: df, the shell's ``ulimit -l``, ``ds_report``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dstk.launch import doctor, shm
from tests.services import ssh_with_env, sshd_fixture

MIB, GIB = 2**20, 2**30
VENV_BIN = Path(sys.executable).parent


def _space(total: int, free: int) -> shm.ShmSpace:
    return shm.ShmSpace(path="/dev/shm", total_bytes=total, free_bytes=free)


def _leak(n: int) -> list[shm.ShmBuffer]:
    return [shm.ShmBuffer(path=f"/dev/shm/{shm.PREFIX}_{os.getuid()}_127.0.0.1_29500_{r}", uid=os.getuid(),
                          master_addr="127.0.0.1", master_port=29500, rank=r, size_bytes=shm.BUFFER_BYTES,
                          in_use=False) for r in range(n)]


def test_shm_need_follows_the_plan():
    assert doctor.shm_need_bytes(ranks_per_node=2, num_nodes=1, cpu=True)[0] == 2 * 69_206_024
    assert doctor.shm_need_bytes(ranks_per_node=2, num_nodes=2, cpu=True)[0] == 0  # no shm all-reduce across nodes
    assert doctor.shm_need_bytes(ranks_per_node=8, num_nodes=4, cpu=False)[0] == GIB
    assert doctor.shm_need_bytes(ranks_per_node=1, num_nodes=4, cpu=False)[0] == 0


def test_dockers_64_mib_shm_fails_an_eight_gpu_node_with_the_fix():
    need, text = doctor.shm_need_bytes(ranks_per_node=8, num_nodes=1, cpu=False)
    check = doctor.judge_shm(space=_space(64 * MIB, 64 * MIB), need_bytes=need, need_text=text, leaked=[])
    assert check.status == "fail" and "docker's default is 64 MiB" in check.detail
    assert "--shm-size=1g" in check.hint and "--ipc=host" in check.hint


def test_shm_full_of_leaked_buffers_fails_and_names_doctor_fix():
    need, text = doctor.shm_need_bytes(ranks_per_node=2, num_nodes=1, cpu=True)
    leaked = _leak(4)
    check = doctor.judge_shm(space=_space(GIB, 100 * MIB), need_bytes=need, need_text=text, leaked=leaked)
    assert check.status == "fail" and "132 MiB" in check.detail
    assert "4 leaked DeepSpeed buffer(s) hold 264 MiB" in check.hint and "dstk doctor --fix" in check.hint
    ok = doctor.judge_shm(space=_space(GIB, GIB), need_bytes=need, need_text=text, leaked=[])
    assert ok.status == "ok"
    leaks = doctor.judge_shm_leaks(leaked, uid=os.getuid())
    assert leaks.status == "warn" and "264 MiB" in leaks.detail and "port(s) 29500" in leaks.detail
    assert leaks.hint.startswith("dstk doctor --fix removes them (or: rm -f /dev/shm/")


def test_shm_space_is_what_df_says():
    df = subprocess.run(["df", "-B1", "--output=size,avail", "/dev/shm"], capture_output=True, text=True)
    if df.returncode != 0:
        pytest.skip(f"df: {df.stderr}")
    size, avail = map(int, df.stdout.split()[-2:])
    space = shm.shm_space("/dev/shm")
    assert space.total_bytes == size
    assert abs(space.free_bytes - avail) <= 64 * MIB  # other work writes there meanwhile


def test_memlock_is_the_shells_ulimit_and_gpus_need_it_unlimited():
    out = subprocess.run(["sh", "-c", "ulimit -l"], capture_output=True, text=True).stdout.strip()
    check = doctor.check_memlock(cpu=False)
    if out == "unlimited":
        assert check.status == "ok" and check.data["memlock_bytes"] is None
    else:
        assert check.data["memlock_bytes"] == int(out) * 1024
        assert check.status == "warn" and "memlock unlimited" in check.hint and "--ulimit memlock=-1" in check.hint
    assert doctor.judge_memlock(soft_bytes=8 * MIB, cpu=True).status == "ok"
    assert doctor.judge_memlock(soft_bytes=None, cpu=False).status == "ok"
    assert doctor.judge_memlock(soft_bytes=64 * 1024, cpu=False).status == "warn"


def test_needed_ops_from_the_config():
    adamw = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
    assert doctor.needed_ops(adamw, cpu=False, num_nodes=1, ranks_per_node=8) == {
        "fused_adam": 'the AdamW optimizer (FusedAdam; "torch_adam": true avoids the build)'}
    torch_adam = {"optimizer": {"type": "AdamW", "params": {"torch_adam": True}}}
    assert set(doctor.needed_ops(torch_adam, cpu=True, num_nodes=1, ranks_per_node=2)) == {"deepspeed_shm_comm"}
    offload = {**adamw, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    assert set(doctor.needed_ops(offload, cpu=False, num_nodes=2, ranks_per_node=8)) == {"cpu_adam"}
    assert doctor.needed_ops(None, cpu=True, num_nodes=2, ranks_per_node=1) == {}


def _ds_report_ops() -> dict[str, tuple[bool, bool]]:
    out = subprocess.run([str(VENV_BIN / "ds_report")], capture_output=True, text=True, timeout=120).stdout
    plain = re.sub(r"\x1b\[\d+m", "", out)
    rows = re.findall(r"^(\w+) \.*\s*\[(YES|NO)\] \.+ \[(OKAY|NO)\]$", plain, re.M)
    return {name: (inst == "YES", comp == "OKAY") for name, inst, comp in rows}


def test_op_report_agrees_with_ds_report_and_sees_the_jit_cache(tmp_path, monkeypatch):
    cache = tmp_path / "torch_extensions"
    (cache / "py311_cpu" / "fused_adam").mkdir(parents=True)
    (cache / "py311_cpu" / "fused_adam" / "fused_adam.so").write_bytes(b"\x7fELF")
    (cache / "py311_cpu" / "cpu_adam").mkdir(parents=True)  # a build that never finished: no .so
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(cache))
    check = doctor.check_ops(needed={"fused_adam": "the AdamW optimizer", "cpu_adam": "optimizer offload"})
    report = check.data
    oracle = _ds_report_ops()
    assert oracle and set(oracle) == set(report["ops"]), (oracle, report["ops"])
    for name, (installed, compatible) in oracle.items():
        assert (report["ops"][name]["prebuilt"], report["ops"][name]["compatible"]) == (installed, compatible), name
    built = {n for n, o in report["ops"].items() if o["jit_built"]}
    assert built == {"fused_adam"}
    if not report["ops"]["cpu_adam"]["prebuilt"]:
        assert check.status == "warn"
        assert "cpu_adam (needed for optimizer offload) is built on the first start" in check.detail
        assert "fused_adam (needed" not in check.detail
        assert "DS_BUILD_CPU_ADAM=1 pip install deepspeed" in check.hint


def test_ops_without_ninja_or_compatibility_fail():
    report = {"ninja": False, "accelerator": "cuda", "cache": "/x",
              "ops": {"fused_adam": {"prebuilt": False, "jit_built": False, "compatible": True},
                      "cpu_adam": {"prebuilt": False, "jit_built": False, "compatible": False},
                      "pin_memory": {"prebuilt": True, "jit_built": False, "compatible": True}}}
    check = doctor.judge_ops(report, needed={"fused_adam": "Adam"})
    assert check.status == "fail" and "pip install ninja" in check.hint
    check = doctor.judge_ops(report, needed={"cpu_adam": "offload"})
    assert check.status == "fail" and "cannot be built here" in check.detail and "ds_report" in check.hint
    assert doctor.judge_ops(report, needed={"pin_memory": "x"}).status == "ok"


def test_versions_that_differ_fail_with_the_versions_to_install():
    here = {"python": "3.11.7", "torch": "2.13.0+cu126", "deepspeed": "0.19.8", "nccl": "2.27.3", "cuda": "12.6"}
    check = doctor.judge_versions({"this host": here, "n1": {**here, "deepspeed": "0.18.0", "nccl": "2.21.5"}})
    assert check.status == "fail"
    assert "deepspeed: 0.19.8 on this host, 0.18.0 on n1" in check.detail and "nccl: 2.27.3 on this host" in check.detail
    assert check.hint.startswith("install the same versions on every host: pip install deepspeed==0.19.8")
    assert "same NCCL" in check.hint
    assert doctor.judge_versions({"this host": here, "n1": dict(here)}).status == "ok"


def test_doctor_prints_each_static_check(capsys):
    from dstk.cli import main

    main(["doctor", "--num-ranks", "2", "--no-allreduce", "--format", "json"])
    names = [c["name"] for c in json.loads(capsys.readouterr().out)["checks"]]
    assert names[:2] == ["versions@localhost", "op-build locks"]
    assert {"shm", "shm leaks", "memlock", "ops"} <= set(names)


sshd = sshd_fixture()


@pytest.mark.distributed
def test_versions_agree_over_ssh_on_a_two_host_hostfile(sshd, tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=1\n127.0.0.1 slots=1\n")
    done = subprocess.run([sys.executable, "-m", "dstk", "doctor", "--hostfile", str(hostfile), "--no-allreduce",
                           "--format", "json"], capture_output=True, text=True, env={**os.environ, **sshd.env},
                          timeout=300)
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    for host in ("localhost", "127.0.0.1"):
        assert checks[f"versions@{host}"]["status"] == "ok", checks[f"versions@{host}"]
    agree = checks["versions agree"]
    assert agree["status"] == "ok", agree
    assert agree["data"]["hosts"] == sorted(["this host", "localhost", "127.0.0.1"])
    import deepspeed  # noqa: F401  (the versions it names are this environment's)
    import torch

    assert f"torch {torch.__version__}" in agree["detail"] and f"deepspeed {deepspeed.__version__}" in agree["detail"]
    # with two nodes of one CPU rank, DeepSpeed's shm all-reduce is not used: nothing needed in /dev/shm
    assert checks["shm"]["data"]["need_bytes"] == 0
    # each host's ulimit -l and /dev/shm, read over the same ssh: here the same machine as this host's
    for host in ("localhost", "127.0.0.1"):
        assert checks[f"memlock@{host}"]["data"] == checks["memlock"]["data"], checks[f"memlock@{host}"]
        assert checks[f"shm@{host}"]["data"]["total_bytes"] == checks["shm"]["data"]["total_bytes"]
        assert checks[f"shm@{host}"]["status"] == "ok"


def test_limits_read_from_a_host():
    memlock, space = doctor.parse_limits("8192\n68719476736 1048576\n")
    assert memlock == 8 * MIB and space.total_bytes == 64 * GIB and space.free_bytes == MIB
    assert doctor.parse_limits("unlimited\n") == (None, None)
    assert doctor.parse_limits("bash: ulimit: error\n") is None
    done = subprocess.run(["sh", "-c", doctor.LIMITS_COMMAND], capture_output=True, text=True)
    memlock, space = doctor.parse_limits(done.stdout)  # this host's shell and df: what a remote one runs
    assert memlock == doctor.check_memlock(cpu=True).data["memlock_bytes"]
    assert space.total_bytes == shm.shm_space("/dev/shm").total_bytes


@pytest.mark.distributed
def test_the_allreduce_runs_over_pdsh_on_a_two_host_hostfile(sshd, tmp_path):
    """The doctor's benchmark as a 2-node pdsh launch (this machine twice, over the test sshd): both ranks
    report, gloo's result is right, and the launch is watched like a training launch's (run.stop_guards)."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=1\n127.0.0.1 slots=1\n")
    done = subprocess.run([sys.executable, "-m", "dstk", "doctor", "--hostfile", str(hostfile), "--master-addr",
                           "127.0.0.1", "--format", "json"], capture_output=True, text=True,
                          env={**os.environ, **sshd.env}, timeout=600)
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    bench = checks["allreduce"]
    assert bench["status"] == "ok", (bench, done.stderr[-3000:])
    assert {r["world_size"] for r in bench["data"]["results"]} == {2} and bench["detail"].startswith("gloo, 2 ranks")


@pytest.mark.distributed
def test_a_stale_lock_on_another_host_fails_its_check_and_skips_the_allreduce(sshd, tmp_path):
    """A node-local torch extensions cache (a container's, or a node's /tmp) that holds a stale op-build lock
    hangs that node's ranks at the start of a multi-node launch, and this machine cannot see it. Here the
    "hosts" (this machine over the test sshd) get a cache of their own through ssh's SetEnv, with a stale lock
    in it; this machine's cache is clean. The host's check must fail with the lock and the ssh rm that
    clears it, and the all-reduce, which would hang, must be skipped."""
    remote_cache = tmp_path / "remote_ext"
    lock = remote_cache / "py311_cpu" / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    bin_dir = ssh_with_env(sshd, tmp_path, TORCH_EXTENSIONS_DIR=str(remote_cache))
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=1\n127.0.0.1 slots=1\n")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "TORCH_EXTENSIONS_DIR": str(tmp_path / "local_ext")}
    done = subprocess.run([sys.executable, "-m", "dstk", "doctor", "--hostfile", str(hostfile), "--master-addr",
                           "127.0.0.1", "--format", "json"], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    assert checks["op-build locks"]["status"] == "ok"  # this machine's own cache
    for host in ("localhost", "127.0.0.1"):
        c = checks[f"op-build locks@{host}"]
        assert c["status"] == "fail" and c["data"]["stale"] == [str(lock)], c
        assert c["hint"].endswith(f"ssh {host} 'rm {lock}'"), c
    assert checks["allreduce"]["status"] == "skip" and "stale lock" in checks["allreduce"]["detail"]
    lock.unlink()  # cleared: the same command passes those checks
    again = subprocess.run([sys.executable, "-m", "dstk", "doctor", "--hostfile", str(hostfile), "--no-allreduce",
                            "--format", "json"], capture_output=True, text=True, env=env, timeout=600)
    checks = {c["name"]: c for c in json.loads(again.stdout)["checks"]}
    assert all(checks[f"op-build locks@{h}"]["status"] == "ok" for h in ("localhost", "127.0.0.1")), checks
    assert str(remote_cache) in checks["op-build locks@localhost"]["detail"]


def test_a_stopped_doctor_still_reports_what_it_checked(capsys):
    """A signal during the all-reduce ends ``dstk doctor`` (128 + the signal); the checks done before it are
    printed first, and the JSON report says it was stopped, not ok."""
    import argparse

    from dstk.commands.doctor import _report

    checks = [doctor.Check(name="op-build locks", status="ok", detail="no stale lock"),
              doctor.Check(name="allreduce", status="skip", detail="stopped by SIGTERM before it finished")]
    assert _report(checks, argparse.Namespace(format="json"), stopped=True) is False
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and report["stopped"] is True
    assert [c["name"] for c in report["checks"]] == ["op-build locks", "allreduce"]
    assert _report(checks, argparse.Namespace(format="json")) is False
    assert json.loads(capsys.readouterr().out) == {"ok": True, "checks": report["checks"]}
