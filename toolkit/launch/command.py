"""Build the deepspeed runner's (or torchrun's) command line, as a list of arguments.

dstk never starts ranks itself: ``plan_launch(spec)`` is a pure function from a ``LaunchSpec``
to the runner command, the environment it needs and the files to write next to it; it checks
the spec against the plan first (world size, nodes, slots per node) and refuses what the runner
would get wrong silently (docs/launch.md lists each case). Quoting for a shell happens only at
the edge, in ``shell_join``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import sys

from dstk.errors import DstkError
from dstk.launch.env import check_key, check_value, render_deepspeed_env
from dstk.launch.hosts import Host, parse_filter, apply_filters, is_valid_hostname, render_hostfile

LAUNCHERS = ("local", "pdsh", "openmpi", "mpich", "slurm", "torchrun")
"""``local``: the runner on this machine only; ``pdsh``/``openmpi``/``mpich``/``slurm``: the runner's
multi-node backends (``--launcher``); ``torchrun``: ``python -m torch.distributed.run`` per node."""
MULTI_NODE_LAUNCHERS = ("pdsh", "openmpi", "mpich", "slurm")
RANK_MODULE = "dstk.launch.rank"
"""The per-rank wrapper that prefixes output with the rank and reports how the rank ended."""
RANK_EXEC_FLAG = "--exec"
"""``RANK_MODULE --exec [-m] SCRIPT ...``: the wrapper only sets the torch.distributed variables of a rank srun
started and ``exec``s the script (no prefix, no report): ``--launcher slurm --no-prefix``."""
REPORT_TAG = "DSTK_RANK_EXIT "
"""Starts the line on which the wrapper reports how its rank ended (JSON follows)."""
SRUN_MASTER_VARS = (("MASTER_ADDR", "DSTK_MASTER_ADDR"), ("MASTER_PORT", "DSTK_MASTER_PORT"))
"""(torch's variable, the variable dstk passes it in) for ``--launcher slurm``: the runner's srun backend
drops ``--master_addr``/``--master_port``, so dstk puts them in the runner's environment, srun
(``--export=ALL``) hands them to every rank, and ``dstk.launch.rank`` sets torch's variables from them."""


class ShellVar(str):
    """An argument that a generated shell script must expand (``"$NAME"``) instead of quoting.

    Its text is ``$NAME`` so a command holding one still prints sensibly; ``shell_join`` is the
    one place that treats it differently."""

    def __new__(cls, name: str) -> "ShellVar":
        if not name.isidentifier():
            raise ValueError(f"name: not a shell variable name: {name!r}")
        return super().__new__(cls, f"${name}")


def shell_join(argv: list[str]) -> str:
    """Quote a command for a POSIX shell; ``ShellVar`` arguments become ``"$NAME"``."""
    return " ".join(f'"{a}"' if isinstance(a, ShellVar) else shlex.quote(a) for a in argv)


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class LaunchSpec:
    """Everything needed to start one training job; built from a run directory by ``spec_from_run_dir``."""

    script: str
    """The training script (a path), or a module name when ``module`` is set."""
    script_args: tuple[str, ...] = ()
    """Arguments for the script, passed through unchanged."""
    module: bool = False
    """Run ``script`` as ``python -m script``."""
    num_nodes: int = 1
    """Nodes in the plan (``cluster.num_nodes``)."""
    gpus_per_node: int = 1
    """Ranks per node (``cluster.gpus_per_node``; CPU ranks when ``cpu``)."""
    hosts: tuple[Host, ...] = ()
    """The hosts, in rank order; empty means this machine only."""
    hostfile: str | None = None
    """Path of the hostfile passed to the runner (needed whenever ``hosts`` is not empty)."""
    write_hostfile: bool = False
    """Write ``hosts`` to ``hostfile`` before launching (they came from ``--hosts``, not a file)."""
    include: str = ""
    """The runner's ``--include`` filter (``NAME[:SLOT,...][@NAME...]``)."""
    exclude: str = ""
    """The runner's ``--exclude`` filter."""
    launcher: str = "local"
    """One of ``LAUNCHERS``."""
    master_addr: str | None = None
    """Rendezvous host; defaults to the first active host (127.0.0.1 for a local run)."""
    master_port: int = 29500
    """Rendezvous TCP port."""
    node_rank: int | None = None
    """Start only this node's ranks, without ssh (``--no_ssh --node_rank``; torchrun's ``--node_rank``):
    every node runs the same command with its own rank."""
    env: tuple[tuple[str, str], ...] = ()
    """Variables for every rank, in order (NCCL profile first, then ``--env``)."""
    ds_config: str | None = None
    """DeepSpeed config path, passed to the script as ``config_arg PATH``."""
    config_arg: str | None = "--deepspeed_config"
    """The script flag that takes the config path; ``None`` passes nothing."""
    python: str = sys.executable
    """The interpreter for the runner (pdsh runs the same path on every node)."""
    prefix_output: bool = True
    """Start each rank through ``dstk.launch.rank``: rank-prefixed output and an exit report per rank."""
    cpu: bool = False
    """The plan is for CPU ranks (gloo), ``cluster.gpu == "cpu"``."""
    run_dir: str | None = None
    """The run directory (files such as ``.deepspeed_env`` are written there)."""
    run_tag: str | None = None
    """This launch's unique tag, given to every launcher process and rank as ``PYTHON_DSTK_RUN_TAG``
    (``dstk.launch.nodefail``: how a failed node's launch stops the ranks of every node); ``run_launch``
    makes one."""
    launcher_args: str = ""
    """The runner's ``--launcher_args``: flags for the multi-node backend's command (pdsh, mpirun, srun),
    one shell-quoted string (the runner ``shlex.split``s it). For ``slurm`` dstk adds
    ``--kill-on-bad-exit=1`` unless these set ``-K``/``--kill-on-bad-exit`` themselves
    (``slurm_launcher_args``)."""

    def __post_init__(self) -> None:
        if self.launcher not in LAUNCHERS:
            raise ValueError(f"launcher: expected one of {', '.join(LAUNCHERS)}, got {self.launcher!r}")
        for name in ("num_nodes", "gpus_per_node"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: expected a positive integer, got {value!r}")
        if not (isinstance(self.master_port, int) and 1 <= self.master_port <= 65535):
            raise ValueError(f"master_port: expected 1..65535, got {self.master_port!r}")
        if not self.script:
            raise ValueError("script: empty")
        if self.run_tag is not None and not re.fullmatch(r"[0-9a-f]{8,64}", self.run_tag):
            raise ValueError(f"run_tag: expected 8-64 hex digits, got {self.run_tag!r}")
        object.__setattr__(self, "script_args", tuple(self.script_args))
        object.__setattr__(self, "hosts", tuple(self.hosts))
        env = self.env.items() if isinstance(self.env, dict) else self.env
        object.__setattr__(self, "env", tuple((str(k), str(v)) for k, v in env))

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.gpus_per_node


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class LaunchPlan:
    """What ``run_launch`` will do: run ``command`` with ``env`` added, after writing ``files``."""

    command: list[str]
    """The argv to run (no shell)."""
    env: dict[str, str]
    """Variables added to this process's environment for the command."""
    files: dict[str, str]
    """Files to write first: {path: text}."""
    active: dict[str, list[int]]
    """The runner's view of the resources: {host: slot ids}."""


KILL_ON_BAD_EXIT = "--kill-on-bad-exit=1"
"""What dstk adds to srun under ``--launcher slurm``: one rank that exits non-zero ends the whole step,
instead of the others waiting in their next collective until the process group's timeout (srun(1),
``-K, --kill-on-bad-exit[=0|1]``; the sbatch script of ``dstk launch --slurm`` passes it too)."""

_KILL_FLAG_RE = re.compile(r"(-K[01]?|--kill-on-bad-exit(=.*)?)")


def slurm_launcher_args(user_args: str, *, environ_kill: str | None = None) -> str:
    """The runner's ``--launcher_args`` for its srun backend (pure): ``user_args`` with ``KILL_ON_BAD_EXIT``
    added, unless they set ``-K``/``--kill-on-bad-exit`` themselves (kept as given). ``environ_kill``:
    ``$SLURM_KILL_ON_BAD_EXIT``, which srun reads but a flag overrides; it becomes the flag
    (``--kill-on-bad-exit=VALUE``), so the user's choice is what srun sees, in the logged command too.

    multinode_runner.py ``SlurmRunner.get_cmd`` (0.19.8): ``['srun', '-n', N] + shlex.split(launcher_args)``."""
    try:
        words = shlex.split(user_args)
    except ValueError as exc:
        raise DstkError(f"launcher args {user_args!r}: {exc}", hint="quote them as for a POSIX shell") from None
    if any(_KILL_FLAG_RE.fullmatch(w) for w in words):
        return user_args
    if environ_kill is not None:
        if environ_kill not in ("0", "1"):
            raise DstkError(f"SLURM_KILL_ON_BAD_EXIT={environ_kill!r}: srun takes 0 or 1",
                            hint="set it to 1 (one failed rank ends the step) or 0, or unset it (dstk then passes "
                                 f"{KILL_ON_BAD_EXIT})")
        flag = f"--kill-on-bad-exit={environ_kill}"
    else:
        flag = KILL_ON_BAD_EXIT
    return shlex.join([*words, flag])


def check_spec(spec: LaunchSpec) -> dict[str, list[int]]:
    """Check the spec against its plan and the launcher's rules; return the active {host: slots}."""
    for key, value in spec.env:
        check_key(key)
        check_value(key, value)
    if spec.launcher_args and (spec.launcher not in MULTI_NODE_LAUNCHERS or spec.node_rank is not None):
        raise DstkError(f"launcher args {spec.launcher_args!r} need a multi-node launcher: --launcher {spec.launcher}"
                        + (" with --node-rank" if spec.node_rank is not None else "") + " starts no pdsh/mpirun/srun",
                        hint="drop them, or use --launcher pdsh/openmpi/mpich/slurm")
    if spec.master_addr is not None and not is_valid_hostname(spec.master_addr):
        raise DstkError(f"--master-addr {spec.master_addr!r} is not a host name or IPv4 address",
                        hint="give a plain host name or address, e.g. 10.0.0.1")
    if not spec.hosts:
        if spec.exclude:
            raise DstkError("--exclude without hosts: dstk cannot count this machine's devices to check it",
                            hint="select the devices with --include localhost:0,1,...")
        if spec.include:
            # Without hosts the runner calls this machine localhost; the filter picks its devices,
            # which only the runner can count, so check the number picked against the plan.
            picked = parse_filter(spec.include, "--include")
            if set(picked) != {"localhost"} or picked["localhost"] is None:
                raise DstkError(f"--include {spec.include!r}: without hosts, select devices as localhost:0,1,...",
                                hint="or pass --hostfile/--hosts to filter hosts")
            active = {"localhost": picked["localhost"]}
            if len(active["localhost"]) != spec.gpus_per_node:
                raise DstkError(f"--include {spec.include!r} selects {len(active['localhost'])} device(s), "
                                f"but the plan has {spec.gpus_per_node} per node",
                                hint=f"select {spec.gpus_per_node} devices, or regenerate the plan")
        else:
            active = {"localhost": list(range(spec.gpus_per_node))}
        # Inside a Slurm allocation the hosts are Slurm's: the runner still reads them from a hostfile.
        from_slurm = (f"; inside the Slurm allocation: scontrol show hostnames \"$SLURM_JOB_NODELIST\" | sed "
                      f"'s/$/ slots={spec.gpus_per_node}/' > hosts, then --hostfile hosts"
                      if spec.launcher == "slurm" else "")
        if spec.num_nodes != 1:
            raise DstkError(f"the plan is for {spec.num_nodes} nodes, but no hosts were given",
                            hint="pass --hostfile FILE or --hosts h1:N,h2:N with one host per node" + from_slurm)
        if spec.launcher in MULTI_NODE_LAUNCHERS:
            raise DstkError(f"--launcher {spec.launcher} needs hosts", hint="pass --hostfile or --hosts" + from_slurm)
        if spec.node_rank not in (None, 0):
            raise DstkError(f"--node-rank {spec.node_rank} needs a host list with that many nodes",
                            hint="pass --hostfile or --hosts")
    else:
        if spec.hostfile is None:
            raise DstkError("hosts were given without a hostfile path")
        active = apply_filters(spec.hosts, include=spec.include, exclude=spec.exclude)
        if len(active) != spec.num_nodes:
            raise DstkError(
                f"the plan is for {spec.num_nodes} node(s), but the host list{' after filtering' if spec.include or spec.exclude else ''} "
                f"has {len(active)}: {', '.join(active) or 'none'}",
                hint=f"give {spec.num_nodes} host(s), or regenerate the plan with `dstk generate INTENT --nodes {len(active)}`")
        wrong = {h: len(s) for h, s in active.items() if len(s) != spec.gpus_per_node}
        if wrong:
            listed = ", ".join(f"{h} has {n}" for h, n in wrong.items())
            raise DstkError(f"the plan has {spec.gpus_per_node} GPU(s) per node, but {listed} slot(s)",
                            hint=f"set slots={spec.gpus_per_node} for every host, or regenerate the plan for this cluster")
        if spec.launcher in ("openmpi", "mpich") and (spec.include or spec.exclude):
            raise DstkError(f"--launcher {spec.launcher} cannot apply --include/--exclude (the runner refuses it)",
                            hint="write a hostfile with just the hosts and slots to use")
        if spec.launcher == "slurm" and any(s != list(range(len(s))) for s in active.values()):
            raise DstkError("--launcher slurm cannot pick single slots: it starts the first N slots of whole hosts",
                            hint="filter whole hosts, or use --slurm (an sbatch script) instead")
        if spec.node_rank is not None:
            if spec.launcher not in ("local", "torchrun"):
                raise DstkError(f"--node-rank starts one node without ssh; it does not combine with --launcher {spec.launcher}",
                                hint="drop --launcher (or use --launcher torchrun)")
            if not 0 <= spec.node_rank < len(active):
                raise DstkError(f"--node-rank {spec.node_rank} is out of range for {len(active)} node(s)",
                                hint=f"use 0..{len(active) - 1}")
        elif spec.launcher in ("local", "torchrun"):
            raise DstkError(f"{len(active)} host(s) given, but --launcher {spec.launcher} starts one node",
                            hint="pick a multi-node launcher (pdsh, openmpi, mpich, slurm), or pass --node-rank N "
                                 "on every node to start it without ssh")
    return active


# pdsh joins the remote command with spaces for a remote shell; the runner only wraps arguments
# that hold a space in "..." (where $ ` \ still expand), so anything else must be inert there.
_PDSH_SAFE_RE = re.compile(r"[\w@%+=:,./^ -]*")


def check_pdsh_words(words: list[str]) -> None:
    """Refuse words a pdsh launch would hand to the remote shell unquoted (or in double quotes)."""
    for word in words:
        if not _PDSH_SAFE_RE.fullmatch(word):
            bad = sorted({c for c in word if not _PDSH_SAFE_RE.fullmatch(c)})
            raise DstkError(
                f"{word!r} holds {' '.join(repr(c) for c in bad)}: with --launcher pdsh the runner passes the script, "
                "its arguments, the interpreter and the working directory through a remote shell without quoting them",
                hint="use plain arguments (letters, digits, spaces and @%+=:,./^-), put the value in a file, "
                     "or use --launcher openmpi/mpich/slurm or --slurm, which pass arguments without a shell")


def _script_part(spec: LaunchSpec, *, torchrun: bool) -> list[str]:
    """The module/script and its arguments, as the runner (or torchrun) takes them after its own flags."""
    args = list(spec.script_args)
    if spec.ds_config and spec.config_arg and not any(a == spec.config_arg or a.startswith(spec.config_arg + "=")
                                                      for a in args):
        args += [spec.config_arg, spec.ds_config]
    if spec.prefix_output:
        inner = (["-m"] if spec.module else []) + [spec.script, *args]
        return (["-m", RANK_MODULE] if torchrun else ["--module", RANK_MODULE]) + inner
    if spec.module:
        return (["-m"] if torchrun else ["--module"]) + [spec.script, *args]
    return [spec.script, *args]


def _srun_script_part(script_part: list[str]) -> list[str]:
    """The runner's script part for its srun backend (pure). SlurmRunner.get_cmd (multinode_runner.py 0.19.8)
    runs ``srun ... PYTHON -u USER_SCRIPT ARGS`` and drops the runner's ``--module``: ``-u dstk.launch.rank``
    would be a missing file (seen under Slurm 22.05: exit 2, no rank started). So a module goes in as
    ``-- -m MODULE ARGS``: after ``--`` the runner's argparse takes ``-m`` for the script and the rest as
    its arguments, and srun runs ``PYTHON -u -m MODULE ARGS``."""
    if script_part[:1] != ["--module"]:
        return script_part
    return ["--", "-m", *script_part[1:]]


def _master_addr(spec: LaunchSpec, active: dict[str, list[int]]) -> str:
    if spec.master_addr:
        return spec.master_addr
    return "127.0.0.1" if not spec.hosts else next(iter(active))


def plan_launch(spec: LaunchSpec) -> LaunchPlan:
    """The command, environment and files for ``spec`` (pure: reads and writes nothing)."""
    active = check_spec(spec)
    env = dict(spec.env)
    files: dict[str, str] = {}
    master = _master_addr(spec, active)
    extra_env: dict[str, str] = {}
    if spec.run_tag is not None:
        from dstk.launch.nodefail import RUN_TAG_VAR

        # In the runner's environment: it exports PYTHON* variables to every node (dstk.launch.nodefail).
        extra_env[RUN_TAG_VAR] = spec.run_tag
    if spec.hosts and spec.write_hostfile:
        files[spec.hostfile] = render_hostfile(spec.hosts)

    if spec.launcher == "torchrun":
        cmd = [spec.python, "-u", "-m", "torch.distributed.run",
               "--nnodes", str(spec.num_nodes), "--nproc_per_node", str(spec.gpus_per_node),
               "--node_rank", str(spec.node_rank or 0),
               "--master_addr", master, "--master_port", str(spec.master_port),
               "--max_restarts", "0"]
        cmd += _script_part(spec, torchrun=True)
        extra_env.update(env)
    else:
        cmd = [spec.python, "-u", "-m", "deepspeed.launcher.runner"]
        if not spec.hosts:
            # --num_gpus is not checked against the device count, so it also gives N CPU ranks.
            if spec.include:
                cmd += ["--include", spec.include]
            else:
                cmd += ["--num_gpus", str(spec.gpus_per_node)]
            cmd += ["--master_port", str(spec.master_port)]
            extra_env.update(env)
        else:
            # Always --master_addr: without it the runner ssh's to the first host to find one,
            # even with --no_ssh or --launcher slurm.
            cmd += ["--hostfile", spec.hostfile, "--master_addr", master, "--master_port", str(spec.master_port)]
            if spec.include:
                cmd += ["--include", spec.include]
            if spec.exclude:
                cmd += ["--exclude", spec.exclude]
            if spec.node_rank is not None:
                # No-ssh mode runs launch.py on this node only; .deepspeed_env is not read there.
                cmd += ["--no_ssh", "--node_rank", str(spec.node_rank)]
                extra_env.update(env)
            else:
                # --force_multi: a single remote host would otherwise be started on *this* machine.
                cmd += ["--launcher", spec.launcher, "--force_multi"]
                launcher_args = (slurm_launcher_args(spec.launcher_args) if spec.launcher == "slurm"
                                 else spec.launcher_args)
                if launcher_args:
                    # one word: argparse takes a separate value that starts with "-" for a flag of its own
                    cmd.append(f"--launcher_args={launcher_args}")
                if spec.launcher == "slurm":
                    # srun reaches the nodes through slurmd; the runner's ssh check of the first host
                    # (runner.py: `ssh HOST hostname`) fails where a cluster allows no ssh to its nodes
                    cmd.append("--no_ssh_check")
                    # SlurmRunner.get_cmd passes no master address/port to srun: the ranks read them here
                    extra_env.update({ours: value for (_, ours), value in zip(
                        SRUN_MASTER_VARS, (master, str(spec.master_port)))})
                if env:
                    if spec.run_dir is None:
                        raise DstkError("--env with a multi-node launcher needs a run directory for .deepspeed_env")
                    path = os.path.join(os.path.abspath(spec.run_dir), ".deepspeed_env")
                    files[path] = render_deepspeed_env(env, launcher=spec.launcher)
                    # An absolute DS_ENV_FILE makes the runner read exactly this file.
                    extra_env["DS_ENV_FILE"] = path
        script_part = _script_part(spec, torchrun=False)
        if spec.launcher == "slurm" and spec.hosts and spec.node_rank is None:
            if not spec.prefix_output:
                # srun's ranks still need the wrapper's RANK/WORLD_SIZE/MASTER_ADDR/... (dstk.launch.rank)
                inner = ["-m", *script_part[1:]] if script_part[:1] == ["--module"] else script_part
                script_part = ["--module", RANK_MODULE, RANK_EXEC_FLAG, *inner]
            script_part = _srun_script_part(script_part)
        if spec.launcher == "pdsh" and spec.hosts and spec.node_rank is None:
            check_pdsh_words([spec.python, *script_part])
        cmd += script_part
    return LaunchPlan(command=cmd, env=extra_env, files=files, active=active)


def shell_command(plan: LaunchPlan) -> str:
    """The plan as one POSIX shell line (``K=V ... argv``), to copy and run by hand."""
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in plan.env.items())
    return f"{prefix} {shell_join(plan.command)}" if prefix else shell_join(plan.command)


def build_command(spec: LaunchSpec) -> list[str]:
    """The runner (or torchrun) argv for ``spec``; pure, checked against the plan first."""
    return plan_launch(spec).command
