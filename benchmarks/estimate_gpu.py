"""Predicted vs measured on one GPU: peak memory (``torch.cuda.max_memory_allocated``) and step
time of a ~1B Llama (Llama-3.2-1B dimensions, random weights from its config, no download) under
DeepSpeed, ZeRO 0 and 3, with and without full recompute, bf16, AdamW.

    .venv/bin/python benchmarks/estimate_gpu.py [--gpu h200] [--seq-len 2048] [--micro-batch 4] [--steps 6]

Prints one line per case: predicted and measured GiB, predicted and measured seconds per step
(median of the steps after the first two), and the errors. Needs a CUDA GPU; prepared for the
H200 the project may lend, not run on the CPU machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def run_case(*, zero: int, recompute: str, seq_len: int, micro_batch: int, steps: int, gpu_slug: str) -> str:
    import deepspeed
    import torch
    import transformers

    from dstk.estimate import estimate
    from dstk.hardware import Cluster, get_gpu
    from dstk.layout import Layout, Training
    from dstk.models import get_model

    spec = get_model("llama-3.2-1b")
    keys = dict(spec.hf_config)
    config = transformers.AutoConfig.for_model(keys.pop("model_type"), **keys, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    if recompute == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ds = {"train_micro_batch_size_per_gpu": micro_batch, "gradient_accumulation_steps": 1,
          "bf16": {"enabled": True}, "zero_optimization": {"stage": zero},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}}, "steps_per_print": 10**9}
    torch.cuda.reset_peak_memory_stats()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds)
    ids = torch.randint(0, spec.vocab_size, (micro_batch, seq_len), device=engine.device)
    times = []
    for _ in range(steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    measured_bytes = torch.cuda.max_memory_allocated()
    measured_s = statistics.median(times[2:])
    engine.destroy()
    del engine, model
    torch.cuda.empty_cache()

    gpu = get_gpu(gpu_slug).replace(overhead_bytes=0)  # max_memory_allocated excludes the CUDA context
    est = estimate(model=spec, layout=Layout(dp=1, zero_stage=zero, micro_batch=micro_batch, recompute=recompute),
                   training=Training(seq_len=seq_len, global_batch=micro_batch), cluster=Cluster(
                       num_nodes=1, gpus_per_node=1, gpu=gpu))
    predicted_bytes = est.memory.per_gpu.total_bytes
    predicted_s = est.time.step_seconds
    return (f"ZeRO-{zero} recompute={recompute:<4} memory: predicted {predicted_bytes / 2**30:6.2f} GiB, measured "
            f"{measured_bytes / 2**30:6.2f} GiB ({predicted_bytes / measured_bytes - 1:+.1%}); step: predicted "
            f"{predicted_s:.3f} s, measured {measured_s:.3f} s ({predicted_s / measured_s - 1:+.1%})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", default="h200")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                       ("MASTER_PORT", "29531")):
        os.environ.setdefault(key, value)
    import deepspeed

    deepspeed.init_distributed(dist_backend="nccl")
    for zero in (0, 3):
        for recompute in ("none", "full"):
            print(run_case(zero=zero, recompute=recompute, seq_len=args.seq_len, micro_batch=args.micro_batch,
                           steps=args.steps, gpu_slug=args.gpu), flush=True)


if __name__ == "__main__":
    main()
