"""Name why a run failed, from the ranks' output, with a fix.

A failed launch ends in hundreds of lines of tracebacks from every rank; the cause is usually one
line among them. ``diagnose`` scans the tail of the output for the failures people hit on GPU
clusters and on CPU ranks, and returns one ``Diagnosis`` per cause found, most specific first.
Pure: strings in, data out (the patterns are the messages torch, NCCL, gloo, DeepSpeed and the
kernel print; the tests feed it real failing runs on CPU ranks, and log excerpts written here in
the exact formats of the GPU-only messages).
"""

from __future__ import annotations

import dataclasses
import re
import signal


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class Diagnosis:
    code: str
    """Stable name: ``gpu-oom``, ``host-oom``, ``nccl-timeout``, ``gloo-timeout``, ``port-in-use``,
    ``master-unreachable``, ``op-build``, ``killed``, ``bus-error``, ``segfault``, ``exit-abort``,
    ``resume`` (how to go on after lost ranks: ``resume_hint``)."""
    cause: str
    fix: str
    line: str | None = None
    """The output line that gave it away (rank prefix included), when there is one."""

    def render(self) -> str:
        text = f"cause: {self.cause}"
        if self.line:
            text += f"\n  seen: {self.line.strip()[:240]}"
        return text + f"\n  fix: {self.fix}"


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.1f} GiB"


def _plan_memory(plan: dict | None) -> str:
    """The plan's per-GPU figure, for next to an OOM."""
    if not plan:
        return ""
    try:
        total = plan["memory"]["per_gpu"]["total_bytes"]
        usable = plan["cluster"]["usable_bytes"]
        return f" The plan estimated {_gib(total)} per GPU of {_gib(usable)} usable."
    except (KeyError, TypeError):
        return ""


def _smaller_layouts(plan: dict | None, limit: int = 3) -> str:
    """The plan's alternatives that need less memory than its pick, smallest first."""
    if not plan:
        return ""
    try:
        chosen = plan["memory"]["per_gpu"]["total_bytes"]
        alts = sorted((a for a in plan.get("alternatives", []) if a["total_bytes"] < chosen),
                      key=lambda a: a["total_bytes"])
    except (KeyError, TypeError):
        return ""
    if not alts:
        return ""
    from dstk.plan import describe
    from dstk.layout import Layout

    names = []
    for a in alts[:limit]:
        try:
            names.append(f"{describe(Layout.from_dict(a['layout']))} ({_gib(a['total_bytes'])})")
        except (TypeError, ValueError, KeyError):
            continue
    return (" Layouts of this plan that need less: " + "; ".join(names) + ".") if names else ""


# (code, compiled pattern) in the order they are tried; the first match of each code is kept.
_PATTERNS: list[tuple[str, re.Pattern]] = [(code, re.compile(p, re.I)) for code, p in (
    ("gpu-oom", r"(CUDA|HIP|XPU|NPU) out of memory|OutOfMemoryError|CUDA error: out of memory|"
                r"CUBLAS_STATUS_ALLOC_FAILED"),
    ("host-oom", r"DefaultCPUAllocator: (can't|not enough memory)|std::bad_alloc|Cannot allocate memory|"
                 r"(?<![A-Za-z])MemoryError"),
    ("nccl-timeout", r"Watchdog caught collective operation timeout|ProcessGroupNCCL.*(timed? ?out|watchdog)|"
                     r"heartbeat monitor|NCCL communicator was aborted|ncclSystemError|ncclRemoteError|"
                     r"NCCL error"),
    ("gloo-timeout", r"gloo.*Timed out|Timed out waiting \d+ms for (recv|send)|Connection closed by peer|"
                     r"Gloo connectFullMesh failed"),
    ("port-in-use", r"EADDRINUSE|Address already in use|failed to listen on any local network address"),
    ("master-unreachable", r"(DistNetworkError|TCPStore|rendezvous|c10d).*(Connection refused|timed out|"
                           r"Name or service not known|No route to host|could not be resolved)|"
                           r"client socket has timed out"),
    ("op-build", r"Error building extension|ninja: build stopped|Command '\['ninja'|"
                 r"CUDA_HOME does not exist|MissingCUDAException|No module named 'deepspeed\.ops\."),
    ("bus-error", r"\bBus error\b|DataLoader worker .* is killed by signal: Bus error|"
                  r"unable to (write to|open shared memory)|No space left on device.*shm"),
    ("exit-abort", r"terminate called without an active exception"),
)]


def _fix(code: str, *, plan: dict | None) -> tuple[str, str]:
    mem = _plan_memory(plan)
    if code == "gpu-oom":
        return ("a rank ran out of GPU memory." + mem,
                "plan with more headroom or a smaller micro-batch (`dstk plan INTENT --headroom 0.2`, or "
                "`--micro-batch 1`), or a memory-saving layout (`--zero 3`, `--recompute full`, "
                "`--offload-optimizer cpu`); `dstk estimate --config RUN/ds_config.json` shows the buffers "
                "that take the room." + _smaller_layouts(plan))
    if code == "host-oom":
        host = ""
        if plan and (plan.get("memory") or {}).get("cpu_bytes"):
            host = f" The plan's CPU offload needs {_gib(plan['memory']['cpu_bytes'])} of host memory per rank."
        return ("a rank ran out of host (CPU) memory." + host,
                "free host memory or start fewer ranks per node; with CPU offload, plan with "
                "`--no-offload` or more nodes; check `free -g` on each node")
    if code == "nccl-timeout":
        return ("an NCCL collective timed out or was aborted: a rank stopped taking part (crashed, "
                "hung, or slower by minutes), or the network between nodes failed.",
                "find the first rank that failed above; rerun with NCCL_DEBUG=INFO "
                "(`dstk launch RUN --env NCCL_DEBUG=INFO`); raise the watchdog with "
                "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC and DeepSpeed's `comms_timeout` only if a step really is "
                "that slow; try the network's NCCL profile (`--nccl-profile ib|roce|ethernet`) and "
                "`dstk doctor --hosts ...` to time an all-reduce across the nodes")
    if code == "gloo-timeout":
        return ("a gloo collective timed out or lost its peer: another rank crashed or hung.",
                "look for the first rank that failed above; on CPU ranks give each rank enough memory and "
                "cores (`--ranks` fewer), and rerun")
    if code == "port-in-use":
        return ("the rendezvous port is taken: another job (or a rank of an earlier run still alive) "
                "listens on it.",
                "pass a free port (`dstk launch RUN --master-port 29611`, or leave it out and dstk picks a "
                "free one); `ss -ltnp | grep PORT` names the holder")
    if code == "master-unreachable":
        return ("the ranks could not reach the rendezvous master.",
                "give `--master-addr` an address every node can reach (not 127.0.0.1 across nodes), open "
                "the port between nodes, and check that every host name in the hostfile resolves")
    if code == "op-build":
        return ("DeepSpeed could not build one of its C++/CUDA ops on this machine.",
                "install a compiler (and a CUDA toolkit matching torch's for GPU ops: CUDA_HOME), or "
                "prebuild at install time (`DS_BUILD_FUSED_ADAM=1 pip install deepspeed`), or avoid the "
                "op (`\"torch_adam\": true` in the optimizer params); `ds_report` lists what is built")
    if code == "bus-error":
        return ("a process hit a bus error: shared memory (/dev/shm) is too small or full.",
                "give the container more shared memory (`docker run --shm-size=16g`, or a larger /dev/shm "
                "mount), or fewer DataLoader workers")
    if code == "exit-abort":
        return ("a rank aborted in native code (std::terminate). When it comes after the script's last line "
                "on CPU ranks, it is torch's gloo backend at interpreter exit: a gloo thread releases the last "
                "collective's tensors while Python finalizes.",
                "end the training script with `from dstk.launch.rank import exit_rank; exit_rank()` (barrier, "
                "destroy the process group, exit without finalizing), as examples/train.py does; otherwise look "
                "for the native library that aborted (`coredumpctl` or gdb on the core)")
    raise KeyError(code)


def diagnose(lines: list[str], *, signals: tuple[int, ...] = (), plan: dict | None = None) -> list[Diagnosis]:
    """Causes found in ``lines`` (the tail of the ranks' output), and from ``signals`` (the signal
    numbers ranks were killed by), most specific first."""
    found: dict[str, Diagnosis] = {}
    for line in lines:
        for code, pattern in _PATTERNS:
            if code not in found and pattern.search(line):
                cause, fix = _fix(code, plan=plan)
                found[code] = Diagnosis(code=code, cause=cause, fix=fix, line=line)
    out = [found[code] for code, _ in _PATTERNS if code in found]
    for sig in dict.fromkeys(signals):
        if sig == signal.SIGKILL and "gpu-oom" not in found:
            host = ""
            if plan and (plan.get("memory") or {}).get("cpu_bytes"):
                host = f" (the plan's CPU offload needs {_gib(plan['memory']['cpu_bytes'])} of host memory per rank)"
            out.append(Diagnosis(
                code="killed",
                cause="a rank was killed by SIGKILL: most often the kernel's OOM killer, when the node ran out "
                      "of host memory" + host + ", or a scheduler enforcing a limit (Slurm, Kubernetes).",
                fix="check `dmesg -T | grep -i -E 'killed process|out of memory'` on the node and the job's "
                    "memory limit; then go on from the last checkpoint (the resume line, when dstk knows the run)"))
        elif sig == signal.SIGSEGV:
            out.append(Diagnosis(code="segfault", cause="a rank crashed with a segmentation fault (native code: "
                                 "an op built for another torch, a driver or library mismatch).",
                                 fix="check that torch, DeepSpeed and the driver match on every node "
                                     "(`dstk doctor`), rebuild DeepSpeed's ops (`rm -rf ~/.cache/torch_extensions`)"))
        elif sig == signal.SIGBUS and "bus-error" not in found:
            cause, fix = _fix("bus-error", plan=plan)
            out.append(Diagnosis(code="bus-error", cause=cause, fix=fix))
    return out


def resume_hint(*, world_size: int, lost_ranks: tuple[int, ...], finetune_output: str | None = None,
                trainer: str = "native") -> Diagnosis | None:
    """How to go on after ``lost_ranks`` (killed by a signal, or never reported) of ``world_size``
    died: on the ranks that remain, from the newest checkpoint. For a ``dstk finetune`` run
    (``finetune_output``) that is one command (``dstk.train.elastic``: re-plan with the same global
    batch, DeepSpeed's universal checkpoint); for a user's script, what the script needs for
    DeepSpeed's universal checkpoint (deepspeed/checkpoint/ds_to_universal.py, ``load_universal``)."""
    lost = sorted(set(lost_ranks))
    if not lost:
        return None
    remaining = world_size - len(lost)
    who = f"rank{'s' if len(lost) > 1 else ''} {', '.join(map(str, lost))} of {world_size}"
    if finetune_output is not None:
        same = f"dstk finetune --resume --output {finetune_output}"
        if remaining < 1 or trainer != "native":
            return Diagnosis(code="resume", cause=f"{who} lost; the run stopped at its last complete checkpoint.",
                             fix=f"once the GPUs are back: {same}")
        return Diagnosis(code="resume", cause=f"{who} lost; {remaining} remain.",
                         fix=f"resume on the {remaining} remaining GPU{'s' if remaining > 1 else ''}: {same} --gpus "
                             f"{remaining} (the same global batch with more accumulation steps; the newest complete "
                             f"checkpoint is converted to DeepSpeed's universal checkpoint), or on all {world_size} "
                             f"once they are back: {same}")
    if remaining < 1:
        return None
    return Diagnosis(code="resume", cause=f"{who} lost; {remaining} remain.",
                     fix=f"to go on with the {remaining} remaining GPU{'s' if remaining > 1 else ''}, your script "
                         "needs checkpoints (`engine.save_checkpoint(DIR, tag)`) and a data position that depends on "
                         "the global step, not on the rank; convert the newest one (`python -m "
                         "deepspeed.checkpoint.ds_to_universal --input_folder DIR/TAG --output_folder "
                         "DIR/TAG-universal --inject_missing_state`), plan for the remaining GPUs with the same "
                         f"global batch (`dstk generate INTENT --gpus {remaining} --global-batch B`), add "
                         "\"checkpoint\": {\"load_universal\": true} to that ds_config.json, and load with "
                         "`engine.load_checkpoint(DIR, tag=\"TAG-universal\")`")
