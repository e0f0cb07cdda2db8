"""One rank of the offloaded-step check (``tests/test_cpu_adam_time.py``): for each case (ZeRO
stage, precision, ``gradient_clipping`` or None for DeepSpeed's default), ``deepspeed.initialize`` a
two-layer model with optimizer offload (the real DeepSpeedCPUAdam), train two steps and print
(rank 0, one JSON line) what torch's profiler saw in the second ``engine.step()``: how many
``aten::mul_`` ran over a whole gradient partition (``unscale_and_clip_grads``) and the largest
tensor ``isinf``/``isnan`` read (the overflow check). Started through ``tests/dist.py``; fp16 is
not tried: DeepSpeed's CPU accelerator refuses it."""

from __future__ import annotations

import json
import math
import os
import sys

import deepspeed
import torch
from torch.profiler import profile

WIDTH = 64
PARAMS = 2 * (WIDTH * WIDTH + WIDTH)


def run(case: dict) -> dict:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Linear(WIDTH, WIDTH))
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
              "zero_optimization": {"stage": case["zero"], "offload_optimizer": {"device": "cpu"}},
              case["precision"]: {"enabled": True}}
    if case["clip"] is not None:
        config["gradient_clipping"] = case["clip"]
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[case["precision"]]
    for _ in range(2):  # the first step creates the optimizer states
        loss = engine(torch.randn(4, WIDTH, dtype=dtype)).float().pow(2).mean()
        engine.backward(loss)
        with profile(record_shapes=True) as prof:
            engine.step()
    events = list(prof.events())
    whole = [e for e in events if e.name == "aten::mul_" and e.input_shapes and e.input_shapes[0]
             and math.prod(e.input_shapes[0]) >= PARAMS]
    checked = [math.prod(e.input_shapes[0]) for e in events
               if e.name in ("aten::isinf", "aten::isnan") and e.input_shapes and e.input_shapes[0]]
    return {"unscale_muls": len(whole), "largest_overflow_check": max(checked, default=0)}


def main() -> None:
    cases = json.loads(sys.argv[1])
    out = [run(case) for case in cases]
    if int(os.environ.get("RANK", "0")) == 0:
        print("UNSCALE " + json.dumps(out), flush=True)
    from dstk.launch.rank import exit_rank

    exit_rank()


if __name__ == "__main__":
    main()
