"""One rank of the peak-memory check: for each case, build a real HF model, ``deepspeed.initialize``
it with the case's DeepSpeed config, train a warm-up step and then measured steps, and print
(rank 0, one JSON line) the peak of live allocator bytes over the measured steps, the phase it
fell in, and the peak of each phase. Started by ``tests/test_estimate_peak.py`` through
``tests/dist.py``.

How it sees every allocation: with ``torch.profiler.profile(profile_memory=True)`` PyTorch's CPU
allocator (``c10/core/CPUAllocator.cpp``, ``ProfiledCPUMemoryReporter``) reports each ``alloc`` and
``free`` it serves, whichever code asked for it (autograd's saved tensors and gradients,
DeepSpeed's flat buffers, reduce buckets and fp32 partitions from ``torch.empty``/``zeros``/
``cat``, the optimizer's temporaries), with ``total_allocated``: the bytes it has handed out and
not yet got back. ``count_every_thread`` sets ``FLAGS_caffe2_report_cpu_memory_usage`` first, so
that total counts every thread: gloo's worker threads free the flat copies of asynchronous
collectives, and without the flag those frees were missed (the profiler's state is per thread)
and the same 40 MB copy looked live for a whole step in some runs, not in others. A case's live
bytes are that total minus its value before the case; the peak is its maximum at any
allocation of the profiled thread over the measured steps, *inside* ``forward``/``backward``/
``step``, not a snapshot after they return: what a GPU's ``torch.cuda.max_memory_allocated``
counts (without the caching allocator's rounding). Checked: the tiny model's 5e8-element bf16
bucket shows as exactly 1e9 bytes, twice with ``overlap_comm`` (``test_estimate_peak.py``).
Not seen: memory outside PyTorch's allocator (gloo's own buffers, Python objects), which has no
GPU counterpart. ``DSTK_PEAK_DEBUG=1`` prints, on stderr, what the profiled thread holds when the
measured steps begin, grouped by the phase and operator that allocated it.
"""

from __future__ import annotations

import ctypes
import gc
import json
import logging
import os
import sys
import time
import warnings

import deepspeed
import torch
import transformers
from torch.profiler import ProfilerActivity, profile, record_function

WARMUP_STEPS = 1
MEASURED_STEPS = 2
SEQ_LEN = 64


def allocation_events(prof) -> list[tuple[int, int, int, str, int, str, int]]:
    """(time ns, bytes (+alloc / -free), pointer, phase, step, op, allocator total) of every CPU
    allocator event of the profiled thread, in time order. The phase and step come from the
    enclosing ``dstk:<phase>:<step>`` range, ``op`` is the innermost operator that allocated (to
    say where the peak is)."""
    out = []
    stack = [(node, "outside", 0, "") for node in prof.profiler.kineto_results.experimental_event_tree()]
    while stack:
        node, phase, step, op = stack.pop()
        if node.name.startswith("dstk:"):
            _, phase, num = node.name.split(":")
            step = int(num)
        fields = node.extra_fields
        if type(fields).__name__ == "_ExtraFields_Allocation":
            if fields.device.type == "cpu":
                out.append((node.start_time_ns, int(fields.alloc_size), int(fields.ptr), phase, step, op,
                            int(fields.total_allocated)))
        else:
            op = node.name
        stack.extend((child, phase, step, op) for child in node.children)
    out.sort(key=lambda e: e[0])
    return out


def live_peaks(events) -> dict:
    """The allocator's live bytes (``total_allocated``, counted across all threads) above what was
    live before the case: the peak over the measured steps, its phase and op, each phase's peak,
    and the live bytes when the measured steps begin."""
    base = events[0][6] - max(events[0][1], 0)
    peak, peak_phase, peak_op = 0, None, None
    phases = {"forward": 0, "backward": 0, "step": 0}
    start = None
    live: dict[int, tuple] = {}  # for DSTK_PEAK_DEBUG only: what this thread allocated and still holds
    for _, size, ptr, phase, step, op, total in events:
        if size > 0:
            live[ptr] = (size, phase, step, op)
        else:
            live.pop(ptr, None)
        total -= base
        if step > WARMUP_STEPS:
            if start is None:
                start = total - max(size, 0)
                if os.environ.get("DSTK_PEAK_DEBUG"):
                    groups: dict = {}
                    for p, (nbytes, *where) in live.items():
                        if p != ptr:
                            b, n = groups.get(tuple(where), (0, 0))
                            groups[tuple(where)] = (b + nbytes, n + 1)
                    held = sorted(((b, n, k) for k, (b, n) in groups.items()), reverse=True)[:15]
                    print("between steps:", start, held, file=sys.stderr, flush=True)
            if phase in phases:
                phases[phase] = max(phases[phase], total)
            if total > peak:
                peak, peak_phase, peak_op = total, phase, op
    return {"peak": peak, "phase": peak_phase, "op": peak_op, "phases": phases, "between_steps": start}


def count_every_thread() -> None:
    """Make PyTorch's CPU allocator count allocations and frees of every thread in the total it
    reports (``FLAGS_caffe2_report_cpu_memory_usage``, ``c10/core/CPUAllocator.cpp``). Without
    it only the profiled thread's are counted, and a tensor that gloo's worker thread frees
    after an asynchronous collective (DeepSpeed's reduction copies) would stay "live" forever."""
    lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))
    ctypes.c_bool.in_dll(lib, "FLAGS_caffe2_report_cpu_memory_usage").value = True


def run_case(case: dict) -> dict:
    gc.collect()
    keys = dict(case["model"])
    config = transformers.AutoConfig.for_model(keys.pop("model_type"), **keys)
    ds = case["ds"]
    micro = ds["train_micro_batch_size_per_gpu"]
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
        if case.get("lora"):  # adapters through peft on a frozen base, as dstk.train.worker builds them
            from dstk.train import lora

            model = lora.apply(model, lora.LoraSettings.from_json(case["lora"]))
        params = [p for p in model.parameters() if p.requires_grad]
        engine, *_ = deepspeed.initialize(model=model, model_parameters=params, config=ds)
        del model
        gen = torch.Generator().manual_seed(1)
        for step in range(1, WARMUP_STEPS + MEASURED_STEPS + 1):
            for _ in range(engine.gradient_accumulation_steps()):
                ids = torch.randint(0, config.vocab_size, (micro, SEQ_LEN), generator=gen)
                with record_function(f"dstk:forward:{step}"):
                    loss = engine(input_ids=ids, labels=ids).loss
                with record_function(f"dstk:backward:{step}"):
                    engine.backward(loss)
                del loss
                with record_function(f"dstk:step:{step}"):
                    engine.step()
    result = live_peaks(allocation_events(prof))
    engine.destroy()
    del engine, prof
    return result


def main() -> None:
    # Keep the output small: tests/dist.py reads rank 0's pipe before rank 1's, and a rank that
    # fills its 64 KiB pipe blocks, and the other waits for it in a collective (seen: 255
    # FutureWarnings from c10d_logger for 16 cases).
    warnings.filterwarnings("ignore", category=FutureWarning)
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    count_every_thread()
    deepspeed.init_distributed(dist_backend="gloo")
    results = []
    for i, case in enumerate(json.loads(sys.argv[1])):
        start = time.perf_counter()
        results.append(run_case(case))
        print(f"case {i}: {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    if torch.distributed.get_rank() == 0:
        print("RESULT " + json.dumps(results), flush=True)
    from dstk.launch.rank import exit_rank

    exit_rank()


if __name__ == "__main__":
    main()
