"""DeepSpeed's CPU Adam (optimizer offload) on this machine, next to dstk's memory-bandwidth formula
(``dstk.hardware.host_optimizer_seconds``).

    .venv/bin/python benchmarks/cpu_adam.py [--params 50e6] [--procs 1 2] [--threads default 1] [--steps 10]

The real ``deepspeed.ops.adam.DeepSpeedCPUAdam`` (the ``cpu_adam`` op, built just in time into the
default ``~/.cache/torch_extensions`` on first use) steps ``--params`` fp32 parameters in
1 and in 2 processes started together, as the ranks of a node step at once under offload.
``--threads``: each process's OpenMP threads, set as ``OMP_NUM_THREADS`` before torch loads
(the op's ``#pragma omp`` loops run on torch's libgomp): ``default`` leaves it unset, as
DeepSpeed's launcher does without ``--bind_cores_to_rank`` (torch then runs a thread a core, so N
processes oversubscribe the cores N times); ``1`` is torchrun's setting, or the fix on this
2-core machine with 2 processes. Each step, every process runs, each phase started at a barrier:

1. a STREAM triad on its own arrays (``torch.add(p, grad, alpha=0, out=scratch)``: 12 bytes an
   element by STREAM's count), timed: the node's bandwidth at that moment is all processes'
   bytes over the slowest one's time;
2. ``optimizer.step()`` alone: ``CPU_ADAM_BYTES_PER_PARAM`` (28) bytes a parameter;
3. ZeRO-1/2's host step in bf16 with clipping on (DeepSpeed's default): ``grad.mul_`` of
   ``unscale_and_clip_grads``, the Adam step, the fp32 -> bf16 copy into the 16-bit buffer (42 B,
   ``host_optimizer_bytes_per_param``);
4. the same with ``gradient_clipping`` 0 (the unscale returns early): Adam and the copy (34 B);
5. ZeRO-3's host step in fp16: the overflow check of the fp16 gradient buffer
   (``isinf(buf).any()``, ``isnan(buf).any()``), the unscale, Adam, the copy (54 B).

The formula's time for each phase is ``host_optimizer_seconds`` at the triad measured just before,
so both sides see the same load (this machine is shared); the script prints, over the steps after
one warm-up, the median and range of predicted / measured time (the node's step ends with its
slowest process) and the median rates.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


PHASES = (  # (label, host_optimizer_bytes_per_param's case; None: Adam alone, CPU_ADAM_BYTES_PER_PARAM)
    ("adam", None),
    ("z2 bf16 clip", {"precision": "bf16", "zero_stage": 2, "gradient_clipping": 1.0}),
    ("z2 bf16 noclip", {"precision": "bf16", "zero_stage": 2, "gradient_clipping": 0.0}),
    ("z3 fp16", {"precision": "fp16", "zero_stage": 3, "gradient_clipping": 1.0}),
)


def _worker(rank: int, params: int, steps: int, threads: int | None, barrier, queue) -> None:
    """One process: DeepSpeedCPUAdam over ``params`` fp32 parameters; per step, the seconds of the
    triad and of each of ``PHASES``."""
    if threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(threads)  # before torch loads its OpenMP runtime
    import time

    import torch

    from deepspeed.ops.adam import DeepSpeedCPUAdam

    torch.manual_seed(rank)
    p = torch.nn.Parameter(torch.rand(params))
    p.grad = torch.rand(params) * 1e-3
    opt = DeepSpeedCPUAdam([p], lr=1e-4, weight_decay=0.1, adamw_mode=True)
    bit16 = torch.empty(params, dtype=torch.bfloat16)
    half = torch.empty(params, dtype=torch.float16)
    grad16 = (p.grad * 1e3).half()  # ZeRO-3's grad_partitions_flat_buffer: the model's dtype, on the host
    scratch = torch.empty(params)
    scale = torch.tensor(1.0)

    def clip_on():
        p.grad.mul_(1.0 / scale)  # unscale_and_clip_grads
        opt.step()
        bit16.copy_(p.data)  # bit16_partition_buffer.data.copy_(fp32_partition.data)

    def clip_off():
        opt.step()
        bit16.copy_(p.data)

    def zero3_fp16():
        bool(torch.isinf(grad16).any()) or bool(torch.isnan(grad16).any())  # stage3.py has_overflow
        p.grad.mul_(1.0 / scale)
        opt.step()
        half.copy_(p.data)  # fp16_partitioned_groups_flat[...].copy_, converted on the host

    phases = (opt.step, clip_on, clip_off, zero3_fp16)
    for fn in phases:  # warm-up: creates exp_avg / exp_avg_sq (first touch of their pages)
        fn()
    torch.add(p.data, p.grad, alpha=0.0, out=scratch)
    rows = []
    for _ in range(steps):
        barrier.wait()
        t0 = time.perf_counter()
        torch.add(p.data, p.grad, alpha=0.0, out=scratch)
        row = [time.perf_counter() - t0]
        for fn in phases:
            barrier.wait()
            t0 = time.perf_counter()
            fn()
            row.append(time.perf_counter() - t0)
        rows.append(tuple(row))
    queue.put((rank, torch.get_num_threads(), rows))


def run_processes(*, num_procs: int, params: int, steps: int,
                  threads: int | None = None) -> tuple[int, list[tuple[float, ...]]]:
    """Each process's threads and, per step, the seconds (triad, then ``PHASES``) of the slowest of
    ``num_procs`` processes started together."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(num_procs)
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, params, steps, threads, barrier, queue)) for r in range(num_procs)]
    for proc in procs:
        proc.start()
    out = [queue.get(timeout=1800) for _ in procs]
    for proc in procs:
        proc.join()
        if proc.exitcode:
            raise SystemExit(f"a CPU Adam process exited {proc.exitcode}")
    per_rank = [rows for _, _, rows in out]
    width = len(per_rank[0][0])
    return out[0][1], [tuple(max(rank[i][j] for rank in per_rank) for j in range(width)) for i in range(steps)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, default=50e6, help="parameters per process (default 50e6)")
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 2], help="process counts (default 1 2)")
    parser.add_argument("--threads", nargs="+", default=["default", "1"],
                        help="OpenMP threads per process: 'default' (unset) or a number (default: default 1)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per process count (default 10)")
    args = parser.parse_args(argv)
    try:
        thread_counts = [None if t == "default" else int(t) for t in args.threads]
    except ValueError:
        parser.error(f"--threads: expected 'default' or whole numbers, got {' '.join(args.threads)}")
    if any(t is not None and t < 1 for t in thread_counts):
        parser.error("--threads: a thread count is at least 1")

    import torch

    from dstk import hardware as hw

    params = int(args.params)
    nbytes = [hw.CPU_ADAM_BYTES_PER_PARAM if case is None else
              hw.host_optimizer_bytes_per_param(optimizer="adamw", **case) for _, case in PHASES]
    print(f"machine: {os.cpu_count()} CPUs, torch {torch.__version__}, load average {os.getloadavg()[0]:.1f}")
    print(f"{params / 1e6:.0f}M fp32 parameters per process, {args.steps} steps; bytes per parameter: "
          + ", ".join(f"{label} {b:g}" for (label, _), b in zip(PHASES, nbytes)))
    print(f"{'procs':>5} {'threads':>7} {'what':>14} {'node triad GB/s':>15} {'measured Mparam/s/proc':>23} "
          f"{'predicted':>10} {'ratio median [min, max]':>24}")
    for n in args.procs:
        for threads in thread_counts:
            got, rows = run_processes(num_procs=n, params=params, steps=args.steps, threads=threads)
            bandwidths = [n * 12 * params / row[0] for row in rows]
            for column, ((what, _), per_param) in enumerate(zip(PHASES, nbytes), start=1):
                ratios = [hw.host_optimizer_seconds(params_per_rank=params, ranks_per_node=n,
                                                    host_dram_bytes_per_s=bw, bytes_per_param=per_param) / row[column]
                          for bw, row in zip(bandwidths, rows)]
                measured = statistics.median(params / row[column] for row in rows)
                predicted = statistics.median(bw / (n * per_param) for bw in bandwidths)
                label = f"{got}" + ("" if threads is not None else " (unset)")
                print(f"{n:>5} {label:>7} {what:>14} {statistics.median(bandwidths) / 1e9:>15.1f} "
                      f"{measured / 1e6:>23.0f} {predicted / 1e6:>10.0f} {statistics.median(ratios):>8.2f} "
                      f"[{min(ratios):.2f}, {max(ratios):.2f}]")
    print(f"ratio = predicted / measured time, step by step (1 = exact; > 1: the formula is too slow); "
          f"load average now {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
