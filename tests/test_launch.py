"""Unit tests of dstk.launch: hostfiles, filters, checks against the plan, env safety, outcome, locks.

Where the deepspeed runner is the reference (hostfile parsing, include/exclude, world info), the
test calls the runner's own functions on the same input.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dstk.cli import main
from dstk.errors import DstkError
from dstk.launch import (Host, LaunchSpec, RankExit, apply_filters, build_command, check_hostfile, find_stale_locks,
                         judge, parse_hosts_flag, render_deepspeed_env, spec_from_run_dir)
from dstk.launch.env import load_profile, profile_comments, NCCL_PROFILES
from dstk.launch.rank import child_argv

# --- hostfiles ------------------------------------------------------------------------------


def test_hostfile_good_lines_in_order():
    text = "# cluster\n\nworker-0 slots=8\nworker-1\tslots=8  # second\n10.0.0.3 slots=4\n"
    hosts, findings = check_hostfile(text)
    assert findings == []
    assert [(h.name, h.num_slots, h.line) for h in hosts] == [("worker-0", 8, 3), ("worker-1", 8, 4), ("10.0.0.3", 4, 5)]


def test_hostfile_every_error_with_its_line():
    text = "a slots=2\nb\nc slots = 2\na slots=2\nd slots=0\ne;rm slots=1\nf slots=2 max_slots=4\n"
    hosts, findings = check_hostfile(text)
    got = [(f.line, f.code, f.severity) for f in findings]
    assert got == [(2, "HF001", "error"), (3, "HF001", "error"), (4, "HF005", "error"), (5, "HF003", "error"),
                   (6, "HF002", "error"), (7, "HF004", "warning")]
    assert "first on line 1" in findings[2].message
    assert [h.name for h in hosts] == ["a", "f"]


def test_hostfile_empty_is_an_error():
    _, findings = check_hostfile("# nothing\n\n")
    assert [f.code for f in findings] == ["HF006"]


def test_hostfile_agrees_with_the_runner():
    """Every file we accept, the runner reads to the same hosts and slots, in the same order."""
    from deepspeed.launcher.runner import _parse_hostfile

    text = "# c\nworker-0 slots=8\nworker-1\tslots=4 # x\n\n10.1.2.3 slots=2\n"
    hosts, findings = check_hostfile(text)
    assert not findings
    assert list(_parse_hostfile(text.splitlines()).items()) == [(h.name, h.num_slots) for h in hosts]


@pytest.mark.parametrize("bad", ["a b:2", "a:0", "a", "a:2,a:2", "$(id):1", "a;b:1", "h\n:1"])
def test_hosts_flag_rejects(bad):
    with pytest.raises(DstkError):
        parse_hosts_flag(bad)


def test_hosts_flag():
    assert parse_hosts_flag("w0:8, w1:8") == [Host(name="w0", num_slots=8), Host(name="w1", num_slots=8)]


@pytest.mark.parametrize("include,exclude", [("worker-0", ""), ("worker-1:0,2", ""), ("worker-0@worker-1:1", ""),
                                             ("", "worker-1:0"), ("", "worker-1"), ("worker-0:0,0,1", "")])
def test_filters_agree_with_the_runner(include, exclude):
    from deepspeed.launcher.runner import parse_inclusion_exclusion

    hosts = [Host(name="worker-0", num_slots=4), Host(name="worker-1", num_slots=4)]
    ours = apply_filters(hosts, include=include, exclude=exclude)
    theirs = parse_inclusion_exclusion({"worker-0": 4, "worker-1": 4}, include, exclude)
    assert ours == {k: list(v) for k, v in theirs.items()}


@pytest.mark.parametrize("include,exclude,match", [("worker-2", "", "not in the host list"),
                                                   ("worker-0:7", "", "no slot 7"),
                                                   ("worker-0", "worker-1", "cannot be combined")])
def test_filter_errors(include, exclude, match):
    with pytest.raises(DstkError, match=match):
        apply_filters([Host(name="worker-0", num_slots=4), Host(name="worker-1", num_slots=4)],
                      include=include, exclude=exclude)


# --- checks against the plan ----------------------------------------------------------------


def _spec(**kw) -> LaunchSpec:
    base = dict(script="train.py", num_nodes=2, gpus_per_node=4, python="/py", master_port=29500,
                hosts=(Host(name="a", num_slots=4), Host(name="b", num_slots=4)), hostfile="/r/hostfile",
                launcher="pdsh", run_dir="/r", ds_config="/r/ds_config.json")
    base.update(kw)
    return LaunchSpec(**base)


@pytest.mark.parametrize("kw,match", [
    (dict(num_nodes=3), "plan is for 3 node"),
    (dict(hosts=(Host(name="a", num_slots=4), Host(name="b", num_slots=8))), "b has 8"),
    (dict(include="a"), "after filtering has 1"),
    (dict(hosts=(), hostfile=None), "no hosts were given"),
    (dict(launcher="local"), "starts one node"),
    (dict(node_rank=2, launcher="local"), "out of range"),
    (dict(launcher="openmpi", include="a@b"), "cannot apply --include"),
    (dict(launcher="slurm", include="a:1,2,3,0@b:1,2,3,0"), None),
    (dict(launcher="slurm", hosts=(Host(name="a", num_slots=5), Host(name="b", num_slots=5)),
          include="a:1,2,3,4@b:1,2,3,4"), "cannot pick single slots"),
    (dict(master_addr="a;b"), "not a host name"),
    (dict(hosts=(), hostfile=None, num_nodes=1, launcher="local", include="localhost:0,1"), "selects 2 device"),
    (dict(hosts=(), hostfile=None, num_nodes=1, launcher="local", exclude="localhost:0"), "--exclude without hosts"),
])
def test_spec_is_checked_against_the_plan(kw, match):
    if match is None:
        build_command(_spec(**kw))
        return
    with pytest.raises(DstkError, match=match):
        build_command(_spec(**kw))


def test_master_addr_always_passed_with_hosts():
    for kw in (dict(), dict(launcher="slurm"), dict(launcher="openmpi"), dict(launcher="local", node_rank=0)):
        cmd = build_command(_spec(**kw))
        assert cmd[cmd.index("--master_addr") + 1] == "a"
        assert cmd[cmd.index("--hostfile") + 1] == "/r/hostfile"


def test_config_path_appended_once():
    assert build_command(_spec())[-2:] == ["--deepspeed_config", "/r/ds_config.json"]
    cmd = build_command(_spec(script_args=("--deepspeed_config=/other.json",)))
    assert cmd.count("/r/ds_config.json") == 0


# --- environment ------------------------------------------------------------------------------


@pytest.mark.parametrize("launcher,value,ok", [
    ("pdsh", "a b", True), ("pdsh", "^docker,lo", True), ("pdsh", "$(touch x)", False), ("pdsh", "a`id`", False),
    ("pdsh", 'a"b', False), ("pdsh", " lead", False), ("pdsh", "two\nlines", False),
    ("openmpi", "=eth0", True), ("openmpi", "a b", False), ("openmpi", "^docker", False),
    ("slurm", "x;y", False), ("mpich", "/opt/lib:/usr/lib", True),
])
def test_deepspeed_env_refuses_what_it_cannot_carry(launcher, value, ok):
    if ok:
        assert render_deepspeed_env({"K": value}, launcher=launcher) == f"K={value}\n"
    else:
        with pytest.raises(DstkError):
            render_deepspeed_env({"K": value}, launcher=launcher)


def test_deepspeed_env_is_read_back_by_the_runner(tmp_path):
    """The runner's own reader (split on the first '=', then add_export) gets the values intact."""
    from deepspeed.launcher.multinode_runner import PDSHRunner

    env = {"NCCL_IB_HCA": "=mlx5_0:1", "WANDB_PROJECT": "my run", "NCCL_SOCKET_IFNAME": "^docker,lo"}
    text = render_deepspeed_env(env, launcher="pdsh")
    assert "\n\n" not in text and not any(line.startswith("#") for line in text.splitlines())
    runner = PDSHRunner.__new__(PDSHRunner)
    runner.exports = {}
    for line in text.splitlines(keepends=True):
        key, val = line.split("=", maxsplit=1)
        runner.add_export(key, val)
    # pdsh hands `export K=V;` to a remote shell: evaluate exactly that and read the values back.
    script = "".join(f"export {k}={v}; " for k, v in runner.exports.items())
    script += "".join(f'printf "%s\\n" "${k}"; ' for k in env)
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == list(env.values())


def test_env_key_and_value_checks():
    with pytest.raises(DstkError):
        build_command(_spec(env=(("BAD KEY", "1"),)))
    with pytest.raises(DstkError):
        build_command(_spec(launcher="local", node_rank=0, env=(("K", "a\nb"),)))


@pytest.mark.parametrize("name", NCCL_PROFILES)
def test_profiles_have_a_comment_for_every_variable(name):
    env = load_profile(name)
    comments = profile_comments(name)
    assert env and set(env) == set(comments)
    assert all(len(c) > 20 for c in comments.values()), comments
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] in {"1", "3"} and "NCCL_DEBUG" in env


# --- the rank wrapper and the outcome ---------------------------------------------------------


def test_child_argv_moves_local_rank_after_the_script():
    assert child_argv(["--local_rank=1", "t.py", "--x"], python="/py") == ["/py", "-u", "t.py", "--local_rank=1", "--x"]
    assert child_argv(["-m", "pkg.t", "a"], python="/py") == ["/py", "-u", "-m", "pkg.t", "a"]


def test_judge_names_the_culprit_first():
    ranks = [RankExit(rank=0, returncode=-15, stopped=True), RankExit(rank=1, returncode=-9)]
    result = judge(runner_returncode=0, ranks=ranks, world_size=2, expect_reports=True)
    assert result.returncode == 128 + 9
    assert result.messages[0].startswith("rank 1 was killed by SIGKILL")
    ok = judge(runner_returncode=0, ranks=[RankExit(rank=0, returncode=0), RankExit(rank=1, returncode=0)],
               world_size=2, expect_reports=True)
    assert ok.returncode == 0 and ok.messages == ()
    lost = judge(runner_returncode=0, ranks=[RankExit(rank=0, returncode=0)], world_size=2, expect_reports=True)
    assert lost.returncode != 0 and lost.missing_ranks == (1,)
    assert judge(runner_returncode=3, ranks=[], world_size=2, expect_reports=False).returncode == 3


# --- stale op-build locks ---------------------------------------------------------------------


def test_stale_lock_found_and_held_lock_not(tmp_path):
    stale = tmp_path / "py311_cpu" / "deepspeed_shm_comm" / "lock"
    stale.parent.mkdir(parents=True)
    stale.write_text("")
    held = tmp_path / "py311_cpu" / "fused_adam" / "lock"
    held.parent.mkdir(parents=True)
    # A live "build" holding its baton open, as torch's FileBaton does.
    holder = subprocess.Popen([sys.executable, "-c", "import os,sys,time; fd=os.open(sys.argv[1], os.O_CREAT|os.O_EXCL); "
                               "print('ok', flush=True); time.sleep(60)", str(held)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ok"
        assert find_stale_locks(tmp_path) == [stale]
    finally:
        holder.kill()
        holder.wait()
    assert sorted(find_stale_locks(tmp_path)) == sorted([stale, held])


def test_launch_refuses_to_hang_on_a_stale_lock(tmp_path, monkeypatch, capsys):
    (tmp_path / "ext" / "op").mkdir(parents=True)
    (tmp_path / "ext" / "op" / "lock").write_text("")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    run_dir = write_run_dir(tmp_path / "run", num_nodes=1, gpus_per_node=2)
    assert main(["launch", str(run_dir), "--", "train.py"]) == 1
    err = capsys.readouterr().err
    assert "stale op-build lock" in err and "rm " in err and str(tmp_path / "ext" / "op" / "lock") in err


def test_launch_checks_the_cache_its_ranks_use(tmp_path, monkeypatch, capsys):
    """``--env TORCH_EXTENSIONS_DIR=DIR`` gives the ranks another cache than dstk's own: a stale lock there
    hangs them as surely, so that is the cache checked (it used to be dstk's own, clean one)."""
    ranks = tmp_path / "ranks_ext"
    (ranks / "op").mkdir(parents=True)
    (ranks / "op" / "lock").write_text("")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "dstk_own"))
    run_dir = write_run_dir(tmp_path / "run", num_nodes=1, gpus_per_node=2)
    (tmp_path / "train.py").write_text("")
    monkeypatch.chdir(tmp_path)
    assert main(["launch", str(run_dir), "--env", f"TORCH_EXTENSIONS_DIR={ranks}", "--", "train.py"]) == 1
    err = capsys.readouterr().err
    assert f"stale op-build lock(s) in the torch extensions cache, left by a build that was killed: {ranks / 'op' / 'lock'}" \
        in err, err


# --- the command line -------------------------------------------------------------------------


def write_run_dir(path: Path, *, num_nodes: int, gpus_per_node: int, gpu: str = "cpu") -> Path:
    """A run directory as docs/contracts.md describes it (only the fields launch reads, plus a config)."""
    path.mkdir(parents=True)
    world = num_nodes * gpus_per_node
    plan = {"dstk_version": "0.1.0", "model": {"name": "tiny"},
            "cluster": {"num_nodes": num_nodes, "gpus_per_node": gpus_per_node, "gpu": gpu, "interconnect": "none"},
            "training": {}, "layout": {"dp": world, "tp": 1, "pp": 1, "zero_stage": 0}}
    (path / "plan.json").write_text(json.dumps(plan))
    (path / "ds_config.json").write_text(json.dumps({"train_batch_size": world, "train_micro_batch_size_per_gpu": 1}))
    return path


def _tree(path: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime_ns for p in path.rglob("*")}


def test_dry_run_changes_nothing(tmp_path, capsys):
    run_dir = write_run_dir(tmp_path / "run", num_nodes=2, gpus_per_node=2)
    before = _tree(tmp_path)
    rc = main(["launch", str(run_dir), "--hosts", "n0:2,n1:2", "--nccl-profile", "ethernet", "--env", "A=b c",
               "--master-port", "29999", "--dry-run", "--format", "json", "--", "train.py", "--steps", "1"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert _tree(tmp_path) == before
    assert set(out["files"]) == {str(run_dir.resolve() / "hostfile"), str(run_dir.resolve() / ".deepspeed_env")}
    assert out["files"][str(run_dir.resolve() / "hostfile")] == "n0 slots=2\nn1 slots=2\n"
    assert "NCCL_IB_DISABLE=1\n" in out["files"][str(run_dir.resolve() / ".deepspeed_env")]
    assert out["command"][-4:] == ["--steps", "1", "--deepspeed_config", str(run_dir.resolve() / "ds_config.json")]
    assert main(["launch", str(run_dir), "--slurm", "--dry-run", "--", "train.py"]) == 0
    assert _tree(tmp_path) == before


def test_cli_errors_are_reported_not_raised(tmp_path, capsys):
    run_dir = write_run_dir(tmp_path / "run", num_nodes=2, gpus_per_node=2)
    hostfile = tmp_path / "hosts"
    hostfile.write_text("n0 slots=2\nn0 slots=2\nn2 slots=x\n")
    assert main(["launch", str(run_dir), "--hostfile", str(hostfile), "--dry-run", "--", "t.py"]) == 1
    err = capsys.readouterr().err
    assert f"{hostfile}:2" in err and f"{hostfile}:3" in err
    assert main(["launch", str(run_dir), "--dry-run", "--", "t.py"]) == 1
    assert "plan is for 2 nodes" in capsys.readouterr().err
    assert main(["launch", str(run_dir), "--hosts", "n0:2,n1:2", "--dry-run"]) == 2
    assert main(["launch", str(tmp_path / "nope"), "--dry-run", "--", "t.py"]) == 2


def test_slurm_writes_an_executable_script(tmp_path, capsys):
    run_dir = write_run_dir(tmp_path / "run", num_nodes=2, gpus_per_node=8, gpu="h100-sxm")
    assert main(["launch", str(run_dir), "--slurm", "--nccl-profile", "ib", "--partition", "gpu", "--", "t.py"]) == 0
    script = run_dir / "launch.sbatch"
    assert os.access(script, os.X_OK)
    text = script.read_text()
    assert "#SBATCH --nodes=2" in text and "#SBATCH --gpus-per-node=8" in text and "export NCCL_IB_HCA=mlx5" in text
    subprocess.run(["bash", "-n", str(script)], check=True)
    with pytest.raises(DstkError, match="cannot be quoted"):
        from dstk.launch.slurm import render_sbatch
        render_sbatch(spec_from_run_dir(run_dir, script="t.py", master_port=1), sbatch_path="/x", job_name="a b")


def test_spec_from_run_dir_sets_cpu_threads(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    run_dir = write_run_dir(tmp_path / "run", num_nodes=1, gpus_per_node=2)
    spec = spec_from_run_dir(run_dir, script="t.py", env={"X": "1"})
    env = dict(spec.env)
    assert env["OMP_NUM_THREADS"] == str(max(1, (os.cpu_count() or 1) // 2)) and env["X"] == "1"
    assert spec.cpu and spec.world_size == 2 and 1 <= spec.master_port <= 65535
    assert dict(spec_from_run_dir(run_dir, script="t.py", env={"OMP_NUM_THREADS": "7"}).env)["OMP_NUM_THREADS"] == "7"


def test_lint_existing_deepspeed_env_names_each_bad_line():
    from dstk.launch.env import lint_deepspeed_env

    findings = lint_deepspeed_env("A=1\n\n# note=x\nnovalue\nBAD KEY=1\nB=2\n")
    assert [(f.line, f.code) for f in findings] == [(2, "DE001"), (3, "DE002"), (4, "DE003"), (5, "DE004")]
    assert lint_deepspeed_env("A=1\nB=a b\n") == []


def test_scheduler_gpus_are_kept(tmp_path, monkeypatch):
    """CUDA_VISIBLE_DEVICES=4,5 from a scheduler becomes --include localhost:4,5 (the runner would drop it)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    run_dir = write_run_dir(tmp_path / "run", num_nodes=1, gpus_per_node=2, gpu="h100-sxm")
    cmd = build_command(spec_from_run_dir(run_dir, script="t.py", master_port=1))
    assert cmd[cmd.index("--include") + 1] == "localhost:4,5" and "--num_gpus" not in cmd
    run4 = write_run_dir(tmp_path / "run4", num_nodes=1, gpus_per_node=4, gpu="h100-sxm")
    with pytest.raises(DstkError, match="selects 2 device"):
        build_command(spec_from_run_dir(run4, script="t.py", master_port=1))


def test_an_op_build_that_starts_during_a_launch_is_announced(tmp_path, monkeypatch):
    """DeepSpeed's ranks print nothing while torch builds an op; the builder's lock file is the sign."""
    import threading
    import time

    from dstk.launch.run import _op_builds

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    (tmp_path / "old_op").mkdir()
    (tmp_path / "old_op" / "lock").write_text("")  # there before the launch: not this launch's build
    done = threading.Event()

    def build() -> None:
        time.sleep(0.3)
        (tmp_path / "py311_cpu" / "fused_adam").mkdir(parents=True)
        (tmp_path / "py311_cpu" / "fused_adam" / "lock").write_text("")
        time.sleep(0.5)
        done.set()

    threading.Thread(target=build).start()
    assert list(_op_builds(done, interval=0.05)) == ["fused_adam"]


def test_an_op_build_is_watched_in_the_ranks_cache(tmp_path, monkeypatch):
    """The ranks' ``TORCH_EXTENSIONS_DIR`` (``--env`` sets it in the plan's environment, run_plan passes the
    root it gives) is where their builds lock, not the cache of dstk's own environment."""
    import threading
    import time

    from dstk.launch.run import _op_builds

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "dstk_own"))
    ranks = tmp_path / "ranks"
    (ranks / "cpu_adam").mkdir(parents=True)
    done = threading.Event()

    def build() -> None:
        time.sleep(0.2)
        (ranks / "cpu_adam" / "lock").write_text("")
        time.sleep(0.5)
        done.set()

    threading.Thread(target=build).start()
    assert list(_op_builds(done, interval=0.05, root=ranks)) == ["cpu_adam"]


def test_a_lock_held_for_a_moment_is_a_load_not_a_build(tmp_path, monkeypatch):
    """torch takes the same lock to check an op that is already built, for milliseconds on each rank's
    load: dstk said "DeepSpeed is building its op" on launches that built nothing."""
    import threading
    import time

    from dstk.launch.run import _op_builds

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    op = tmp_path / "py311_cpu" / "deepspeed_shm_comm"
    op.mkdir(parents=True)
    done = threading.Event()

    def loads() -> None:
        # five loads one after another, each holding the lock half a poll interval: most are seen at one
        # poll (what the old check announced), none can be at two
        for _ in range(5):
            time.sleep(0.1)
            (op / "lock").write_text("")
            time.sleep(0.25)
            (op / "lock").unlink()
        done.set()

    threading.Thread(target=loads).start()
    assert list(_op_builds(done, interval=0.5)) == []


@pytest.mark.parametrize("sep", ["\x0b", "\x0c", "\x1c", "\x85", "\u2028", "\u2029"])
def test_a_line_break_the_runner_does_not_see_is_refused(tmp_path, sep):
    """The runner reads the file with readlines(): `a slots=1<VT>b slots=1` is one line (one host)
    for it; splitlines() would make it two. dstk refuses the line instead of disagreeing."""
    from deepspeed.launcher.runner import fetch_hostfile

    path = tmp_path / "hostfile"
    path.write_text(f"worker-0 slots=1{sep}worker-1 slots=1\nworker-2 slots=2\n", encoding="utf-8")
    assert list(fetch_hostfile(str(path))) == ["worker-0", "worker-2"]  # the runner: worker-1 vanishes
    _, findings = check_hostfile(path.read_bytes().decode("utf-8"))
    assert [(f.line, f.code) for f in findings] == [(1, "HF007")]


def test_files_the_runner_reads_the_same_way_agree(tmp_path):
    """CRLF and CR line ends, as the runner's text mode reads them."""
    from deepspeed.launcher.runner import fetch_hostfile

    from dstk.launch.rundir import load_hostfile

    path = tmp_path / "hostfile"
    path.write_bytes(b"worker-0 slots=8\r\nworker-1 slots=4\rworker-2 slots=2\n")
    assert [(h.name, h.num_slots) for h in load_hostfile(path)] == list(fetch_hostfile(str(path)).items())


@pytest.mark.parametrize("content,says", [
    (b"w slots=1000000000\n", "more than 1024 ranks"),
    ("w slots=\u00b2\n".encode(), "digits 0-9"),
    ("w slots=\u0663\n".encode(), "digits 0-9"),  # Arabic-Indic 3: the runner reads 3, dstk refuses
    (b"w slots=" + b"9" * 5000 + b"\n", "5000 characters"),
    (b"w slots=8\n\xff\xfe\n", "not UTF-8"),
])
def test_hostile_hostfiles_are_clear_errors(tmp_path, capsys, content, says):
    path = tmp_path / "hostfile"
    path.write_bytes(content)
    run_dir = write_run_dir(tmp_path / "run", num_nodes=1, gpus_per_node=1)
    code = main(["launch", str(run_dir), "--hostfile", str(path), "--dry-run", "--", "train.py"])
    err = capsys.readouterr().err
    assert code in (1, 2) and says in err and "internal error" not in err, err


@pytest.mark.parametrize("path", ["/dev/zero", "/dev/null"])
def test_a_device_is_not_a_hostfile(tmp_path, capsys, path):
    run_dir = write_run_dir(tmp_path / "run", num_nodes=1, gpus_per_node=1)
    assert main(["launch", str(run_dir), "--hostfile", path, "--dry-run", "--", "train.py"]) == 2
    assert "not a regular file" in capsys.readouterr().err


def test_a_fifo_is_not_a_hostfile(tmp_path, capsys):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    run_dir = write_run_dir(tmp_path / "run", num_nodes=1, gpus_per_node=1)
    assert main(["launch", str(run_dir), "--hostfile", str(fifo), "--dry-run", "--", "train.py"]) == 2
    assert "not a regular file" in capsys.readouterr().err


def test_the_runners_spellings_are_aliases_and_ports_are_checked(tmp_path, capsys):
    run_dir = write_run_dir(tmp_path / "run", num_nodes=1, gpus_per_node=2)
    argv = ["launch", str(run_dir), "--dry-run", "--format", "json"]
    assert main(argv + ["--master_port", "29511", "--", "train.py"]) == 0
    assert "29511" in capsys.readouterr().out
    for bad in ("0", "70000", "-1", "http"):
        with pytest.raises(SystemExit) as exit_info:  # argparse's usage error, through dstk's error format
            main(argv + ["--master-port", bad, "--", "train.py"])
        assert exit_info.value.code == 2
        assert "1-65535" in capsys.readouterr().err


def test_a_config_symlinked_from_outside_the_run_directory_is_refused(tmp_path, capsys):
    """Every node reads the run directory: a ds_config.json linked to a file elsewhere trains with a
    config the plan never saw (or one another node does not have). A link inside the directory is fine."""
    run_dir = write_run_dir(tmp_path / "run", num_nodes=1, gpus_per_node=2)
    config = run_dir / "ds_config.json"
    outside = tmp_path / "other.json"
    outside.write_text(config.read_text())
    config.unlink()
    config.symlink_to(outside)
    with pytest.raises(DstkError, match="outside the run directory") as exc:
        spec_from_run_dir(run_dir, script="t.py", master_port=1)
    assert f"cp --remove-destination {outside.resolve()}" in exc.value.hint
    (tmp_path / "t.py").write_text("")
    assert main(["launch", str(run_dir), "--dry-run", "--", str(tmp_path / "t.py")]) == 1
    assert "symlink" in capsys.readouterr().err
    # inside the directory: accepted
    inside = run_dir / "configs" / "ds.json"
    inside.parent.mkdir()
    outside.rename(inside)
    config.unlink()
    config.symlink_to(inside)
    assert spec_from_run_dir(run_dir, script="t.py", master_port=1).num_nodes == 1
