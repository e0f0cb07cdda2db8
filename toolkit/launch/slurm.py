"""An sbatch script for a ``LaunchSpec`` (``dstk launch --slurm``), from ``templates/slurm/``.

One task per node (``--ntasks-per-node=1``); each task runs the deepspeed runner with
``--no_ssh --node_rank $SLURM_NODEID`` (or torchrun with ``--node_rank``), the master is the
first host of ``$SLURM_JOB_NODELIST`` -- the "no-ssh per node under srun" pattern of
research/launching.md section 4. Per-task values must be expanded inside the task, never in
the batch script (every rank thinks it is rank 0 otherwise: accelerate#2816), so the node
command is quoted twice: each argument for the inner ``bash -c``, then the whole string once
more for the outer script. Nothing from the user reaches either shell unquoted.
"""

from __future__ import annotations

import re
import shlex

from dstk.errors import DstkError
from dstk.launch.command import LaunchSpec, ShellVar, _script_part, shell_join
from dstk.launch.env import check_key, check_value
from dstk.resources import template

_NAME_RE = re.compile(r"[A-Za-z0-9_.,-]+")  # what an #SBATCH value may hold (sbatch parses it, not a shell)
_TIME_RE = re.compile(r"[0-9:-]+")


def _sbatch_value(flag: str, value: str, pattern: re.Pattern = _NAME_RE) -> str:
    if not pattern.fullmatch(value):
        raise DstkError(f"--{flag} {value!r}: #SBATCH lines are read by sbatch, not a shell, and cannot be quoted",
                        hint=f"use only letters, digits and _.,- in --{flag}" if pattern is _NAME_RE
                        else "use Slurm's time format, e.g. 2-00:00:00 or 90:00")
    return value


def node_command(spec: LaunchSpec) -> list[str]:
    """The argv every Slurm task runs, with ``ShellVar`` placeholders for the per-task values."""
    if spec.launcher == "torchrun":
        return [spec.python, "-u", "-m", "torch.distributed.run",
                "--nnodes", str(spec.num_nodes), "--nproc_per_node", str(spec.gpus_per_node),
                "--node_rank", ShellVar("SLURM_NODEID"),
                "--master_addr", ShellVar("MASTER_ADDR"), "--master_port", ShellVar("MASTER_PORT"),
                "--max_restarts", "0", *_script_part(spec, torchrun=True)]
    return [spec.python, "-u", "-m", "deepspeed.launcher.runner",
            "--hostfile", ShellVar("DSTK_HOSTFILE"), "--no_ssh", "--node_rank", ShellVar("SLURM_NODEID"),
            "--master_addr", ShellVar("MASTER_ADDR"), "--master_port", ShellVar("MASTER_PORT"),
            *_script_part(spec, torchrun=False)]


def render_sbatch(spec: LaunchSpec, *, sbatch_path: str, job_name: str = "dstk", partition: str | None = None,
                  time: str | None = None, account: str | None = None) -> str:
    """The sbatch script text (pure)."""
    if spec.launcher not in ("local", "torchrun"):
        raise DstkError(f"--slurm starts the runner on every node itself; --launcher {spec.launcher} does not apply",
                        hint="drop --launcher, or use --launcher torchrun")
    if spec.hosts or spec.include or spec.exclude or spec.node_rank is not None:
        raise DstkError("--slurm takes its hosts from the allocation; --hostfile/--hosts/--include/--exclude/--node-rank do not apply",
                        hint="drop them; ask Slurm for nodes with --partition or by editing the #SBATCH lines")
    if spec.run_dir is None:
        raise DstkError("--slurm needs a run directory")
    for key, value in spec.env:
        check_key(key)
        check_value(key, value)
    extra = []
    if not spec.cpu:
        extra.append(f"#SBATCH --gpus-per-node={spec.gpus_per_node}")
    if partition:
        extra.append(f"#SBATCH --partition={_sbatch_value('partition', partition)}")
    if account:
        extra.append(f"#SBATCH --account={_sbatch_value('account', account)}")
    if time:
        extra.append(f"#SBATCH --time={_sbatch_value('time', time, _TIME_RE)}")
    exports = "\n".join(f"export {k}={shlex.quote(v)}" for k, v in spec.env) or "# (none)"
    inner = "exec " + shell_join(node_command(spec))
    values = {
        "SBATCH_PATH": shlex.quote(sbatch_path),
        "JOB_NAME": _sbatch_value("job-name", job_name),
        "NUM_NODES": str(spec.num_nodes),
        "SBATCH_EXTRA": "\n".join(extra) if extra else "# (no GPUs: CPU ranks on gloo)",
        "MASTER_PORT": str(spec.master_port),
        "HOSTFILE_PREFIX": shlex.quote(spec.run_dir.rstrip("/") + "/hostfile.slurm-"),
        "GPUS_PER_NODE": str(spec.gpus_per_node),
        "EXPORTS": exports,
        "NODE_COMMAND": shlex.quote(inner),
    }
    text = template("slurm", "deepspeed.sbatch").read_text(encoding="utf-8")
    # One pass over the placeholders, so a value that happens to contain "@NAME@" is left alone.
    return re.sub(r"@([A-Z_]+)@", lambda m: values[m.group(1)], text)
