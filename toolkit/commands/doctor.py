"""``dstk doctor``: versions, devices, ssh reachability, stale locks, and a timed all-reduce."""

from __future__ import annotations

import argparse
import json
import signal
import sys

from dstk.errors import Stopped, UsageError

HELP = ("preflight: versions (the same on every host), GPUs, ssh, /dev/shm, memlock, DeepSpeed's ops, stale op locks, "
        "leaked shm buffers (--fix), a timed all-reduce (bus bandwidth); --calibrate writes a measured hardware profile")
DESCRIPTION = (
    "Check this host (torch, deepspeed, CUDA, NCCL, accelerator, device count) and, over ssh, every host of a "
    "hostfile, and that all hosts run the same python/torch/deepspeed/NCCL/CUDA; /dev/shm size and free space "
    "against what the plan's ranks put there, leaked DeepSpeed shm buffers (--fix removes them), ulimit -l, and "
    "which DeepSpeed ops are prebuilt, built or compatible (as ds_report, building nothing); look for stale "
    "op-build locks; then start the ranks with the same runner command `dstk launch` "
    "would use and time an all-reduce, reported as nccl-tests does (algbw = bytes/time, busbw = algbw*2(n-1)/n), "
    "with the interface NCCL picked. Exit 1 when any check fails. With --calibrate: measure a GEMM sweep, memory "
    "bandwidth, the per-layer dispatch floor, all-reduce bus bandwidth and (CPU ranks) ZeRO's host work per tensor "
    "on this machine's ranks and write a "
    "hardware profile (--output, the --hardware FILE format of plan/estimate/generate)."
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
    parser.add_argument("--sizes", default=None,
                        help="all-reduce sizes (K/M/G suffixes), default 1M,8M (with --calibrate: 16K,256K,4M,32M on CPU "
                             "ranks, 8K,1M,16M,128M,512M on GPUs)")
    parser.add_argument("--iters", type=int, default=None,
                        help="timed iterations per size (after 2 warm-up), default 5")
    parser.add_argument("--no-allreduce", action="store_true", help="skip the all-reduce")
    parser.add_argument("--fix", action="store_true",
                        help="first remove what is safe to remove: DeepSpeed all-reduce buffers in /dev/shm that no "
                             "process maps or holds open (left by earlier runs) and op-build locks no process holds")
    parser.add_argument("--format", choices=["human", "json"], default="human")
    cal = parser.add_argument_group("calibration (--calibrate)")
    cal.add_argument("--calibrate", action="store_true",
                     help="measure a GEMM sweep, memory bandwidth, the per-layer dispatch floor, all-reduce bus "
                          "bandwidth and (CPU ranks) ZeRO's host work per tensor on this machine's ranks and write a "
                          "hardware profile that plan/estimate/generate "
                          "read with --hardware FILE")
    cal.add_argument("--output", default=None, metavar="FILE",
                     help="where the profile goes (.yaml/.yml or .json; default hardware.yaml); - writes the YAML "
                          "profile to standard output and the report to standard error")
    cal.add_argument("--gpu", default=None, metavar="SLUG",
                     help="the catalog entry the profile is based on (default: from the device name; cpu on CPU ranks)")
    cal.add_argument("--precision", choices=["bf16", "fp16", "fp32"], default=None,
                     help="precision of the GEMM sweep (default bf16, fp16 where the GPU has no bf16)")
    cal.add_argument("--quick", action="store_true", help="fewer sizes and shorter timings")
    cal.add_argument("--force", action="store_true",
                     help="replace an --output file that doctor --calibrate did not write")


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

    fixed = _fix() if args.fix else []
    if args.calibrate:
        return _calibrate(args)
    stray = [flag for flag, value in (("--output", args.output), ("--gpu", args.gpu), ("--precision", args.precision),
                                      ("--quick", args.quick), ("--force", args.force)) if value]
    if stray:
        raise UsageError(f"{stray[0]} belongs to --calibrate", hint=f"dstk doctor --calibrate {stray[0]} ...")
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
    host_checks = []  # ssh@HOST / versions@HOST: a host named localhost is reached over ssh too
    if spec.hosts:
        host_checks = doctor.check_hosts(spec.hosts, python=spec.python, expected_devices=spec.gpus_per_node,
                                         cpu=spec.cpu)
        checks += host_checks
        probes = {c.name.removeprefix("versions@"): c.data for c in host_checks
                  if c.name.startswith("versions@") and c.data}
        if probes:
            checks.append(doctor.judge_versions({"this host": info, **probes}))
        for host in spec.hosts:
            locks = doctor.judge_host_locks(host.name, probes[host.name]) if host.name in probes else None
            if locks is not None:
                checks.append(locks)
        for host in spec.hosts:
            if host.name in probes:  # reachable
                checks += doctor.check_host_limits(host, ranks_per_node=spec.gpus_per_node, num_nodes=spec.num_nodes,
                                                   cpu=spec.cpu)
    checks += _static_checks(args, spec, fixed)
    reachable = all(c.status != "fail" for c in host_checks)
    if args.no_allreduce:
        pass
    elif any(c.name.startswith("op-build locks") and c.status == "fail" for c in checks):
        checks.append(doctor.Check(name="allreduce", status="skip", detail="skipped: a stale lock would hang the start"))
    elif not reachable:
        checks.append(doctor.Check(name="allreduce", status="skip", detail="skipped: not every host is reachable"))
    else:
        try:
            checks.append(doctor.run_allreduce(spec, sizes=args.sizes or "1M,8M", iters=args.iters or 5))
        except Stopped as stop:
            # the checks done before the signal are still worth reading: print them, then stop as asked
            checks.append(doctor.Check(name="allreduce", status="skip",
                                       detail=f"stopped by {signal.Signals(stop.signum).name} before it finished"))
            _report(checks, args, stopped=True)
            raise
    return 1 if _report(checks, args) else 0


def _report(checks: list, args: argparse.Namespace, *, stopped: bool = False) -> bool:
    """Print ``checks`` (text or ``--format json``); True when one failed. ``stopped``: a signal ended the
    run before every check ran (the JSON says ``"ok": false`` and ``"stopped": true``)."""
    from dstk.launch import doctor

    failed = any(c.status == "fail" for c in checks)
    if args.format == "json":
        print(json.dumps({"ok": not failed and not stopped, **({"stopped": True} if stopped else {}),
                          "checks": [c.to_dict() for c in checks]}, indent=2), flush=True)
    else:
        for c in checks:
            print(f"{c.status.upper():4} {c.name}: {c.detail}")
            if c.hint and c.status in ("fail", "warn"):
                print(f"     fix: {c.hint}")
        bench = next((c for c in checks if c.name == "allreduce" and c.status == "ok"), None)
        if bench is not None:
            print(doctor.render_table(bench.data["results"]))
        sys.stdout.flush()
    if failed:
        print("doctor: some checks failed", file=sys.stderr)
    return failed


def _fix() -> list:
    """``--fix``: remove the leaked shm buffers of this user and the stale op-build locks; return Checks saying what."""
    import os

    from dstk.launch import doctor
    from dstk.launch.locks import find_stale_locks
    from dstk.launch.shm import leaked_buffers, remove_leaked

    done = []
    removed = remove_leaked(leaked_buffers(uid=os.getuid()))
    if removed:
        done.append(doctor.Check(name="fixed shm", status="ok", data={"removed": removed},
                                 detail=f"removed {len(removed)} leaked DeepSpeed buffer(s) from /dev/shm"))
    locks = []
    for lock in find_stale_locks():
        try:
            lock.unlink()
            locks.append(str(lock))
        except OSError:
            continue
    if locks:
        done.append(doctor.Check(name="fixed locks", status="ok", data={"removed": locks},
                                 detail=f"removed stale op-build lock(s): {' '.join(locks)}"))
    return done


def _static_checks(args: argparse.Namespace, spec, fixed: list) -> list:
    """/dev/shm (size, free space, leaked DeepSpeed buffers), memlock and DeepSpeed's op status for the plan."""
    from pathlib import Path

    from dstk.launch import doctor

    config = None
    if args.run_dir is not None:
        try:
            config = json.loads((Path(args.run_dir) / "ds_config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            config = None
    needed = doctor.needed_ops(config, cpu=spec.cpu, num_nodes=spec.num_nodes, ranks_per_node=spec.gpus_per_node)
    return [*fixed, *doctor.check_shm(ranks_per_node=spec.gpus_per_node, num_nodes=spec.num_nodes, cpu=spec.cpu),
            doctor.check_memlock(cpu=spec.cpu), doctor.check_ops(python=spec.python, needed=needed)]


def _calibrate(args: argparse.Namespace) -> int:
    """``doctor --calibrate``: the local checks, then the measurement ranks, then the profile."""
    from dstk import calibrate
    from dstk.errors import DstkError
    from dstk.hardware import get_gpu
    from dstk.launch import doctor

    if args.run_dir or args.hostfile or args.hosts or args.no_allreduce:
        raise UsageError("--calibrate measures this machine's ranks: give --num-ranks N, not RUN_DIR, --hostfile, "
                         "--hosts or --no-allreduce")
    args.output = args.output or "hardware.yaml"
    if args.output != "-":
        calibrate.check_output_path(args.output, force=args.force)
    base = get_gpu(args.gpu) if args.gpu else None
    local = doctor.check_local()
    info = local.data
    if not info:  # the probe did not run: nothing to calibrate on
        return _print_calibration(args, [local, doctor.Check(name="calibrate", status="skip",
                                                             detail="skipped: the local probe failed")], None, None)
    cpu_here = info.get("accelerator") == "cpu"
    if base is None:
        slug = calibrate.guess_gpu_slug(info.get("device_name"), cpu=cpu_here)
        if slug is None:
            raise DstkError(f"no catalog entry matches the device {info.get('device_name')!r}",
                            hint="say which entry to start from: --gpu SLUG (dstk gpus lists them)")
        base = get_gpu(slug)
    if base.is_cpu != cpu_here:
        raise DstkError(f"--gpu {base.slug} on a host whose ranks are {'CPU' if cpu_here else 'GPU'} ranks",
                        hint="the profile describes the device the ranks run on: " +
                             ("--gpu cpu" if cpu_here else "a GPU slug (dstk gpus)"))
    precision = args.precision or ("bf16" if base.bf16_flops is not None else "fp16")
    if cpu_here and precision == "fp16":
        raise DstkError("fp16 on CPU ranks: DeepSpeed's CPU accelerator trains in bf16 or fp32",
                        hint="--precision bf16 (or fp32)")
    settings = doctor.SweepSettings.for_device(cpu=cpu_here, quick=args.quick, precision=precision)
    if args.sizes or args.iters:
        import dataclasses

        settings = dataclasses.replace(settings, sizes=args.sizes or settings.sizes, iters=args.iters or settings.iters)
    spec = _spec(args, info.get("num_devices"), cpu_here)
    checks = [doctor._judge_probe("versions@localhost", info, expected_devices=spec.gpus_per_node, cpu=spec.cpu),
              doctor.check_locks()]
    profile = out = None
    if any(c.status == "fail" for c in checks):
        checks.append(doctor.Check(name="calibrate", status="skip", detail="skipped: a check above failed"))
    else:
        check, out = doctor.run_calibrate(spec, settings=settings)
        checks.append(check)
        if check.status == "ok":
            try:
                measured = calibrate.from_rank_reports(measure=out.measure, allreduce=list(out.allreduce))
                profile = calibrate.build_profile(base=base, measured=measured)
            except (KeyError, ValueError) as exc:
                checks[-1] = doctor.Check(name="calibrate", status="fail", detail=f"implausible measurement: {exc}",
                                          data=check.data, hint="run it again on an idle machine; --format json "
                                          "shows every rank's figures")
        if profile is not None:
            import datetime
            import platform

            stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
            from dstk import __version__

            # the version lets a later dstk say that a field it does not know comes from another release
            header = (f"{calibrate.HEADER}: `dstk doctor --calibrate` on {platform.node()}, {stamp} (dstk {__version__})",
                      f"{measured.num_ranks} rank(s), {measured.backend} on {measured.device}"
                      + (f" ({measured.device_name})" if measured.device_name else "")
                      + f", GEMM sweep in {measured.precision}; base entry: {base.slug!r} of the catalog",
                      f"use it: dstk plan INTENT --hardware "
                      f"{'FILE (this output saved as .yaml)' if args.output == '-' else args.output}"
                      "  (also estimate, generate, gpus)")
            text = (calibrate.render_json(profile) if args.output.endswith(".json")
                    else calibrate.render_yaml(profile, header=header))
            if args.output == "-":  # the profile alone on stdout, so `> hw.yaml` or a pipe gets a loadable file
                sys.stdout.write(text)
                sys.stdout.flush()
            else:
                calibrate.write_profile(args.output, text)
    return _print_calibration(args, checks, profile, out)


def _print_calibration(args: argparse.Namespace, checks: list, profile, out) -> int:
    """The report: on stdout, or on stderr when the profile itself went to stdout (``--output -``)."""
    from dstk import calibrate
    from dstk.launch import doctor

    stream = sys.stderr if args.output == "-" else sys.stdout
    failed = any(c.status == "fail" for c in checks)
    lines = []
    if args.format == "json":
        lines.append(json.dumps({"ok": not failed, "checks": [c.to_dict() for c in checks],
                                 "output": args.output if profile is not None else None,
                                 "profile": None if profile is None else calibrate.to_dict(profile)}, indent=2))
    else:
        for c in checks:
            lines.append(f"{c.status.upper():4} {c.name}: {c.detail}")
            if c.hint and c.status in ("fail", "warn"):
                lines.append(f"     fix: {c.hint}")
        if profile is not None:
            lines.append(calibrate.render_report(profile, path="<stdout>" if args.output == "-" else args.output))
            if out is not None and out.allreduce:
                lines.append(doctor.render_table(list(out.allreduce)))
    print("\n".join(lines), file=stream)
    if failed:
        print("doctor: some checks failed", file=sys.stderr)
    return 1 if failed else 0
