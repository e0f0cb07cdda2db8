"""The figures behind the catalog's ``cpu`` entry, measured on this machine (one thread, as one
gloo rank of the CPU demo runs).

    .venv/bin/python benchmarks/cpu_rank_figures.py

Prints bf16/fp32 matmul GFLOP/s at n = 64, 256, 512, 1024 (the ``gemm_efficiency`` points are
these over the best), a 64 MiB copy's bandwidth (``hbm_bytes_per_s``, 2 bytes moved per byte
copied) and the tiny Llama of ``examples/intents/tiny-llama-cpu.yaml`` trained in one process with
2 and 8 layers: the difference per layer is ``layer_overhead_seconds`` (operator dispatch, which
dominates a model this small). ``dstk doctor --calibrate`` measures the first two on a user's
machine.
"""

from __future__ import annotations

import time


def main() -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(1)
    torch.manual_seed(0)
    for dtype in (torch.bfloat16, torch.float32):
        for n in (64, 256, 512, 1024):
            a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
            for _ in range(3):
                a @ b
            reps = max(3, int(2e9 / (2 * n**3)))
            start = time.perf_counter()
            for _ in range(reps):
                a @ b
            seconds = (time.perf_counter() - start) / reps
            print(f"matmul {str(dtype)[6:]:<9} n={n:<5} {2 * n**3 / seconds / 1e9:8.1f} GFLOP/s")
    x = torch.empty(64 * 2**20 // 4)
    y = torch.empty_like(x)
    y.copy_(x)
    start = time.perf_counter()
    for _ in range(20):
        y.copy_(x)
    print(f"copy 64 MiB {2 * x.numel() * 4 / ((time.perf_counter() - start) / 20) / 1e9:.1f} GB/s")

    steps = {}
    for layers in (2, 8):
        cfg = LlamaConfig(num_hidden_layers=layers, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                          intermediate_size=128, vocab_size=512, max_position_embeddings=64)
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        ids = torch.randint(0, 512, (4, 64))
        for i in range(13):
            if i == 3:
                start = time.perf_counter()
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
        steps[layers] = (time.perf_counter() - start) / 10
        print(f"tiny Llama, {layers} layers, 4 x 64 tokens: {steps[layers] * 1e3:.1f} ms/step, "
              f"{256 / steps[layers]:,.0f} tokens/s")
    print(f"per layer (forward + backward): {(steps[8] - steps[2]) / 6 * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
