"""``dstk launch``: run a run directory on the deepspeed runner (or torchrun), or write an sbatch script."""

from __future__ import annotations

import argparse
import json
import os
import sys

from dstk.errors import UsageError

HELP = "run a run directory's plan on the deepspeed runner (or write a Slurm script)"
DESCRIPTION = (
    "Build the deepspeed runner's command from RUN_DIR/plan.json and ds_config.json, check it against the plan "
    "(world size, nodes, slots per host, hostfile lines), write the hostfile and .deepspeed_env it needs, and run "
    "it with each rank's output prefixed by its rank. Exits non-zero when any rank fails or is killed by a signal "
    "(128 + the signal number), and says which. Everything after `--` is the training script and its arguments; "
    "the script also gets `--deepspeed_config RUN_DIR/ds_config.json` unless --config-arg none."
)


def _split_dashes(parser: argparse.ArgumentParser) -> None:
    # argparse cannot tell an optional RUN_DIR from the script; take everything after the first
    # `--` as the script and its arguments before argparse sees it.
    original = parser.parse_known_args

    def parse_known_args(args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        head, tail = (args[: args.index("--")], args[args.index("--") + 1:]) if "--" in args else (args, [])
        ns, extra = original(head, namespace)
        ns.script_argv = tail
        return ns, extra

    parser.parse_known_args = parse_known_args


def configure(parser: argparse.ArgumentParser) -> None:
    from dstk.launch.command import LAUNCHERS
    from dstk.launch.env import NCCL_PROFILES

    parser.add_argument("run_dir", nargs="?", default=".", metavar="RUN_DIR",
                        help="run directory written by `dstk generate` (default: .)")
    hosts = parser.add_mutually_exclusive_group()
    hosts.add_argument("--hostfile", metavar="FILE", help="hostfile: one 'HOST slots=N' per line")
    hosts.add_argument("--hosts", metavar="H:N,...", help="hosts and slots, e.g. worker-0:8,worker-1:8 "
                       "(written to RUN_DIR/hostfile)")
    filters = parser.add_mutually_exclusive_group()
    filters.add_argument("--include", default="", metavar="SPEC", help="runner --include: NAME[:SLOT,...][@NAME...]")
    filters.add_argument("--exclude", default="", metavar="SPEC", help="runner --exclude, same syntax")
    parser.add_argument("--launcher", choices=LAUNCHERS, default=None,
                        help="local (this machine), the runner's pdsh/openmpi/mpich/slurm backends, or torchrun "
                             "(default: local without hosts, pdsh with them)")
    parser.add_argument("--nccl-profile", choices=NCCL_PROFILES, default=None,
                        help="a set of NCCL variables, each commented in templates/nccl/; --env overrides them")
    parser.add_argument("--env", action="append", default=[], metavar="K=V", help="variable for every rank (repeat)")
    # The deepspeed runner's and torchrun's spellings (--master_addr) are accepted too.
    parser.add_argument("--master-addr", "--master_addr", default=None, metavar="HOST",
                        help="rendezvous host (default: the first host; 127.0.0.1 locally)")
    parser.add_argument("--master-port", "--master_port", type=port_number, default=None, metavar="PORT",
                        help="rendezvous port, 1-65535 (default: a port free on this machine now)")
    parser.add_argument("--node-rank", "--node_rank", type=int, default=None, metavar="N",
                        help="start only node N of the host list, without ssh; run the same command on every node")
    parser.add_argument("--module", action="store_true", help="the script is a module: run it as python -m")
    parser.add_argument("--config-arg", default="--deepspeed_config", metavar="FLAG",
                        help="script flag that receives the ds_config.json path ('none' to pass nothing)")
    parser.add_argument("--no-prefix", action="store_true",
                        help="start the script directly: no rank prefix and no per-rank exit report")
    parser.add_argument("--dry-run", action="store_true", help="print the command and files; run and write nothing")
    parser.add_argument("--format", choices=["human", "json"], default="human", help="output of --dry-run/--slurm")
    slurm = parser.add_argument_group("Slurm (--slurm writes an sbatch script instead of running)")
    slurm.add_argument("--slurm", action="store_true", help="write RUN_DIR/launch.sbatch (or --sbatch-out)")
    slurm.add_argument("--sbatch-out", metavar="FILE", default=None, help="where to write the sbatch script")
    slurm.add_argument("--job-name", default="dstk", help="#SBATCH --job-name")
    slurm.add_argument("--partition", default=None, help="#SBATCH --partition")
    slurm.add_argument("--time", default=None, help="#SBATCH --time, e.g. 1-00:00:00")
    slurm.add_argument("--account", default=None, help="#SBATCH --account")
    _split_dashes(parser)


def port_number(text: str) -> int:
    """An argparse type: a TCP port (argparse turns the ValueError into a usage error, exit 2)."""
    port = int(text)
    if not 1 <= port <= 65535:
        raise ValueError(text)
    return port


port_number.__name__ = "port (1-65535)"


def _spec(args: argparse.Namespace):
    from dstk.launch.env import parse_assignment
    from dstk.launch.rundir import spec_from_run_dir

    argv = getattr(args, "script_argv", [])
    if not argv:
        raise UsageError("no training script given", hint="put it after `--`: dstk launch RUN_DIR -- train.py --epochs 1")
    env = dict(parse_assignment(item) for item in args.env)
    return spec_from_run_dir(
        args.run_dir, script=argv[0], script_args=argv[1:], module=args.module,
        hostfile=args.hostfile, hosts=args.hosts, include=args.include, exclude=args.exclude,
        launcher=args.launcher, nccl_profile=args.nccl_profile, env=env,
        master_addr=args.master_addr, master_port=args.master_port, node_rank=args.node_rank,
        config_arg=None if args.config_arg.lower() == "none" else args.config_arg,
        prefix_output=not args.no_prefix,
    )


def _print_plan(plan, fmt: str, *, note: str) -> None:
    from dstk.launch.command import shell_command

    if fmt == "json":
        print(json.dumps({"command": plan.command, "env": plan.env, "files": plan.files, "note": note}, indent=2))
        return
    print(f"# {note}")
    for path, text in plan.files.items():
        print(f"# file {path}:")
        for line in text.splitlines():
            print(f"#   {line}")
    print(shell_command(plan))


def run(args: argparse.Namespace) -> int:
    from dstk.launch.command import plan_launch
    from dstk.launch.run import run_launch, write_atomic

    spec = _spec(args)
    if args.slurm:
        from dstk.launch.slurm import render_sbatch

        path = os.path.abspath(args.sbatch_out or os.path.join(spec.run_dir, "launch.sbatch"))
        text = render_sbatch(spec, sbatch_path=path, job_name=args.job_name, partition=args.partition,
                             time=args.time, account=args.account, workdir=os.getcwd())
        if args.dry_run:
            if args.format == "json":
                print(json.dumps({"files": {path: text}, "note": "dry run: nothing written"}, indent=2))
            else:
                print(f"# dry run: would write {path}:\n{text}", end="")
            return 0
        write_atomic(path, text)
        os.chmod(path, 0o755)
        print(f"wrote {path}\nnext: sbatch {path}")
        return 0
    plan = plan_launch(spec)
    if args.dry_run:
        _print_plan(plan, args.format, note="dry run: nothing written or started")
        return 0
    from dstk.errors import require_train_stack

    # The deepspeed runner and every rank import torch and deepspeed.
    require_train_stack("launch", modules=("torch", "deepspeed"))
    return run_launch(spec)
