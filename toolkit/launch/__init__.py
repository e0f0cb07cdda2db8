"""Launching on the deepspeed runner (or torchrun): hosts, environment, commands, Slurm, doctor.

dstk never becomes a launcher: it builds the runner's command as a ``list[str]`` from a run
directory, checks it against the plan, writes the files the runner reads, runs it with
rank-prefixed output, and tells which rank failed. Nothing here imports torch or DeepSpeed.

    from dstk.launch import LaunchSpec, build_command, run_launch, spec_from_run_dir
    spec = spec_from_run_dir("run/", script="train.py")
    cmd = build_command(spec)        # pure
    rc = run_launch(spec)            # non-zero when any rank failed or was killed
"""

from dstk.launch.command import LAUNCHERS, LaunchPlan, LaunchSpec, ShellVar, build_command, plan_launch, shell_join
from dstk.launch.env import NCCL_PROFILES, load_profile, render_deepspeed_env
from dstk.launch.hosts import Host, apply_filters, check_hostfile, parse_hosts_flag, render_hostfile
from dstk.launch.locks import check_op_locks, find_stale_locks
from dstk.launch.run import LaunchResult, RankExit, judge, run_launch, run_plan
from dstk.launch.rundir import read_plan, spec_from_run_dir

__all__ = [
    "LAUNCHERS", "NCCL_PROFILES", "Host", "LaunchPlan", "LaunchResult", "LaunchSpec", "RankExit", "ShellVar",
    "apply_filters", "build_command", "check_hostfile", "check_op_locks", "find_stale_locks", "judge",
    "load_profile", "parse_hosts_flag", "plan_launch", "read_plan", "render_deepspeed_env", "render_hostfile",
    "run_launch", "run_plan", "shell_join", "spec_from_run_dir",
]
