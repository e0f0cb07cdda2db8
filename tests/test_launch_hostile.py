"""Hostile host names, arguments and environment values: rejected, or quoted so that a shell
running the generated command or script executes nothing injected.

Each generated artifact is run under a real shell with a fake interpreter that records the argv
and environment it received; an injected ``touch MARKER`` must not have run, and the values must
arrive exactly as given.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from dstk.errors import DstkError
from dstk.launch import Host, LaunchSpec, check_hostfile, parse_hosts_flag, plan_launch, spec_from_run_dir
from dstk.launch.command import shell_command
from dstk.launch.env import render_deepspeed_env
from dstk.launch.slurm import render_sbatch
from tests.test_launch import write_run_dir


def _hostile(marker: Path) -> list[str]:
    return [f"$(touch {marker})", f"`touch {marker}`", f"a b; touch {marker}", f"x' ; touch {marker}; '",
            f'y" ; touch {marker}; "', f"two\nlines; touch {marker}", "\\", "--flag=$HOME", "*"]


def _executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def _recorder(tmp_path: Path) -> tuple[Path, Path]:
    """A fake python that appends {argv, env} as one JSON line per call."""
    record = tmp_path / "record.jsonl"
    fake = _executable(tmp_path / "fake python", f"#!{sys.executable}\n"
                       "import json, os, sys\n"
                       f"with open({str(record)!r}, 'a') as f:\n"
                       "    f.write(json.dumps({'argv': sys.argv[1:], 'env': dict(os.environ), 'cwd': os.getcwd()}) + '\\n')\n")
    return fake, record


def _records(record: Path) -> list[dict]:
    return [json.loads(line) for line in record.read_text().splitlines()]


@pytest.mark.parametrize("name", ["a b", "a;b", "$(id)", "`id`", "a'b", 'a"b', "h\nx", "a@b", "a:b", "-oProxyCommand=x",
                                  ".hidden..", ""])
def test_hostile_host_names_are_rejected_everywhere(name):
    with pytest.raises(DstkError):
        parse_hosts_flag(f"{name}:2")
    _, findings = check_hostfile(f"{name} slots=2\n")
    assert any(f.severity == "error" for f in findings) or name.strip() == ""
    with pytest.raises((DstkError, ValueError)):
        plan_launch(LaunchSpec(script="t.py", num_nodes=1, gpus_per_node=2, master_addr=name, master_port=1,
                               hosts=(Host(name="ok", num_slots=2),), hostfile="/h", launcher="pdsh", run_dir="/r"))


def test_sbatch_script_runs_no_injected_command(tmp_path):
    marker = tmp_path / "pwned"
    run_dir = write_run_dir(tmp_path / "run dir 'x' $(touch pwned)", num_nodes=2, gpus_per_node=2)
    evil = _hostile(marker)
    spec = spec_from_run_dir(run_dir, script=evil[0], script_args=evil[1:], master_port=29555,
                             env={"EVIL": evil[3], "EVIL2": evil[0], "NCCL_SOCKET_IFNAME": "^docker,lo"})
    fake, record = _recorder(tmp_path)
    spec = dataclasses.replace(spec, python=str(fake))
    sbatch = tmp_path / "job.sbatch"
    sbatch.write_text(render_sbatch(spec, sbatch_path=str(sbatch), workdir=str(run_dir)))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _executable(bin_dir / "scontrol", "#!/bin/sh\nprintf 'node-a\\nnode-b\\n'\n")
    # srun: drop its options, then run the task once per node as Slurm would, with SLURM_NODEID set.
    _executable(bin_dir / "srun", '#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\n'
                'for id in 0 1; do SLURM_NODEID=$id "$@" || exit $?; done\n')
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "node-[a-b]",
           "HOME": str(tmp_path)}
    subprocess.run(["bash", str(sbatch)], env=env, check=True, cwd=tmp_path, timeout=60)
    assert not marker.exists() and not (tmp_path / "pwned").exists()
    calls = _records(record)
    assert len(calls) == 2
    hostfile = str(run_dir) + "/hostfile.slurm-42"
    assert Path(hostfile).read_text() == "node-a slots=2\nnode-b slots=2\n"
    for node, call in enumerate(calls):
        # each task runs its node under dstk's judge, which then runs the runner (not run here: fake python)
        assert call["argv"] == ["-u", "-m", "dstk.launch.slurm", "--ranks", "2", "--run-dir", str(run_dir), "--",
                                str(fake), "-u", "-m", "deepspeed.launcher.runner", "--hostfile", hostfile, "--no_ssh",
                                "--node_rank", str(node), "--master_addr", "node-a", "--master_port", "29555",
                                "--module", "dstk.launch.rank", *evil, "--deepspeed_config",
                                str(run_dir / "ds_config.json")]
        assert call["env"]["EVIL"] == evil[3] and call["env"]["EVIL2"] == evil[0]
        assert call["env"]["NCCL_SOCKET_IFNAME"] == "^docker,lo"
        assert call["cwd"] == str(run_dir)  # the script's `cd` to the launch directory


def test_printed_dry_run_command_runs_no_injected_command(tmp_path):
    marker = tmp_path / "pwned"
    evil = _hostile(marker)
    fake, record = _recorder(tmp_path)
    spec = LaunchSpec(script=evil[0], script_args=tuple(evil[1:]), num_nodes=1, gpus_per_node=2, master_port=29556,
                      env={"EVIL": evil[2], "EVIL2": evil[4]}, python=str(fake))
    subprocess.run(["sh", "-c", shell_command(plan_launch(spec))], check=True, cwd=tmp_path, timeout=60)
    assert not marker.exists()
    (call,) = _records(record)
    assert call["argv"] == ["-u", "-m", "deepspeed.launcher.runner", "--num_gpus", "2", "--master_port", "29556",
                            "--module", "dstk.launch.rank", *evil]
    assert call["env"]["EVIL"] == evil[2] and call["env"]["EVIL2"] == evil[4]


def test_pdsh_refuses_what_the_remote_shell_would_run(tmp_path):
    """Script arguments: every hostile word is refused. Environment values: each is refused, or
    arrives verbatim when the runner's own `export K="V";` is evaluated by a shell."""
    from deepspeed.launcher.multinode_runner import PDSHRunner

    marker = tmp_path / "pwned"
    base = dict(script="t.py", num_nodes=2, gpus_per_node=1, master_port=1, launcher="pdsh", run_dir=str(tmp_path),
                hosts=(Host(name="a", num_slots=1), Host(name="b", num_slots=1)), hostfile="/h")
    accepted = 0
    for word in _hostile(marker):
        with pytest.raises(DstkError):
            plan_launch(LaunchSpec(**base, script_args=(word,)))
        try:
            text = render_deepspeed_env({"K": word}, launcher="pdsh")
        except DstkError:
            continue
        accepted += 1
        runner = PDSHRunner.__new__(PDSHRunner)
        runner.exports = {}
        runner.add_export(*text.rstrip("\n").split("=", 1))
        out = subprocess.run(["sh", "-c", f"export K={runner.exports['K']}; printf %s \"$K\""], cwd=tmp_path,
                             capture_output=True, text=True, check=True).stdout
        assert out == word
    assert not marker.exists()
    assert 0 < accepted < len(_hostile(marker))  # some are carried safely, the rest refused


def test_pdsh_remote_command_carries_what_dstk_accepts(tmp_path):
    """The real runner builds the pdsh command from our argv and .deepspeed_env; a shell running
    its remote part gives the script the exact arguments and variables."""
    from deepspeed.launcher import runner as ds_runner
    from deepspeed.launcher.multinode_runner import PDSHRunner

    fake, record = _recorder(tmp_path)
    args = ("my run", "^docker", "a,b=c:d/e@f%g+h", "--lr", "1e-4")
    env = {"WANDB_PROJECT": "my project", "NCCL_SOCKET_IFNAME": "^docker,lo", "NCCL_IB_HCA": "=mlx5_0:1"}
    spec = LaunchSpec(script="train.py", script_args=args, num_nodes=2, gpus_per_node=1, master_port=29557,
                      launcher="pdsh", hosts=(Host(name="a", num_slots=1), Host(name="b", num_slots=1)),
                      hostfile="/h", env=env, run_dir=str(tmp_path), ds_config="/r/ds config.json")
    plan = plan_launch(spec)
    runner_args = ds_runner.parse_args(plan.command[4:])
    runner = PDSHRunner(runner_args, "WORLD")
    (env_text,) = plan.files.values()
    for line in env_text.splitlines(keepends=True):
        key, val = line.split("=", maxsplit=1)
        runner.add_export(key, val)
    cmd, _, _ = runner.get_cmd({}, {"a": [0], "b": [0]})
    remote = cmd[cmd.index("-w") + 2:]
    remote = [str(fake).replace(" ", "\\ ") if w == sys.executable else w.replace("%n", "0") for w in remote]
    subprocess.run(["sh", "-c", " ".join(remote)], check=True, timeout=60)
    (call,) = _records(record)
    assert call["argv"][call["argv"].index("dstk.launch.rank") + 1:] == ["train.py", *args, "--deepspeed_config",
                                                                          "/r/ds config.json"]
    assert {k: call["env"][k] for k in env} == env
