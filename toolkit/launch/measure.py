"""Hardware microbenchmarks on every launched rank: ``python -m dstk.launch.measure``.

Started by ``dstk doctor --calibrate`` through the same runner as training, so every rank
measures while the others do too (on CPU ranks they share the cores and the memory bus, as in
training). Each rank measures, in this order, with a barrier between the parts:

- **GEMM sweep**: for each ``d`` of ``--dims`` (``m = max(--tokens, d)`` rows: tokens per
  micro-batch), the three GEMMs a ``d x d`` linear layer runs in a training step, in the compute
  precision and with the operands' layout as autograd hands them to the BLAS: forward
  ``y = x W^T`` (``m x d x d``), input gradient ``dx = dy W`` (``m x d x d``) and weight gradient
  ``dW = dy^T x`` (``d x m x d``, reduced over the tokens). ``3 x 2 m d^2`` FLOPs (Kaplan et al.
  2020 §2.1: a multiply-add is 2 FLOPs; the backward pass runs twice the forward's GEMM FLOPs).
  The shapes are timed **interleaved**: every round times one batch of each shape in turn, and a
  shape's figure is its fastest round (``time_interleaved``). On a shared CPU host a burst of load
  from other processes lasts longer than one shape's batches: timed back to back, every batch of
  the shape it hits is slow (seen here: a bf16 ``512 x 32 x 32`` GEMM at 6.9 ms instead of 22 us
  with two OpenMP threads while another process held a core, 300x; the curve point then priced
  every small GEMM at a third of a percent of the peak); interleaved, some round of every shape
  falls outside it. Load only adds time, so the fastest round is the least disturbed.
- **Memory bandwidth**: ``dst.copy_(src)`` of ``--copy-bytes``, counted as 2 bytes moved per byte
  copied (one read, one write), as STREAM's "Copy" kernel counts it (McCalpin, STREAM benchmark
  documentation). The buffers must be several times the last-level cache (GPU L2, CPU L3).
- **Operator floor**: the time of one small elementwise operator (a 1-element in-place add) in a
  loop: the dispatch + launch cost every operator pays whatever its size.
- **Layer floor** (``GPU.layer_overhead_seconds``): what one more transformer layer adds to a
  training step of a small model, whose FLOPs and bytes are negligible next to its operators'
  fixed costs: a DeepSpeed step (forward, backward, AdamW, gradient all-reduce; ZeRO 0 in the
  compute precision) of a Llama (transformers' ``LlamaForCausalLM``) with ``FLOOR_MODEL``'s widths
  and micro-batch, with 1 and with ``1 + LAYER_DELTA`` layers, the difference over
  ``LAYER_DELTA``. It is the cost of the ~100 operators a layer dispatches (and launches, on a
  GPU) with the engine's and the optimizer's per-tensor work; the 1-layer step minus it is the
  step's fixed cost (embedding, head, loss, engine). An operator's fixed cost on a CPU grows with
  its tensors well below the sizes where its bytes count (the tiny Llama's layer, hidden 64 and
  256 tokens a rank, ran 7.4-12.7 ms a layer where hidden 32 and 32 tokens ran 4-7 ms, both
  ~20x their FLOPs and bytes at the sweep's rates): the floor is measured at a real small model's
  widths, not at vanishing ones. Skipped (None) where transformers is not installed.
- **ZeRO's host work** (CPU ranks, ``dstk.launch.zero_cost``): DeepSpeed steps of the same Llama
  under ZeRO 0, 1 and 3, for ``GPU.zero_tensor_seconds`` / ``zero3_tensor_seconds``.

Timing: ``--warmup`` untimed calls, then the iteration count is doubled until one batch takes
``--min-seconds / 5``, then 5 batches are timed: the GEMMs in interleaved rounds (the fastest
round), the copy and the operator floor back to back (the median batch).
On a GPU each batch is timed with CUDA events (``torch.cuda.Event(enable_timing=True)``); on a
CPU with ``time.perf_counter`` after the accelerator's synchronize.

Rank 0 prints one line ``DSTK_MEASURE {json}`` holding every rank's figures (gathered with
``all_gather_object``). Then the all-reduce of ``dstk.launch.allreduce`` runs on the same process
group (same sizes, warm-up and bandwidth definitions as ``dstk doctor``) and prints its
``DSTK_ALLREDUCE`` lines.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

TAG = "DSTK_MEASURE "
LAYER_DELTA = 4
ROUNDS = 5
"""Interleaved rounds of the GEMM sweep (``time_interleaved``)."""
FLOOR_MODEL = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
               "vocab_size": 512, "micro_batch": 4, "seq_len": 64}
"""The layer floor's Llama: the widths and micro-batch of ``examples/intents/tiny-llama-cpu.yaml``, the
smallest model dstk plans (a CPU rank's demo). Its layer's GEMMs (57 MFLOP forward + backward) take
~0.3 ms at a CPU rank's ~0.2 TFLOP/s, 3-4% of the 8-13 ms the layer takes here."""
_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def _timer(device):
    """A function ``time(fn, n) -> seconds`` for ``n`` calls of ``fn`` on ``device``."""
    import torch

    if device.type == "cuda":
        def run(fn, n: int) -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(n):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        return run

    if device.type == "cpu":
        sync = lambda: None  # noqa: E731 - CPU operators finish before they return
    else:
        from deepspeed.accelerator import get_accelerator

        sync = get_accelerator().synchronize

    def run(fn, n: int) -> float:
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        return time.perf_counter() - t0
    return run


def time_call(fn, *, timer, warmup: int, min_seconds: float, batches: int = 5, fixed_n: int | None = None) -> float:
    """Seconds per call of ``fn``: the median of ``batches`` timed batches (module docstring);
    ``fixed_n`` calls a batch instead of the doubling (where every rank must call ``fn`` as often)."""
    for _ in range(warmup):
        fn()
    n = fixed_n or 1
    while fixed_n is None:
        t = timer(fn, n)
        if t >= min_seconds / batches or n >= 1 << 20:
            break
        n *= 2
    return statistics.median(timer(fn, n) for _ in range(batches)) / n


def time_interleaved(fns: list, *, timer, warmup: int, min_seconds: float, rounds: int = ROUNDS) -> list[float]:
    """Seconds per call of each of ``fns``: warm-up calls and the doubling of ``time_call`` per fn
    (a batch of ``min_seconds / rounds``), then ``rounds`` rounds, each timing one batch of every fn
    in turn; per fn its fastest round (module docstring: a burst of load hits one round, not every
    batch of one fn)."""
    counts = []
    for fn in fns:
        for _ in range(warmup):
            fn()
        n = 1
        while timer(fn, n) < min_seconds / rounds and n < 1 << 20:
            n *= 2
        counts.append(n)
    best = [float("inf")] * len(fns)
    for _ in range(rounds):
        for i, (fn, n) in enumerate(zip(fns, counts)):
            best[i] = min(best[i], timer(fn, n) / n)
    return best


def linear_gemms(*, m: int, d: int, dtype, device):
    """One call of the three GEMMs of a ``d x d`` linear layer over ``m`` tokens in training (module
    docstring), with the operand layouts autograd passes (``W^T`` and ``dy^T`` as transposed views)."""
    import torch

    x, dy = (torch.randn(m, d, dtype=dtype, device=device) for _ in range(2))
    w = torch.randn(d, d, dtype=dtype, device=device)
    y, dx, dw = torch.empty(m, d, dtype=dtype, device=device), torch.empty_like(x), torch.empty_like(w)

    def run():
        torch.matmul(x, w.t(), out=y)
        torch.matmul(dy, w, out=dx)
        torch.matmul(dy.t(), x, out=dw)
    return run


def measure_rank(*, device, precision: str, dims: list[int], tokens: int, copy_bytes: int, warmup: int,
                 min_seconds: float, barrier=lambda: None, layer_floor: str = "torch") -> dict:
    """This rank's figures: GEMM FLOP/s per ``d``, copy bandwidth, operator and layer floors
    (``layer_floor``: ``deepspeed`` on launched ranks, ``torch`` in one process, or ``none``)."""
    import torch

    timer = _timer(device)
    dtype = getattr(torch, _DTYPES[precision])
    barrier()
    shapes = [(max(tokens, d), d) for d in dims]
    fns = [linear_gemms(m=m, d=d, dtype=dtype, device=device) for m, d in shapes]
    seconds = time_interleaved(fns, timer=timer, warmup=warmup, min_seconds=min_seconds)
    gemm = [{"m": m, "n": d, "k": d, "seconds": s, "flops_per_s": 3 * 2.0 * m * d * d / s}
            for (m, d), s in zip(shapes, seconds)]
    del fns
    barrier()
    src = torch.ones(copy_bytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    copy_s = time_call(lambda: dst.copy_(src), timer=timer, warmup=warmup, min_seconds=min_seconds)
    moved = 2 * src.numel() * 4
    del src, dst
    barrier()
    x = torch.zeros(1, dtype=torch.float32, device=device)
    op_s = time_call(lambda: x.add_(1.0), timer=timer, warmup=max(warmup, 10), min_seconds=min_seconds)
    barrier()
    steps = layer_step_seconds(device=device, precision=precision, timer=timer, min_seconds=min_seconds,
                               deepspeed_engine=layer_floor == "deepspeed") if layer_floor != "none" else None
    zero = None
    if layer_floor == "deepspeed":  # ZeRO's host work per tensor, CPU ranks only (dstk.launch.zero_cost)
        from dstk.launch.zero_cost import zero_step_seconds

        barrier()
        zero = zero_step_seconds(device=device, precision=precision, timer=timer)
    return {"gemm": gemm, "copy_bytes_moved": moved, "copy_seconds": copy_s, "memory_bytes_per_s": moved / copy_s,
            "op_seconds": op_s, "layer_steps": steps, "zero_steps": zero,
            "layer_overhead_seconds": None if steps is None else steps["floor"]}


def layer_step_seconds(*, device, precision: str, timer, min_seconds: float, deepspeed_engine: bool,
                       batches: int = 16) -> dict | None:
    """Seconds per training step of ``FLOOR_MODEL`` with 1 and ``1 + LAYER_DELTA`` layers (each
    model's fastest of ``batches`` batches, which alternate between the two models), and the
    floor per layer, their difference over ``LAYER_DELTA`` (module docstring); the medians are
    reported too. None without transformers. The fastest batch, as for the GEMMs: the step time
    model prices a machine nobody else loads, and a burst of load on a shared host (seen here: a
    step 2-3x its fastest, the median of 5 batches of one model 30 ms where the other's was 12)
    only adds time; a median of per-batch differences took the noise of both models.

    With ``deepspeed_engine`` the step is DeepSpeed's (``deepspeed.initialize`` on the launched
    ranks: ZeRO 0, AdamW, gradient clipping 1.0, the gradient all-reduce), as a planned run takes
    it; every rank then runs the same fixed number of steps, since each step holds a collective."""
    import importlib.util

    if importlib.util.find_spec("transformers") is None:
        return None
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    dtype = getattr(torch, _DTYPES[precision])
    steps, keep = {}, []
    for layers in (1, 1 + LAYER_DELTA):
        torch.manual_seed(0)
        widths = {k: v for k, v in FLOOR_MODEL.items() if k not in ("micro_batch", "seq_len")}
        config = LlamaConfig(num_hidden_layers=layers, max_position_embeddings=FLOOR_MODEL["seq_len"], **widths)
        model = LlamaForCausalLM(config)
        micro = FLOOR_MODEL["micro_batch"]
        ids = torch.randint(0, config.vocab_size, (micro, FLOOR_MODEL["seq_len"]), device=device)
        if deepspeed_engine:
            import deepspeed
            import torch.distributed as dist

            ds_config = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": 1,
                         "train_batch_size": micro * dist.get_world_size(), "gradient_clipping": 1.0,
                         "steps_per_print": 2**30, "zero_optimization": {"stage": 0},
                         "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}}}
            if precision != "fp32":
                ds_config[precision] = {"enabled": True}
            engine, *_ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()),
                                              config=ds_config)
            keep.append(engine)

            def step(engine=engine, ids=ids):
                engine.backward(engine(input_ids=ids, labels=ids).loss)
                engine.step()
        else:
            model = model.to(device=device, dtype=dtype)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

            def step(model=model, opt=opt, ids=ids):
                model(input_ids=ids, labels=ids).loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
        for _ in range(3):
            step()
        steps[layers] = step
    small, large = steps[1], steps[1 + LAYER_DELTA]
    n = 2 if deepspeed_engine else max(1, int(min_seconds / batches / max(timer(large, 1), 1e-6)))
    pairs = [(timer(small, n) / n, timer(large, n) / n) for _ in range(batches)]
    for engine in keep:
        engine.destroy()
    one, five = min(a for a, _ in pairs), min(b for _, b in pairs)
    return {"1": one, str(1 + LAYER_DELTA): five, "floor": max(0.0, (five - one) / LAYER_DELTA),
            "median": {"1": statistics.median(a for a, _ in pairs),
                       str(1 + LAYER_DELTA): statistics.median(b for _, b in pairs)}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dstk.launch.measure")
    parser.add_argument("--precision", choices=sorted(_DTYPES), default="bf16")
    parser.add_argument("--dims", default="32,64,128,256,512,1024", help="GEMM widths d, comma-separated")
    parser.add_argument("--tokens", type=int, default=512, help="GEMM rows m (at least d)")
    parser.add_argument("--copy-bytes", default="128M", help="copy buffer size (K/M/G suffixes)")
    parser.add_argument("--min-seconds", type=float, default=0.1, help="timed seconds per figure (5 batches)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--sizes", default="256K,4M,32M", help="all-reduce sizes (K/M/G suffixes)")
    parser.add_argument("--iters", type=int, default=5, help="timed all-reduces per size")
    parser.add_argument("--no-layer-floor", action="store_true", help="skip the layer-floor steps")
    parser.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)  # the runner adds it
    args = parser.parse_args(argv)

    import torch
    import torch.distributed as dist

    from dstk.launch import allreduce

    _, backend, device = allreduce.start_rank()
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = measure_rank(device=device, precision=args.precision, dims=[int(d) for d in args.dims.split(",")],
                        tokens=args.tokens, copy_bytes=allreduce.parse_size(args.copy_bytes), warmup=args.warmup,
                        min_seconds=args.min_seconds, barrier=dist.barrier,
                        layer_floor="none" if args.no_layer_floor else "deepspeed")
    mine.update(rank=rank, threads=torch.get_num_threads(), device=device.type,
                device_name=torch.cuda.get_device_name(device) if device.type == "cuda" else None)
    ranks: list = [None] * world
    dist.all_gather_object(ranks, mine)
    if rank == 0:
        print(TAG + json.dumps({"world_size": world, "backend": backend, "precision": args.precision,
                                "tokens": args.tokens, "ranks": ranks}), flush=True)
    # The doctor's own all-reduce on the same process group (init_distributed sees it is up).
    return allreduce.main(["--sizes", args.sizes, "--iters", str(args.iters)])


if __name__ == "__main__":
    from dstk.launch.rank import exit_rank

    exit_rank(main())
