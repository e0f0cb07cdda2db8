"""Causal attention's forward + backward speed on this machine, next to what dstk prices for it.

    python benchmarks/attention_gpu.py [--gpu h200] [--json OUT.json]      # on a GPU (gpu_check.sh)
    python benchmarks/attention_gpu.py --cpu-smoke                          # tiny sizes on CPU (a test)

For each sequence length, torch's ``scaled_dot_product_attention`` (``is_causal=True``, head dim 128,
bf16 on a GPU) runs forward and backward with the backend torch picks (``default``) and, where the
machine has them, each fused backend forced with ``torch.nn.attention.sdpa_kernel`` (``flash``,
``cudnn``, ``efficient``). Achieved TFLOP/s are counted as FlashAttention's authors and dstk's catalog
count them (Dao 2023 §4.1): ``4 s^2 d h / 2`` forward under the causal mask, 2.5x that backward. The
prediction is ``GPU.attention_fraction(kernel, seq_len)`` x the GPU's 16-bit peak
(``dstk.hardware``), for ``sdpa`` (what the default backend is priced as) and ``flash``. Each figure
is the median of ``--repeats`` timed runs after a warm-up, with the device synchronized around each.
One JSON line per measurement goes to ``--json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

HEAD_DIM = 128
BACKWARD_RATIO = 2.5  # FlashAttention's count of the backward (Dao 2023 §4.1)


def causal_flops(*, batch: int, heads: int, seq_len: int, head_dim: int = HEAD_DIM) -> float:
    """FLOPs of one causal forward + backward as FlashAttention's benchmarks count them (pure)."""
    forward = 4.0 * seq_len * seq_len * head_dim * heads * batch / 2.0
    return forward * (1.0 + BACKWARD_RATIO)


def _backends(torch, *, cuda: bool) -> dict:
    """The SDPA backends to force, by name (none on CPU: its default is what runs)."""
    if not cuda:
        return {}
    from torch.nn.attention import SDPBackend

    wanted = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION"}
    return {name: getattr(SDPBackend, attr) for name, attr in wanted.items() if hasattr(SDPBackend, attr)}


def time_attention(torch, *, batch: int, heads: int, seq_len: int, dtype, device: str, repeats: int,
                   backend=None) -> float:
    """Median seconds of one causal SDPA forward + backward."""
    import contextlib

    import torch.nn.functional as F

    shape = (batch, heads, seq_len, HEAD_DIM)
    q, k, v = (torch.randn(shape, dtype=dtype, device=device, requires_grad=True) for _ in range(3))
    grad = torch.randn(shape, dtype=dtype, device=device)

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    if backend is None:
        context = contextlib.nullcontext
    else:
        from torch.nn.attention import sdpa_kernel

        def context():
            return sdpa_kernel(backend)

    def once() -> float:
        sync()
        t0 = time.perf_counter()
        with context():
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(grad)
        sync()
        q.grad = k.grad = v.grad = None
        return time.perf_counter() - t0

    once()  # warm-up: kernel selection, cuDNN plans
    return statistics.median(once() for _ in range(repeats))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", default=None, help="catalog slug to compare with (default: from the device name)")
    parser.add_argument("--json", default=None, metavar="FILE", help="one JSON line per measurement")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on CPU ranks' default backend")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per figure (default 10; 2 smoke)")
    args = parser.parse_args(argv)

    import torch

    from dstk.errors import DstkError
    from dstk.hardware import get_gpu

    cuda = torch.cuda.is_available() and not args.cpu_smoke
    if not cuda and not args.cpu_smoke:
        print("attention_gpu: no CUDA device; use --cpu-smoke for the CPU path", file=sys.stderr)
        return 2
    device = "cuda" if cuda else "cpu"
    slug = args.gpu
    if slug is None:
        from dstk.calibrate import guess_gpu_slug  # the device name -> catalog slug mapping of doctor

        slug = guess_gpu_slug(torch.cuda.get_device_name(0), cpu=False) if cuda else "cpu"
        if slug is None:
            print(f"attention_gpu: no catalog entry for {torch.cuda.get_device_name(0)!r}; give --gpu SLUG",
                  file=sys.stderr)
            return 2
    try:
        gpu = get_gpu(slug)
    except DstkError as exc:
        print(f"attention_gpu: --gpu: {exc.render()}", file=sys.stderr)
        return 2
    dtype = torch.bfloat16 if cuda else torch.float32
    peak = gpu.peak_flops("bf16" if cuda else "fp32")
    lengths = (1024, 2048, 4096, 8192, 16384) if cuda else (64, 128)
    tokens = 16384 if cuda else 256  # batch x seq_len per measurement
    heads = 16 if cuda else 2
    repeats = args.repeats or (10 if cuda else 2)
    print(f"attention_gpu: {gpu.name} ({slug}), {device}, {str(dtype).removeprefix('torch.')}, head dim {HEAD_DIM}, "
          f"{heads} heads, {tokens} tokens a measurement, median of {repeats}; torch {torch.__version__}")
    print(f"{'seq':>6}  {'backend':<10} {'ms':>9} {'TFLOP/s':>9} {'of peak':>8}   dstk sdpa / flash (of peak)")
    rows = []
    out = open(args.json, "w") if args.json else None
    try:
        for seq_len in lengths:
            batch = max(1, tokens // seq_len)
            flops = causal_flops(batch=batch, heads=heads, seq_len=seq_len)
            predicted = {k: gpu.attention_fraction(kernel=k, seq_len=seq_len) for k in ("sdpa", "flash")}
            for name, backend in {"default": None, **_backends(torch, cuda=cuda)}.items():
                try:
                    seconds = time_attention(torch, batch=batch, heads=heads, seq_len=seq_len, dtype=dtype,
                                             device=device, repeats=repeats, backend=backend)
                except RuntimeError as exc:  # a backend this device or shape does not have
                    print(f"{seq_len:>6}  {name:<10} not available: {str(exc).splitlines()[0][:80]}")
                    continue
                achieved = flops / seconds
                row = {"seq_len": seq_len, "batch": batch, "heads": heads, "backend": name, "seconds": seconds,
                       "tflops": achieved / 1e12, "fraction": achieved / peak,
                       "predicted_sdpa": predicted["sdpa"], "predicted_flash": predicted["flash"]}
                rows.append(row)
                if out:
                    out.write(json.dumps(row) + "\n")
                print(f"{seq_len:>6}  {name:<10} {seconds * 1e3:>9.3f} {achieved / 1e12:>9.1f} {achieved / peak:>8.3f}"
                      f"   {predicted['sdpa']:.3f} / {predicted['flash']:.3f}")
    finally:
        if out:
            out.close()
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
