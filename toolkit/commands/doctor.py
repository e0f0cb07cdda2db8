"""``dstk doctor``: versions, devices, ssh reachability, stale locks, and a timed all-reduce."""

from __future__ import annotations

import argparse
import json
import sys

from dstk.errors import UsageError

HELP = "preflight: versions, GPUs per host, ssh to every host, stale op locks, a timed all-reduce (bus bandwidth)"
DESCRIPTION = (
    "Check this host (torch, deepspeed, CUDA, NCCL, accelerator, device count) and, over ssh, every host of a "
    "hostfile; look for stale op-build locks; then start the ranks with the same runner command `dstk launch` "
    "would use and time an all-reduce, reported as nccl-tests does (algbw = bytes/time, busbw = algbw*2(n-1)/n), "
    "with the interface NCCL picked. Exit 1 when any check fails."
)


def configure(parser: argparse.ArgumentParser) -> None:
    from dstk.launch.command import LAUNCHERS
    from dstk.launch.env import NCCL_PROFILES

    parser.add_argument("run_dir", nargs="?", default=None, metavar="RUN_DIR",
                        help="run directory: check against its plan (nodes, GPUs per node)")
    hosts = parser.add_mutually_exclusive_group()
    hosts.add_argument("--hostfile", metavar="FILE")
    hosts.add_argument("--hosts", metavar="H:N,...")
    parser.add_argument("--num-ranks", type=int, default=None, metavar="N",
                        help="ranks on this machine without a run directory (default: its GPUs, or 2 CPU ranks)")
    parser.add_argument("--launcher", choices=LAUNCHERS, default=None)
    parser.add_argument("--nccl-profile", choices=NCCL_PROFILES, default=None)
    parser.add_argument("--env", action="append", default=[], metavar="K=V")
    parser.add_argument("--master-addr", default=None)
    parser.add_argument("--master-port", type=int, default=None)
    parser.add_argument("--sizes", default="1M,8M", help="all-reduce sizes (K/M/G suffixes), default 1M,8M")
    parser.add_argument("--iters", type=int, default=5, help="timed iterations per size (after 2 warm-up)")
    parser.add_argument("--no-allreduce", action="store_true", help="skip the all-reduce")
    parser.add_argument("--format", choices=["human", "json"], default="human")


def _spec(args: argparse.Namespace, local_devices: int | None, cpu_here: bool):
    from dstk.launch.command import LaunchSpec
    from dstk.launch.env import load_profile, parse_assignment
    from dstk.launch.hosts import parse_hosts_flag
    from dstk.launch.rundir import free_port, load_hostfile, spec_from_run_dir

    env = dict(parse_assignment(item) for item in args.env)
    if args.run_dir is not None:
        return spec_from_run_dir(args.run_dir, script="dstk.launch.allreduce", module=True, hostfile=args.hostfile,
                                 hosts=args.hosts, launcher=args.launcher, nccl_profile=args.nccl_profile, env=env,
                                 master_addr=args.master_addr, master_port=args.master_port, config_arg=None)
    merged = {**(load_profile(args.nccl_profile) if args.nccl_profile else {}), **env}
    port = args.master_port or free_port()
    if args.hostfile or args.hosts:
        host_list = load_hostfile(args.hostfile) if args.hostfile else parse_hosts_flag(args.hosts)
        slots = {h.num_slots for h in host_list}
        if len(slots) != 1:
            raise UsageError("hosts with different slot counts: give a RUN_DIR whose plan says the GPUs per node")
        import os

        # A hostfile from --hosts is written by the benchmark launch into its own temporary directory.
        path = os.path.abspath(args.hostfile) if args.hostfile else "hostfile"
        return LaunchSpec(script="dstk.launch.allreduce", module=True, num_nodes=len(host_list),
                          gpus_per_node=slots.pop(), hosts=tuple(host_list), hostfile=path,
                          write_hostfile=not args.hostfile, launcher=args.launcher or "pdsh",
                          master_addr=args.master_addr, master_port=port, env=merged, config_arg=None, cpu=cpu_here)
    ranks = args.num_ranks or (local_devices if not cpu_here and local_devices else 2)
    if cpu_here and "OMP_NUM_THREADS" not in merged:
        import os

        merged["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // ranks))
    return LaunchSpec(script="dstk.launch.allreduce", module=True, num_nodes=1, gpus_per_node=ranks,
                      launcher=args.launcher or "local", master_port=port, env=merged, config_arg=None, cpu=cpu_here)


def run(args: argparse.Namespace) -> int:
    from dstk.launch import doctor

    checks = []
    local = doctor.check_local()
    checks.append(local)
    info = local.data
    cpu_here = info.get("accelerator") == "cpu"
    spec = _spec(args, info.get("num_devices"), cpu_here)
    # Re-judge this host against the plan's GPUs per node now that the spec is known.
    if info:
        checks[0] = doctor._judge_probe("versions@localhost", info, expected_devices=spec.gpus_per_node, cpu=spec.cpu)
    checks.append(doctor.check_locks())
    if spec.hosts:
        checks += doctor.check_hosts(spec.hosts, python=spec.python, expected_devices=spec.gpus_per_node, cpu=spec.cpu)
    reachable = all(c.status != "fail" for c in checks if c.name.startswith(("ssh@", "versions@")) and c.name != "versions@localhost")
    if args.no_allreduce:
        pass
    elif checks[1].status == "fail":
        checks.append(doctor.Check(name="allreduce", status="skip", detail="skipped: a stale lock would hang the start"))
    elif not reachable:
        checks.append(doctor.Check(name="allreduce", status="skip", detail="skipped: not every host is reachable"))
    else:
        checks.append(doctor.run_allreduce(spec, sizes=args.sizes, iters=args.iters))
    failed = any(c.status == "fail" for c in checks)
    if args.format == "json":
        print(json.dumps({"ok": not failed, "checks": [c.to_dict() for c in checks]}, indent=2))
    else:
        for c in checks:
            print(f"{c.status.upper():4} {c.name}: {c.detail}")
            if c.hint and c.status in ("fail", "warn"):
                print(f"     fix: {c.hint}")
        bench = next((c for c in checks if c.name == "allreduce" and c.status == "ok"), None)
        if bench is not None:
            print(doctor.render_table(bench.data["results"]))
    if failed:
        print("doctor: some checks failed", file=sys.stderr)
    return 1 if failed else 0
