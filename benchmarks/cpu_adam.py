"""DeepSpeed's CPU Adam (optimizer offload) on this machine, next to dstk's memory-bandwidth formula
(``dstk.hardware.host_optimizer_seconds``).

    .venv/bin/python benchmarks/cpu_adam.py [--params 50e6] [--procs 1 2] [--steps 10]

The real ``deepspeed.ops.adam.DeepSpeedCPUAdam`` (the ``cpu_adam`` op, built just in time into the
default ``~/.cache/torch_extensions`` on first use) steps ``--params`` fp32 parameters in
1 and in 2 processes started together, as the ranks of a node step at once under offload (each
with torch's default threads, as DeepSpeed's launcher leaves them without ``--bind_cores_to_rank``).
Each step, every process runs, each phase started at a barrier:

1. a STREAM triad on its own arrays (``torch.add(p, grad, alpha=0, out=scratch)``: 12 bytes an
   element by STREAM's count), timed: the node's bandwidth at that moment is all processes'
   bytes over the slowest one's time;
2. ``optimizer.step()`` alone: ``CPU_ADAM_BYTES_PER_PARAM`` (28) bytes a parameter;
3. the host step DeepSpeed's ZeRO offload runs (``grad.mul_`` of ``unscale_and_clip_grads``, the
   Adam step, the fp32 -> bf16 copy into the 16-bit buffer): ``host_optimizer_bytes_per_param``
   (42 bytes).

The formula's time for the step is ``host_optimizer_seconds`` at the triad measured just before,
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
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def _worker(rank: int, params: int, steps: int, barrier, queue) -> None:
    """One process: DeepSpeedCPUAdam over ``params`` fp32 parameters; ``(triad, adam, host step)``
    seconds of each of ``steps`` steps."""
    import torch

    from deepspeed.ops.adam import DeepSpeedCPUAdam

    torch.manual_seed(rank)
    p = torch.nn.Parameter(torch.rand(params))
    p.grad = torch.rand(params) * 1e-3
    opt = DeepSpeedCPUAdam([p], lr=1e-4, weight_decay=0.1, adamw_mode=True)
    bit16 = torch.empty(params, dtype=torch.bfloat16)
    scratch = torch.empty(params)
    scale = torch.tensor(1.0)
    opt.step()  # warm-up: creates exp_avg / exp_avg_sq (first touch of their pages)
    bit16.copy_(p.data)
    torch.add(p.data, p.grad, alpha=0.0, out=scratch)
    rows = []
    for _ in range(steps):
        barrier.wait()
        t0 = time.perf_counter()
        torch.add(p.data, p.grad, alpha=0.0, out=scratch)
        triad = time.perf_counter() - t0
        barrier.wait()
        t0 = time.perf_counter()
        opt.step()
        adam = time.perf_counter() - t0
        barrier.wait()
        t0 = time.perf_counter()
        p.grad.mul_(1.0 / scale)  # unscale_and_clip_grads
        opt.step()
        bit16.copy_(p.data)  # bit16_partition_buffer.data.copy_(fp32_partition.data)
        rows.append((triad, adam, time.perf_counter() - t0))
    queue.put((rank, rows))


def run_processes(*, num_procs: int, params: int, steps: int) -> list[tuple[float, float, float]]:
    """Per step, ``(triad, adam, host step)`` seconds of the slowest of ``num_procs`` processes
    started together."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(num_procs)
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, params, steps, barrier, queue)) for r in range(num_procs)]
    for proc in procs:
        proc.start()
    out = [queue.get(timeout=1800) for _ in procs]
    for proc in procs:
        proc.join()
        if proc.exitcode:
            raise SystemExit(f"a CPU Adam process exited {proc.exitcode}")
    per_rank = [rows for _, rows in out]
    return [tuple(max(rank[i][j] for rank in per_rank) for j in range(3)) for i in range(steps)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, default=50e6, help="parameters per process (default 50e6)")
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 2], help="process counts (default 1 2)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per process count (default 10)")
    args = parser.parse_args(argv)

    import torch

    from dstk import hardware as hw

    params = int(args.params)
    adam_bytes = hw.CPU_ADAM_BYTES_PER_PARAM
    host_bytes = hw.host_optimizer_bytes_per_param(optimizer="adamw", precision="bf16")
    print(f"machine: {os.cpu_count()} CPUs, torch {torch.__version__} with {torch.get_num_threads()} threads, "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"{params / 1e6:.0f}M fp32 parameters per process, {args.steps} steps; bytes per parameter: "
          f"adam {adam_bytes}, host step {host_bytes:g}")
    print(f"{'procs':>5} {'what':>9} {'node triad GB/s':>15} {'measured Mparam/s/proc':>23} {'predicted':>10} "
          f"{'ratio median [min, max]':>24}")
    for n in args.procs:
        rows = run_processes(num_procs=n, params=params, steps=args.steps)
        bandwidths = [n * 12 * params / triad for triad, _, _ in rows]
        for what, column, nbytes in (("adam", 1, adam_bytes), ("host step", 2, host_bytes)):
            ratios = [hw.host_optimizer_seconds(params_per_rank=params, ranks_per_node=n, host_dram_bytes_per_s=bw,
                                                bytes_per_param=nbytes) / row[column]
                      for bw, row in zip(bandwidths, rows)]
            measured = statistics.median(params / row[column] for row in rows)
            predicted = statistics.median(bw / (n * nbytes) for bw in bandwidths)
            print(f"{n:>5} {what:>9} {statistics.median(bandwidths) / 1e9:>15.1f} {measured / 1e6:>23.0f} "
                  f"{predicted / 1e6:>10.0f} {statistics.median(ratios):>8.2f} "
                  f"[{min(ratios):.2f}, {max(ratios):.2f}]")
    print(f"ratio = predicted / measured time, step by step (1 = exact; > 1: the formula is too slow); "
          f"load average now {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
