"""``dstk doctor``: preflight checks before a launch.

Versions and devices on this host (and, over ssh, on every host of a hostfile), stale op-build
locks, and a short timed all-reduce over ranks started by the same runner a training job would
use, reported as nccl-tests does (``dstk.launch.allreduce``), with the network interface NCCL
picked (from its ``NCCL_DEBUG=INFO`` lines) or the one gloo uses. ``run_calibrate`` starts the
same ranks with the hardware microbenchmarks of ``dstk.launch.measure`` (``doctor --calibrate``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

from dstk.launch.allreduce import TAG as ALLREDUCE_TAG
from dstk.launch.command import LaunchSpec, plan_launch
from dstk.launch.hosts import Host
from dstk.launch.locks import find_stale_locks
from dstk.launch.measure import TAG as MEASURE_TAG
from dstk.launch.run import run_plan

Status = Literal["ok", "warn", "fail", "skip"]
# NCCL's INIT/NET lines name the transport and interfaces it chose, e.g.
# "NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ..." or "NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>".
_NCCL_NET_RE = re.compile(r"NCCL INFO (NET/\S+ : Using .*|Using network \S+)")


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class Check:
    name: str
    """What was checked, e.g. ``versions@localhost`` or ``allreduce``."""
    status: Status
    detail: str
    """One line for people."""
    data: dict = dataclasses.field(default_factory=dict)
    """The measured values, for ``--format json``."""
    hint: str | None = None
    """How to fix a ``fail`` or ``warn``."""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _last_json(text: str) -> dict | None:
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def describe_probe(info: dict) -> str:
    devices = f"{info.get('num_devices')} x {info.get('device_name') or info.get('accelerator')}"
    parts = [f"python {info.get('python')}", f"torch {info.get('torch')}", f"deepspeed {info.get('deepspeed')}",
             f"cuda {info.get('cuda')}", f"nccl {info.get('nccl')}", f"accelerator {info.get('accelerator')}",
             f"devices {devices}"]
    return ", ".join(parts)


def check_local(*, python: str = sys.executable, expected_devices: int | None = None, cpu: bool = False) -> Check:
    out = subprocess.run([python, "-m", "dstk.launch.probe"], capture_output=True, text=True, timeout=120)
    info = _last_json(out.stdout)
    if info is None:
        return Check(name="versions@localhost", status="fail", detail=f"probe failed: {out.stderr.strip()[-300:]}",
                     hint="check that torch and deepspeed import in this environment")
    return _judge_probe("versions@localhost", info, expected_devices=expected_devices, cpu=cpu)


def _judge_probe(name: str, info: dict, *, expected_devices: int | None, cpu: bool) -> Check:
    status: Status = "ok"
    hint = None
    if info.get("errors"):
        status, hint = "fail", "; ".join(info["errors"])
    elif expected_devices is not None and not cpu:
        if info.get("accelerator") != "cuda" and info.get("nccl") is None:
            status, hint = "fail", "the plan is for GPUs but this host has none visible to torch (check drivers and CUDA_VISIBLE_DEVICES)"
        elif (info.get("num_devices") or 0) < expected_devices:
            status, hint = "fail", f"the plan needs {expected_devices} GPU(s) per node"
    return Check(name=name, status=status, detail=describe_probe(info), data=info, hint=hint)


def check_locks() -> Check:
    stale = find_stale_locks()
    if stale:
        return Check(name="op-build locks", status="fail", detail=f"stale: {' '.join(map(str, stale))}",
                     data={"stale": [str(p) for p in stale]},
                     hint=f"no process holds them open; remove them: {shlex.join(['rm', *map(str, stale)])}")
    return Check(name="op-build locks", status="ok", detail="no stale lock in the torch extensions cache")


def check_host(host: Host, *, python: str, timeout_s: int = 10, expected_devices: int | None = None,
               cpu: bool = False) -> Check:
    """ssh reachability as the runner tests it (no password prompt), then the probe on that host."""
    ssh = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={timeout_s}", "-o", "PasswordAuthentication=no", host.name]
    try:
        reach = subprocess.run([*ssh, "hostname"], capture_output=True, text=True, timeout=timeout_s + 5)
    except (OSError, subprocess.TimeoutExpired) as exc:
        reach = subprocess.CompletedProcess([], 255, "", str(exc))
    if reach.returncode != 0:
        return Check(name=f"ssh@{host.name}", status="fail",
                     detail=f"not reachable without a password: {(reach.stderr or '').strip()[-200:]}",
                     hint="set up passwordless ssh (ssh-copy-id), or start each node with --node-rank / use --slurm")
    # The remote shell reads this command line: quote the interpreter path for it.
    probe = subprocess.run([*ssh, f"{shlex.quote(python)} -m dstk.launch.probe"], capture_output=True, text=True,
                           timeout=120)
    info = _last_json(probe.stdout)
    if info is None:
        return Check(name=f"versions@{host.name}", status="fail", detail="reachable, but the probe did not run there",
                     hint=f"the runner starts {python} on every node: install the same environment at the same path")
    return _judge_probe(f"versions@{host.name}", info, expected_devices=expected_devices, cpu=cpu)


def check_hosts(hosts: tuple[Host, ...], *, python: str, expected_devices: int | None, cpu: bool) -> list[Check]:
    with ThreadPoolExecutor(max_workers=min(16, max(1, len(hosts)))) as pool:
        return list(pool.map(lambda h: check_host(h, python=python, expected_devices=expected_devices, cpu=cpu), hosts))


def allreduce_spec(spec: LaunchSpec, *, sizes: str, iters: int, work_dir: str) -> LaunchSpec:
    """The launch of ``spec`` with the all-reduce benchmark as its script (and NCCL's NET lines on).

    Files the launch writes (a hostfile from ``--hosts``, ``.deepspeed_env``) go to ``work_dir``,
    so a diagnosis never touches the run directory or the user's hostfile's directory."""
    env = dict(spec.env)
    env.setdefault("NCCL_DEBUG", "INFO")
    env.setdefault("NCCL_DEBUG_SUBSYS", "INIT,NET")
    hostfile = os.path.join(work_dir, "hostfile") if spec.write_hostfile else spec.hostfile
    return dataclasses.replace(spec, script="dstk.launch.allreduce", module=True,
                               script_args=("--sizes", sizes, "--iters", str(iters)), config_arg=None,
                               env=tuple(env.items()), run_dir=work_dir, hostfile=hostfile)


def run_allreduce(spec: LaunchSpec, *, sizes: str = "1M,8M", iters: int = 5) -> Check:
    with tempfile.TemporaryDirectory(prefix="dstk-doctor-") as work_dir:
        return _run_allreduce(allreduce_spec(spec, sizes=sizes, iters=iters, work_dir=work_dir))


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class BenchOutput:
    """What a benchmark launch printed: its tagged result lines and the rest of its output."""

    returncode: int
    messages: tuple[str, ...]
    allreduce: tuple[dict, ...]
    """``DSTK_ALLREDUCE`` lines (``dstk.launch.allreduce``), one per size."""
    measure: dict | None
    """The ``DSTK_MEASURE`` line (``dstk.launch.measure``), if any."""
    nets: tuple[str, ...]
    tail: str


def _run_bench(bench: LaunchSpec) -> BenchOutput:
    plan = plan_launch(bench)
    results: list[dict] = []
    measured: list[dict] = []
    nets: list[str] = []
    tail: list[str] = []

    def sink(stream: str, line: str) -> None:
        body = line.split("] ", 1)[1] if line.startswith("[rank ") else line
        if body.startswith(ALLREDUCE_TAG):
            results.append(json.loads(body[len(ALLREDUCE_TAG):]))
            return
        if body.startswith(MEASURE_TAG):
            measured.append(json.loads(body[len(MEASURE_TAG):]))
            return
        m = _NCCL_NET_RE.search(body)
        if m and m.group(1) not in nets:
            nets.append(m.group(1).strip())
        tail.append(line)
        del tail[:-40]

    outcome = run_plan(plan, world_size=bench.world_size, expect_reports=bench.prefix_output, sink=sink,
                       check_locks=False)
    return BenchOutput(returncode=outcome.returncode, messages=tuple(outcome.messages), allreduce=tuple(results),
                       measure=measured[-1] if measured else None, nets=tuple(nets), tail="".join(tail))


def _run_allreduce(bench: LaunchSpec) -> Check:
    return judge_allreduce(_run_bench(bench), env=dict(bench.env))


def judge_allreduce(out: BenchOutput, *, env: dict) -> Check:
    """The ``allreduce`` check from a benchmark launch's output."""
    results, nets = list(out.allreduce), out.nets
    if out.returncode != 0 or not results:
        return Check(name="allreduce", status="fail",
                     detail="; ".join(out.messages) or "the benchmark printed no result",
                     data={"output_tail": out.tail},
                     hint="read the output tail (--format json); NCCL_DEBUG=INFO names the failing transport")
    largest = max(results, key=lambda r: r["size_bytes"])
    backend = largest["backend"]
    if backend == "nccl":
        interface = "; ".join(nets) or "not reported (NCCL printed no NET line)"
    else:
        gloo_if = env.get("GLOO_SOCKET_IFNAME")
        interface = f"gloo on {gloo_if}" if gloo_if else "gloo on the interface of the host name (GLOO_SOCKET_IFNAME unset)"
    ok = all(r["correct"] for r in results)
    detail = (f"{backend}, {largest['world_size']} ranks, {largest['size_bytes'] / 2**20:g} MiB: "
              f"{largest['seconds'] * 1e3:.3f} ms, algbw {largest['algbw_bytes_per_s'] / 1e9:.3f} GB/s, "
              f"busbw {largest['busbw_bytes_per_s'] / 1e9:.3f} GB/s; interface: {interface}")
    return Check(name="allreduce", status="ok" if ok else "fail", detail=detail,
                 data={"results": results, "interface": interface},
                 hint=None if ok else "the all-reduce result was wrong: suspect the fabric or the NCCL build")


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class SweepSettings:
    """What ``dstk.launch.measure`` runs (its flags); ``for_device`` gives the defaults."""

    precision: str = "bf16"
    dims: tuple[int, ...] = (32, 64, 128, 256, 512, 1024)
    """GEMM widths d of the sweep."""
    tokens: int = 512
    """GEMM rows m (at least d): tokens per micro-batch."""
    copy_bytes: str = "128M"
    """Copy buffer: several times the last-level cache (CPU L3, GPU L2)."""
    min_seconds: float = 0.1
    sizes: str = "256K,4M,32M"
    """All-reduce sizes."""
    iters: int = 5

    @staticmethod
    def for_device(*, cpu: bool, quick: bool = False, precision: str = "bf16") -> "SweepSettings":
        """Defaults: a CPU rank runs the sweep in a few seconds (the widths of small models); a GPU
        up to the 8192-wide GEMMs of large ones, with a 1 GiB copy (H100/H200 L2: 50 MiB)."""
        if cpu:
            if quick:
                return SweepSettings(precision=precision, dims=(32, 128, 512), min_seconds=0.03, sizes="1M,8M",
                                     copy_bytes="64M", iters=3)
            return SweepSettings(precision=precision)
        if quick:
            return SweepSettings(precision=precision, dims=(512, 2048, 8192), tokens=8192, copy_bytes="1G",
                                 min_seconds=0.05, sizes="16M,256M", iters=5)
        return SweepSettings(precision=precision, dims=(128, 256, 512, 1024, 2048, 4096, 8192), tokens=8192,
                             copy_bytes="1G", min_seconds=0.1, sizes="1M,16M,128M,512M", iters=10)

    def script_args(self) -> tuple[str, ...]:
        return ("--precision", self.precision, "--dims", ",".join(map(str, self.dims)), "--tokens", str(self.tokens),
                "--copy-bytes", self.copy_bytes, "--min-seconds", str(self.min_seconds), "--sizes", self.sizes,
                "--iters", str(self.iters))


def run_calibrate(spec: LaunchSpec, *, settings: SweepSettings) -> tuple[Check, BenchOutput]:
    """Start ``spec``'s ranks with ``dstk.launch.measure`` (GEMM sweep, copy bandwidth, operator
    and layer floors, then the doctor's all-reduce) and return the ``calibrate`` check and the raw
    output (``dstk.calibrate`` turns it into a profile)."""
    with tempfile.TemporaryDirectory(prefix="dstk-calibrate-") as work_dir:
        bench = allreduce_spec(spec, sizes=settings.sizes, iters=settings.iters, work_dir=work_dir)
        bench = dataclasses.replace(bench, script="dstk.launch.measure", script_args=settings.script_args())
        out = _run_bench(bench)
    if out.returncode != 0 or out.measure is None:
        return Check(name="calibrate", status="fail",
                     detail="; ".join(out.messages) or "the measurement printed no result",
                     data={"output_tail": out.tail},
                     hint="read the output tail (--format json); run `dstk doctor` without --calibrate to check the "
                          "ranks start"), out
    ranks = out.measure["ranks"]
    return Check(name="calibrate", status="ok",
                 detail=f"{len(ranks)} rank(s), {out.measure['backend']}, GEMM sweep d = "
                        f"{', '.join(str(g['n']) for g in ranks[0]['gemm'])} in {settings.precision}, copy, "
                        f"layer floor, all-reduce {settings.sizes}",
                 data={"measure": out.measure, "allreduce": list(out.allreduce)}), out


def render_table(results: list[dict]) -> str:
    """An nccl-tests-like table: size, time, algbw, busbw (GB/s = 1e9 bytes/s)."""
    lines = [f"{'size (B)':>12} {'time (us)':>12} {'algbw (GB/s)':>13} {'busbw (GB/s)':>13} {'correct':>8}"]
    for r in results:
        lines.append(f"{r['size_bytes']:>12} {r['seconds'] * 1e6:>12.1f} {r['algbw_bytes_per_s'] / 1e9:>13.3f} "
                     f"{r['busbw_bytes_per_s'] / 1e9:>13.3f} {str(r['correct']):>8}")
    return "\n".join(lines)
