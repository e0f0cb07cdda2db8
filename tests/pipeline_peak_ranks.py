"""One rank of the pipeline peak-memory check (``tests/test_pipeline_memory_peak.py``, through
``tests/dist.py``, 2 ranks = 2 stages, dp = 1): for each case build a tiny real HF model, wrap it
with ``dstk.models.to_pipeline``, ``deepspeed.initialize`` it with the case's config, run a warm-up
``train_batch`` and measured ones, and print one line per rank: ``RESULT <rank> [...]`` with, per
case, this rank's stage, the peak of live allocator bytes over the measured batches, the
instruction it fell in (``ForwardPass``, ``BackwardPass``, ``OptimizerStep``, ``RecvGrad`` ...),
each instruction's peak, the live bytes between the batches, and DeepSpeed's optimizer class.

The bytes come from ``torch.profiler``'s allocator events, counted over every thread
(``peak_ranks.allocation_events`` / ``count_every_thread``: what ``torch.cuda.max_memory_allocated``
counts on a GPU), inside each pipeline instruction: every instruction of DeepSpeed's schedule
(``PipelineEngine._INSTRUCTION_MAP``) runs inside a ``dstk:<instruction>:<batch>`` range.
A free of memory the case did not allocate (an earlier case's engine, collected late: seen once, a
case's step 14 MiB low) is added back, so it cannot lower the case's figures. ``DSTK_PEAK_DEBUG=1``
adds what this thread held at the peak, grouped by instruction and operator.
"""

from __future__ import annotations

import functools
import gc
import json
import logging
import os
import sys
import warnings

import deepspeed
import torch
import transformers
from torch.profiler import ProfilerActivity, profile, record_function

from peak_ranks import allocation_events, count_every_thread

WARMUP = 1
MEASURED = 2


def peaks(events) -> dict:
    """Peak live bytes (all threads, above the case's start) over the measured batches, where it
    fell, each instruction's peak and the bytes live when the measured batches begin."""
    base = events[0][6] - max(events[0][1], 0)
    peak, where, start = 0, None, None
    phases: dict[str, int] = {}
    live: dict[int, tuple] = {}
    at_peak: dict = {}
    debug = bool(os.environ.get("DSTK_PEAK_DEBUG"))
    allocated: set[int] = set()
    earlier = 0  # bytes freed during this case that an earlier case allocated (its engine's late garbage)
    for _, size, ptr, phase, step, op, total in events:
        if size > 0:
            live[ptr] = (size, phase, step, op)
            allocated.add(ptr)
        else:
            live.pop(ptr, None)
            if ptr not in allocated:
                earlier -= size
        total -= base - earlier
        if step > WARMUP:
            if start is None:
                start = total - max(size, 0)
            phases[phase] = max(phases.get(phase, 0), total)
            if total > peak:
                peak, where = total, phase
                if debug:
                    groups: dict = {}
                    for nbytes, ph, st, o in live.values():
                        b, n = groups.get((ph, st, o), (0, 0))
                        groups[(ph, st, o)] = (b + nbytes, n + 1)
                    at_peak = {f"{k}": v for k, v in sorted(groups.items(), key=lambda kv: -kv[1][0])[:14]}
    out = {"peak": peak, "phase": where, "phases": phases, "between": start}
    if debug:
        out["at_peak"] = at_peak
    return out


def run_case(case: dict) -> dict:
    from dstk.models import to_pipeline

    gc.collect()
    keys = dict(case["model"])
    seq, micro = case["seq_len"], case["ds"]["train_micro_batch_size_per_gpu"]
    config = transformers.AutoConfig.for_model(keys.pop("model_type"), **keys)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with record_function("dstk:init:0"):
            torch.manual_seed(0)
            dtype = torch.bfloat16 if (case["ds"].get("bf16") or {}).get("enabled") else torch.float32
            model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").to(dtype)
            pipe = to_pipeline(model, num_stages=2, seq_len=seq)
            del model
            engine, *_ = deepspeed.initialize(model=pipe, model_parameters=[p for p in pipe.parameters()],
                                              config=case["ds"])
            del pipe
        batch = [0]

        def wrap(name, fn):
            @functools.wraps(fn)
            def inner(self, *a, **k):
                with record_function(f"dstk:{name}:{batch[0]}"):
                    return fn(self, *a, **k)
            return inner

        engine._INSTRUCTION_MAP = {cls: wrap(cls.__name__, fn) for cls, fn in type(engine)._INSTRUCTION_MAP.items()}
        gen = torch.Generator().manual_seed(1)
        for b in range(1, WARMUP + MEASURED + 1):
            batch[0] = b
            data = [(ids, ids) for ids in (torch.randint(0, config.vocab_size, (micro, seq), generator=gen)
                                           for _ in range(engine.gradient_accumulation_steps()))]
            with record_function(f"dstk:train_batch:{b}"):
                engine.train_batch(data_iter=iter(data))
            del data
    result = peaks(allocation_events(prof))
    result.update(stage=engine.stage_id, optimizer=type(engine.optimizer).__name__,
                  stage_params=sum(p.numel() for p in {id(p): p for p in engine.module.parameters()}.values()))
    engine.destroy()
    del engine, prof
    return result


def main() -> None:
    warnings.filterwarnings("ignore", category=FutureWarning)
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    count_every_thread()
    deepspeed.init_distributed(dist_backend="gloo")
    results = [run_case(case) for case in json.loads(sys.argv[1])]
    print(f"RESULT {torch.distributed.get_rank()} " + json.dumps(results), flush=True)
    from dstk.launch.rank import exit_rank

    exit_rank()


if __name__ == "__main__":
    main()
