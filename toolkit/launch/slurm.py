"""An sbatch script for a ``LaunchSpec`` (``dstk launch --slurm``), from ``templates/slurm/``.

One task per node (``--ntasks-per-node=1``); each task runs the deepspeed runner with
``--no_ssh --node_rank $SLURM_NODEID`` (or torchrun with ``--node_rank``), the master is the
first host of ``$SLURM_JOB_NODELIST`` -- the "no-ssh per node under srun" pattern of
research/launching.md section 4. Per-task values must be expanded inside the task, never in
the batch script (every rank thinks it is rank 0 otherwise: accelerate#2816), so the node
command is quoted twice: each argument for the inner ``bash -c``, then the whole string once
more for the outer script. Nothing from the user reaches either shell unquoted.

Each task runs its node's command under ``python -m dstk.launch.slurm --ranks N -- CMD`` (``node_main``):
the judge ``dstk launch`` applies to a local run, for the ranks of one node. Without it a job whose rank
was SIGKILLed ends with exit 247 (launch.py's ``sys.exit(-9)``, seen under Slurm 22.05) and nothing names
the rank, and one whose launch.py was killed ends COMPLETED (the runner exits 0 then: runner.py 0.19.8,
``if result.returncode > 0``). The judge reads the ranks' ``DSTK_RANK_EXIT`` reports, prints
``dstk: rank R on HOST ...`` and the cause into the job's output, and exits with the failed rank's code
(137 for SIGKILL), so the job ends FAILED and names the rank.
Relative paths in the script part are relative to the directory ``dstk launch --slurm`` ran in
(``workdir``): the script ``cd``s there, as pdsh's remote command does, since sbatch starts a job in
the directory it was *submitted* from.
"""

from __future__ import annotations

import argparse
import re
import shlex
import signal
import socket
import sys

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


NODE_MODULE = "dstk.launch.slurm"
"""Runs one node's launcher command and judges its ranks' reports (``node_main``)."""


def node_command(spec: LaunchSpec) -> list[str]:
    """The argv every Slurm task runs, with ``ShellVar`` placeholders for the per-task values: the runner
    (or torchrun) for this node, under ``NODE_MODULE`` when the ranks report (``prefix_output``)."""
    launcher = _launcher_command(spec)
    if not spec.prefix_output:
        return launcher
    judge = [spec.python, "-u", "-m", NODE_MODULE, "--ranks", str(spec.gpus_per_node)]
    if spec.run_dir is not None:
        judge += ["--run-dir", spec.run_dir]
    return [*judge, "--", *launcher]


def _launcher_command(spec: LaunchSpec) -> list[str]:
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


SIGNAL_SECONDS = 120
"""``#SBATCH --signal=USR1@120``: SIGUSR1 to every process of the job's steps 120 s before its time limit (sbatch(1)
``--signal``; without ``B:`` the batch shell is not signalled). ``dstk finetune``'s ranks save a checkpoint at the
end of their step on it (``dstk.train.worker.StopRequest``); ``node_main`` keeps it from the runner, launch.py and
the rank wrappers, whose default action on SIGUSR1 is to die. Two minutes: a step and a save of a large model
(the ranks print how long theirs took)."""


def render_sbatch(spec: LaunchSpec, *, sbatch_path: str, job_name: str = "dstk", partition: str | None = None,
                  time: str | None = None, account: str | None = None, workdir: str | None = None,
                  signal_seconds: int = SIGNAL_SECONDS) -> str:
    """The sbatch script text (pure). ``workdir``: the directory the job ``cd``s to before starting
    (the one relative script paths are relative to; ``dstk launch --slurm`` passes its own); ``None``
    leaves the job where sbatch started it. ``signal_seconds``: how long before the time limit the job's
    steps get SIGUSR1 (``SIGNAL_SECONDS``)."""
    if not isinstance(signal_seconds, int) or signal_seconds < 1:
        raise DstkError(f"signal_seconds {signal_seconds!r}: the seconds before the time limit must be a whole "
                        "number of at least 1", hint=f"use {SIGNAL_SECONDS}: a step plus a checkpoint save")
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
        "SIGNAL_SECONDS": str(signal_seconds),
        "SBATCH_EXTRA": "\n".join(extra) if extra else "# (no GPUs: CPU ranks on gloo)",
        "MASTER_PORT": str(spec.master_port),
        "HOSTFILE_PREFIX": shlex.quote(spec.run_dir.rstrip("/") + "/hostfile.slurm-"),
        "GPUS_PER_NODE": str(spec.gpus_per_node),
        "EXPORTS": exports,
        "NODE_COMMAND": shlex.quote(inner),
        "WORKDIR": (f"cd {shlex.quote(workdir)}" if workdir is not None
                    else "# (no directory given: they start from where sbatch runs)"),
    }
    text = template("slurm", "deepspeed.sbatch").read_text(encoding="utf-8")
    # One pass over the placeholders, so a value that happens to contain "@NAME@" is left alone.
    return re.sub(r"@([A-Z_]+)@", lambda m: values[m.group(1)], text)


_SRUN_TASKS_RE = re.compile(r"^srun: error: (?P<host>[^\s:]+): tasks? (?P<tasks>[0-9][0-9,-]*): (?P<what>.+?)\s*$")
_SRUN_EXITED_RE = re.compile(r"Exited with exit code (\d+)")
_SRUN_STOPS = ("_step_signal: Terminating StepId", "CANCELLED AT", "Force Terminated")
"""srun's lines saying it is ending the step itself (--kill-on-bad-exit, scancel, the time limit)."""


def _task_numbers(text: str) -> list[int] | None:
    """srun's task list (``0``, ``0-1``, ``0,2-3``) -> [0, 2, 3] (pure); None when malformed."""
    out: list[int] = []
    for part in text.split(","):
        first, sep, last = part.partition("-")
        if not first.isdigit() or (sep and not last.isdigit()):
            return None
        out.extend(range(int(first), int(last if sep else first) + 1))
    return out


def srun_task_exits(lines) -> list:
    """How srun says the step's tasks ended, from its output lines (pure), as ``RankExit``s in the order
    srun printed them: ``srun: error: HOST: task 1: Exited with exit code 3``, ``... tasks 0-1:
    Terminated`` (the signal's ``strsignal`` text, perhaps with `` (core dumped)``). A task that ended
    after srun said it was ending the step (``_step_signal: Terminating StepId``, ``CANCELLED AT``)
    is ``stopped``: it did not fail on its own. With ``--no-prefix`` no rank wrapper reports, and
    srun's own exit code is the largest of its tasks' (143 for the tasks it terminated), so these
    lines are what names the rank that failed first."""
    from dstk.launch.run import RankExit

    by_text = {}
    for sig in signal.Signals:
        text = signal.strsignal(sig)
        if text:
            by_text.setdefault(text, int(sig))
    out, stopping = [], False
    for line in lines:
        line = line.rstrip("\n")
        if any(mark in line for mark in _SRUN_STOPS):
            stopping = True
            continue
        m = _SRUN_TASKS_RE.match(line)
        if m is None:
            continue
        tasks = _task_numbers(m.group("tasks"))
        what = m.group("what").removesuffix(" (core dumped)")
        exited = _SRUN_EXITED_RE.fullmatch(what)
        code = int(exited.group(1)) if exited else -by_text[what] if what in by_text else None
        if tasks is None or code is None:
            continue
        out += [RankExit(rank=t, returncode=code, host=m.group("host"), stopped=stopping) for t in tasks]
    return out


def node_main(argv: list[str] | None = None) -> int:
    """``python -m dstk.launch.slurm --ranks N [--run-dir DIR] -- CMD...``: run one node's launcher
    command, stream its output, then judge this node's ranks as ``dstk launch --node-rank`` does: print
    ``dstk: rank R on HOST ...`` for each failure and the cause (``dstk.launch.diagnose``), and exit with
    the failed rank's code (128 + N for signal N), or 1 when fewer than N ranks reported."""
    import dataclasses

    from dstk.errors import DstkError
    from dstk.launch.command import LaunchPlan
    from dstk.launch.run import _default_sink, explain_failure, run_plan

    parser = argparse.ArgumentParser(prog=f"python -m {NODE_MODULE}", description=node_main.__doc__.split(".")[0])
    parser.add_argument("--ranks", type=int, required=True, help="ranks this node starts")
    parser.add_argument("--run-dir", default=None, help="run directory (its plan.json informs the cause)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the runner or torchrun command")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or args.ranks < 1:
        parser.error("expected --ranks N (N >= 1) and a command after --")
    # srun stops a task with SIGTERM (scancel, --kill-on-bad-exit, the time limit): run_plan then hands
    # SIGINT to the runner, which stops its ranks, and kills it after 30 s.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    # The sbatch script's `--signal=USR1@N` reaches every process of the step: ignored here and, inherited
    # through exec, by the runner, launch.py and the rank wrappers (their default action is to die); the
    # ranks of `dstk finetune` set their own handler and save a checkpoint (dstk.train.worker.StopRequest).
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    sink = _default_sink
    try:
        result = run_plan(LaunchPlan(command=command, env={}, files={}, active={}), world_size=0,
                          expect_reports=True, sink=sink)
    except KeyboardInterrupt:
        sink("stderr", "dstk: stopped by a signal (scancel, a time limit, or another node failed)\n")
        return 128 + signal.SIGTERM
    except DstkError as exc:  # this node's own problem (a stale op-build lock in its cache): say which node
        sink("stderr", f"dstk: on {socket.gethostname()}: " + exc.render().replace("\n", "\ndstk: ") + "\n")
        return exc.exit_code
    if len(result.ranks) < args.ranks:
        lost = args.ranks - len(result.ranks)
        result = dataclasses.replace(result, returncode=result.returncode or 1,
                                     messages=result.messages + (f"{lost} rank(s) of this node did not report how they ended",))
    for message in result.messages:
        sink("stderr", f"dstk: {message}\n")
    if result.returncode == 0:
        ranks = ", ".join(str(r.rank) for r in sorted(result.ranks, key=lambda r: (r.rank is None, r.rank or 0)))
        sink("stdout", f"dstk: rank(s) {ranks} on {socket.gethostname()} finished\n")
    else:
        for found in explain_failure(result, run_dir=args.run_dir):
            sink("stderr", "dstk: " + found.render().replace("\n", "\ndstk: ") + "\n")
    return result.returncode


if __name__ == "__main__":
    sys.exit(node_main())
