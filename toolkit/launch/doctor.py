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
from dstk.errors import Stopped
from dstk.launch.command import LaunchSpec
from dstk.launch.hosts import Host
from dstk.launch.locks import find_stale_locks, rm_command
from dstk.launch.measure import TAG as MEASURE_TAG
from dstk.launch.run import _PDSH_PREFIX_RE, run_plan, stop_guards
from dstk.launch import shm
from dstk.launch.shm import remove_run_buffers

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
                     hint=f"no process holds them open; remove them: {rm_command(stale)}")
    return Check(name="op-build locks", status="ok", detail="no stale lock in the torch extensions cache")


def judge_host_locks(host: str, info: dict) -> Check | None:
    """``op-build locks@HOST`` from that host's probe: the stale locks in its torch extensions cache, which
    this machine cannot see when the cache is node-local, and which hang that node's ranks at the start of a
    multi-node launch while the others wait for them. ``None`` from a probe that does not report them (an
    older dstk there)."""
    stale = info.get("stale_locks")
    if stale is None:
        return None
    if stale:
        return Check(name=f"op-build locks@{host}", status="fail", detail=f"stale: {' '.join(stale)}",
                     data={"stale": stale},
                     hint=f"no process on {host} holds them open; remove them there: "
                          f"{rm_command(stale, host=host)}")
    return Check(name=f"op-build locks@{host}", status="ok",
                 detail=f"no stale lock in {info.get('extensions_root') or 'the torch extensions cache'}")


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
    results: list[dict] = []
    measured: list[dict] = []
    nets: list[str] = []
    tail: list[str] = []

    def sink(stream: str, line: str) -> None:
        if line.startswith("dstk: "):  # dstk's own word on the launch (an op's first build, a lock it removed)
            sys.stderr.write(line)
            sys.stderr.flush()
        # pdsh puts "HOST: " before every line of a multi-node launch, the rank wrapper "[rank N] "
        body = line[m.end():] if (m := _PDSH_PREFIX_RE.match(line)) and line.startswith("[rank ", m.end()) else line
        body = body.split("] ", 1)[1] if body.startswith("[rank ") else body
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

    # A signal stops the benchmark's ranks as it stops a training launch's (run.stop_guards); without that,
    # SIGTERM to dstk alone would leave the runner, launch.py and every rank running, holding the GPUs.
    bench, plan, watch, local_stop = stop_guards(bench)
    try:
        outcome = run_plan(plan, world_size=bench.world_size, expect_reports=bench.prefix_output, sink=sink,
                           check_locks=False, watch=watch, local_stop=local_stop)
    finally:
        remove_run_buffers(master_port=bench.master_port)  # DeepSpeed's CPU shm all-reduce leaks them
    if watch is not None:  # its stop of the other nodes (one failed, or a signal) has ended
        watch.join(timeout=watch.grace_seconds + 90)
    if outcome.interrupted_by is not None:
        stopper = watch if watch is not None else local_stop
        raise Stopped(outcome.interrupted_by, "; ".join(stopper.messages()))
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
    sizes: str = "16K,256K,4M,32M"
    """All-reduce sizes: those up to 1 MiB give the per-call latency (``dstk.calibrate.fit_latency``)."""
    iters: int = 5

    @staticmethod
    def for_device(*, cpu: bool, quick: bool = False, precision: str = "bf16") -> "SweepSettings":
        """Defaults: a CPU rank runs the sweep in a few seconds (the widths of small models); a GPU
        up to the 8192-wide GEMMs of large ones, with a 1 GiB copy (H100/H200 L2: 50 MiB)."""
        if cpu:
            if quick:
                return SweepSettings(precision=precision, dims=(32, 128, 512), min_seconds=0.03, sizes="16K,1M,8M",
                                     copy_bytes="64M", iters=3)
            return SweepSettings(precision=precision)
        if quick:
            return SweepSettings(precision=precision, dims=(512, 2048, 8192), tokens=8192, copy_bytes="1G",
                                 min_seconds=0.05, sizes="8K,16M,256M", iters=5)
        return SweepSettings(precision=precision, dims=(128, 256, 512, 1024, 2048, 4096, 8192), tokens=8192,
                             copy_bytes="1G", min_seconds=0.1, sizes="8K,1M,16M,128M,512M", iters=10)

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


# --- static checks of this host: /dev/shm, memlock, DeepSpeed's ops; versions across hosts -------------

MIB = 2**20
NCCL_SHM_BYTES = 2**30
"""What a node with several GPU ranks should give /dev/shm: NCCL's shared-memory transport and its proxy
buffers live there, and NCCL's troubleshooting guide (section "Docker") says docker's default 64 MiB is
not enough and to run containers with ``--shm-size=1g --ulimit memlock=-1`` (or ``--ipc=host``); PyTorch's
own CI raised it to 2 GB after NCCL segfaulted in ``ncclShmOpen`` (pytorch/tutorials 0ba3e39)."""


def shm_need_bytes(*, ranks_per_node: int, num_nodes: int, cpu: bool) -> tuple[int, str]:
    """(bytes, formula) the plan's ranks put in /dev/shm on one node.

    CPU ranks: DeepSpeed's shm all-reduce runs when every rank is on one node (LOCAL_SIZE == world,
    deepspeed/ops/csrc/cpu/comm/shm_interface.cpp lines 31-46) and maps one 69,206,024-byte buffer per
    rank (``dstk.launch.shm.BUFFER_BYTES``). GPU ranks: ``NCCL_SHM_BYTES`` when a node has 2+ ranks."""
    from dstk.launch.shm import BUFFER_BYTES

    if cpu:
        if num_nodes > 1 or ranks_per_node < 2:
            return 0, "CPU ranks on several nodes (or one rank): DeepSpeed's shm all-reduce is not used"
        return ranks_per_node * BUFFER_BYTES, (f"DeepSpeed's CPU shm all-reduce: {ranks_per_node} ranks x 66 MiB "
                                               f"(deepspeed/ops/csrc/cpu/comm/shm.cpp)")
    if ranks_per_node < 2:
        return 0, "one GPU rank per node: NCCL needs no intra-node shared memory"
    return NCCL_SHM_BYTES, f"NCCL's shm transport, {ranks_per_node} GPU ranks per node: 1 GiB (NCCL troubleshooting, Docker)"


def _mib(num_bytes: float) -> str:
    return f"{num_bytes / MIB:,.0f} MiB" if num_bytes < 10 * 2**30 else f"{num_bytes / 2**30:,.1f} GiB"


def judge_shm(*, space, need_bytes: int, need_text: str, leaked: list) -> Check:
    """Pure: the ``/dev/shm`` check from its size and free space (``dstk.launch.shm.shm_space``), what the
    plan's ranks need there, and the leaked DeepSpeed buffers (unused) that hold part of it."""
    from dstk.launch.shm import rm_command

    leaked_bytes = sum(b.size_bytes for b in leaked)
    data = {"need_bytes": need_bytes, "need": need_text, "leaked_bytes": leaked_bytes}
    if space is None:
        return Check(name="shm", status="warn" if need_bytes else "ok", detail="no /dev/shm on this host", data=data,
                     hint="the ranks need shared memory in /dev/shm: mount a tmpfs there" if need_bytes else None)
    data |= {"total_bytes": space.total_bytes, "free_bytes": space.free_bytes}
    detail = f"/dev/shm {_mib(space.total_bytes)}, {_mib(space.free_bytes)} free; the plan needs {_mib(need_bytes)} ({need_text})"
    fix_leak = f"; {len(leaked)} leaked DeepSpeed buffer(s) hold {_mib(leaked_bytes)}: dstk doctor --fix" if leaked else ""
    if space.total_bytes < need_bytes:
        docker = " (docker's default is 64 MiB)" if space.total_bytes <= 64 * MIB else ""
        return Check(name="shm", status="fail", detail=detail + docker, data=data,
                     hint=f"give /dev/shm at least {_mib(need_bytes)}: docker run --shm-size={max(1, -(-need_bytes // 2**30))}g "
                          "(or --ipc=host); Kubernetes: an emptyDir with medium: Memory mounted at /dev/shm; "
                          "a host: mount -o remount,size=50% /dev/shm")
    if space.free_bytes < need_bytes:
        return Check(name="shm", status="fail", detail=detail, data=data,
                     hint=("free /dev/shm" + (f": {len(leaked)} leaked DeepSpeed buffer(s) hold {_mib(leaked_bytes)}; "
                                              f"dstk doctor --fix (or {rm_command(leaked)})" if leaked else
                                              ": see what holds it with ls -la /dev/shm")))
    return Check(name="shm", status="ok", detail=detail + fix_leak, data=data)


def judge_shm_leaks(leaked: list, *, uid: int) -> Check:
    """Pure: DeepSpeed all-reduce buffers no live process maps or holds open (left by earlier runs), with the fix."""
    from dstk.launch.shm import rm_command

    if not leaked:
        return Check(name="shm leaks", status="ok", detail="no leaked DeepSpeed all-reduce buffer in /dev/shm")
    total = sum(b.size_bytes for b in leaked)
    mine = [b for b in leaked if b.uid == uid]
    others = len(leaked) - len(mine)
    ports = sorted({b.master_port for b in leaked if b.master_port is not None})
    detail = (f"{len(leaked)} DeepSpeed all-reduce buffer(s) in /dev/shm that no process uses, {_mib(total)} "
              f"(runs on port(s) {', '.join(map(str, ports)) or '?'}; DeepSpeed never unlinks them)")
    hint = (f"dstk doctor --fix removes them (or: {rm_command(mine)})" if mine else "")
    if others:
        hint += ("; " if hint else "") + f"{others} belong to other users: they (or root) can remove them"
    return Check(name="shm leaks", status="warn", detail=detail,
                 data={"paths": [b.path for b in leaked], "total_bytes": total}, hint=hint)


def check_shm(*, ranks_per_node: int, num_nodes: int, cpu: bool) -> list[Check]:
    from dstk.launch.shm import leaked_buffers, shm_space

    need, text = shm_need_bytes(ranks_per_node=ranks_per_node, num_nodes=num_nodes, cpu=cpu)
    leaked = leaked_buffers()
    return [judge_shm(space=shm_space(), need_bytes=need, need_text=text, leaked=leaked),
            judge_shm_leaks(leaked, uid=os.getuid())]


def judge_memlock(*, soft_bytes: int | None, cpu: bool) -> Check:
    """Pure: ``ulimit -l`` (RLIMIT_MEMLOCK; None = unlimited). NCCL over InfiniBand/RoCE registers (pins)
    its buffers with the verbs API, which fails or falls back past the memlock limit; NCCL's
    troubleshooting guide asks for ``--ulimit memlock=-1`` in containers. CPU ranks (gloo) pin nothing."""
    text = "unlimited" if soft_bytes is None else f"{soft_bytes // 1024} KiB"
    data = {"memlock_bytes": soft_bytes}
    if soft_bytes is None:
        return Check(name="memlock", status="ok", detail=f"ulimit -l: {text}", data=data)
    if cpu:
        return Check(name="memlock", status="ok", detail=f"ulimit -l: {text} (CPU ranks pin no memory)", data=data)
    return Check(name="memlock", status="warn", detail=f"ulimit -l: {text}; NCCL over InfiniBand/RoCE needs unlimited",
                 data=data, hint="raise it to unlimited: `* - memlock unlimited` in /etc/security/limits.conf (then log "
                                 "in again); docker run --ulimit memlock=-1; Slurm: PropagateResourceLimits or "
                                 "a slurmd started with LimitMEMLOCK=infinity")


def check_memlock(*, cpu: bool) -> Check:
    import resource

    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return judge_memlock(soft_bytes=None if soft == resource.RLIM_INFINITY else soft, cpu=cpu)


OPS_TAG = "DSTK_OPS "


def op_report() -> dict:
    """What ``ds_report`` prints, as data, without building anything: per op, prebuilt into the wheel
    (``installed_ops`` for this accelerator, deepspeed/env_report.py ``op_report``), built just in time
    already (``<name>.so`` in the torch extensions cache) and compatible (its builder's probe, which JIT
    needs), plus whether ninja (JIT's build tool) is there. Imports deepspeed: run it in a child."""
    import contextlib
    import io

    from dstk.launch.locks import extensions_root

    with contextlib.redirect_stdout(io.StringIO()):
        from torch.utils.cpp_extension import is_ninja_available
        from deepspeed.accelerator import get_accelerator
        from deepspeed.git_version_info import accelerator_name, installed_ops
        from deepspeed.ops.op_builder.all_ops import ALL_OPS
        from deepspeed.ops.op_builder.builder import probe_is_compatible

        root = extensions_root()
        built = {p.parent.name for p in (*root.glob("*/*.so"), *root.glob("*/*/*.so")) if p.stem == p.parent.name}
        ops = {}
        for name, builder in ALL_OPS.items():
            ops[name] = {"prebuilt": bool(installed_ops.get(name)) and accelerator_name == get_accelerator()._name,
                         "jit_built": name in built, "compatible": bool(probe_is_compatible(builder, False))}
    return {"ninja": bool(is_ninja_available()), "accelerator": get_accelerator()._name, "ops": ops,
            "cache": str(extensions_root())}


def needed_ops(ds_config: dict | None, *, cpu: bool, num_nodes: int, ranks_per_node: int) -> dict[str, str]:
    """The ops a run of this config builds on its first start, with why (DeepSpeed 0.19.8):
    ``deepspeed_shm_comm`` for CPU ranks all on one node (the shm all-reduce, deepspeed/comm/ccl.py /
    torch.py's ``shm_comm_op``); ``cpu_adam`` for optimizer offload (``DeepSpeedCPUAdam``); ``fused_adam`` for
    an Adam/AdamW optimizer block without ``torch_adam`` (deepspeed/runtime/engine.py ``_configure_basic_optimizer``)."""
    need: dict[str, str] = {}
    if cpu and num_nodes == 1 and ranks_per_node > 1:
        need["deepspeed_shm_comm"] = "the CPU all-reduce of ranks on one machine"
    if not ds_config:
        return need
    zero = ds_config.get("zero_optimization") or {}
    offload = (zero.get("offload_optimizer") or {}).get("device") in ("cpu", "nvme")
    opt = ds_config.get("optimizer") or {}
    kind = str(opt.get("type", "")).lower()
    params = opt.get("params") or {}
    if offload and kind in ("adam", "adamw"):
        need["cpu_adam"] = "optimizer offload to the CPU (DeepSpeedCPUAdam)"
    elif kind in ("adam", "adamw") and not params.get("torch_adam"):
        need["fused_adam"] = f"the {opt.get('type')} optimizer (FusedAdam; \"torch_adam\": true avoids the build)"
    return need


def judge_ops(report: dict | None, *, needed: dict[str, str], error: str = "") -> Check:
    """Pure: the ``ops`` check from ``op_report()`` and the ops the plan needs."""
    if report is None:
        return Check(name="ops", status="warn", detail=f"could not read DeepSpeed's op status: {error[-300:]}",
                     hint="run ds_report to see it")
    ops = report["ops"]
    ready = sorted(n for n, o in ops.items() if o["prebuilt"] or o["jit_built"])
    lines, status, hints = [], "ok", []
    for name, why in needed.items():
        op = ops.get(name)
        if op is None or not op["compatible"] and not (op["prebuilt"] or op["jit_built"]):
            status = "fail"
            lines.append(f"{name} (needed for {why}) cannot be built here")
            hints.append(f"ds_report says why {name} is not compatible (compiler, CUDA toolkit, headers)")
        elif not (op["prebuilt"] or op["jit_built"]):
            if not report["ninja"]:
                status = "fail"
                lines.append(f"{name} (needed for {why}) is not built and ninja is missing")
                hints.append("pip install ninja (DeepSpeed builds ops with it)")
                continue
            status = "warn" if status == "ok" else status
            lines.append(f"{name} (needed for {why}) is built on the first start: a few minutes, silent")
            hints.append(f"build it now once (e.g. `dstk demo`, or a launch you let finish), or install DeepSpeed with "
                         f"DS_BUILD_{name.upper().removeprefix('DEEPSPEED_')}=1 pip install deepspeed")
    summary = (f"prebuilt or built: {', '.join(ready) or 'none'}; "
               f"compatible (JIT on first use): {sum(o['compatible'] for o in ops.values())}/{len(ops)}; "
               f"ninja {'yes' if report['ninja'] else 'no'}")
    detail = "; ".join(lines + [summary])
    return Check(name="ops", status=status, detail=detail, data={**report, "needed": needed},
                 hint="; ".join(hints) or None)


def check_ops(*, python: str = sys.executable, needed: dict[str, str]) -> Check:
    code = f"import json; from dstk.launch.doctor import op_report; print({OPS_TAG!r} + json.dumps(op_report()))"
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return judge_ops(None, needed=needed, error=str(exc))
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith(OPS_TAG)), None)
    if line is None:
        return judge_ops(None, needed=needed, error=out.stderr.strip())
    return judge_ops(json.loads(line[len(OPS_TAG):]), needed=needed)


VERSION_KEYS = ("python", "torch", "deepspeed", "nccl", "cuda")


def judge_versions(probes: dict[str, dict]) -> Check:
    """Pure: do all hosts run the same python/torch/deepspeed/NCCL/CUDA? ``probes`` maps a host to its
    ``dstk.launch.probe`` output, the launching host first (its versions are the ones to install). A rank that meets another version fails at its first collective
    (NCCL) or loads checkpoints the other cannot read (torch/deepspeed)."""
    differ = {}
    for key in VERSION_KEYS:
        values = {host: info.get(key) for host, info in probes.items()}
        if len(set(values.values())) > 1:
            differ[key] = values
    if not differ:
        first = next(iter(probes.values()), {})
        same = ", ".join(f"{k} {first.get(k)}" for k in VERSION_KEYS if first.get(k) is not None)
        return Check(name="versions agree", status="ok", detail=f"{len(probes)} host(s): {same}",
                     data={"hosts": sorted(probes)})
    parts = ["; ".join(f"{k}: " + ", ".join(f"{v} on {h}" for h, v in vals.items()) for k, vals in differ.items())]
    pins = []
    for key in ("torch", "deepspeed"):
        if key in differ:
            local = next(iter(probes.values())).get(key)  # the launching host's, listed first
            pins.append(f"{key}=={local}")
    hint = ("install the same versions on every host" + (f": pip install {' '.join(pins)}" if pins else "")
            + (" (the same CUDA build of torch brings the same NCCL)" if "nccl" in differ or "cuda" in differ else "")
            + ("; the same python minor version" if "python" in differ else ""))
    return Check(name="versions agree", status="fail", detail=parts[0], data={"differ": differ}, hint=hint)


LIMITS_COMMAND = "ulimit -l; df -B1 --output=size,avail /dev/shm | tail -n 1"
"""What ``check_host_limits`` runs on each host (a POSIX shell and GNU df; no python needed)."""


def parse_limits(text: str) -> tuple[int | None, shm.ShmSpace | None] | None:
    """(memlock bytes or None for unlimited, /dev/shm space) from ``LIMITS_COMMAND``'s output; None if unreadable."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    if not lines:
        return None
    memlock = None if lines[0] == "unlimited" else int(lines[0]) * 1024 if lines[0].isdigit() else -1
    if memlock == -1:
        return None
    space = None
    if len(lines) > 1 and len(fields := lines[1].split()) == 2 and all(f.isdigit() for f in fields):
        space = shm.ShmSpace(path="/dev/shm", total_bytes=int(fields[0]), free_bytes=int(fields[1]))
    return memlock, space


def check_host_limits(host: Host, *, ranks_per_node: int, num_nodes: int, cpu: bool, timeout_s: int = 10) -> list[Check]:
    """``memlock@HOST`` and ``shm@HOST``: the same judgements as on this host, over the same ssh as the probe."""
    ssh = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={timeout_s}", "-o", "PasswordAuthentication=no", host.name]
    try:
        out = subprocess.run([*ssh, LIMITS_COMMAND], capture_output=True, text=True, timeout=timeout_s + 20)
        parsed = parse_limits(out.stdout) if out.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        parsed = None
    if parsed is None:
        return [Check(name=f"limits@{host.name}", status="warn", detail="could not read ulimit -l and /dev/shm there",
                      hint=f"check by hand: ssh {host.name} '{LIMITS_COMMAND}'")]
    memlock, space = parsed
    need, text = shm_need_bytes(ranks_per_node=ranks_per_node, num_nodes=num_nodes, cpu=cpu)
    return [dataclasses.replace(judge_memlock(soft_bytes=memlock, cpu=cpu), name=f"memlock@{host.name}"),
            dataclasses.replace(judge_shm(space=space, need_bytes=need, need_text=text, leaked=[]),
                                name=f"shm@{host.name}")]
