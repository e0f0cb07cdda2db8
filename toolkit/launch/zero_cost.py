"""ZeRO's own host work on the calibrating ranks: what ``dstk doctor --calibrate`` measures for
``GPU.zero_tensor_seconds`` / ``zero3_tensor_seconds`` (run by ``dstk.launch.measure`` on CPU ranks).

DeepSpeed steps of ``measure.FLOOR_MODEL``'s Llama with 1 and 3 layers (``DEPTHS``) under ZeRO
0, 1 and 3 (``"zero_optimization": {"stage": Z}``, DeepSpeed's defaults otherwise, as users write
it; AdamW, clipping 1.0, the compute precision: the layer floor's config), over every launched
rank. The six engines are built first; then ``batches`` rounds each time one batch of
``steps`` steps of every engine in turn, and an engine's figure is its fastest batch: a burst of
load from other processes hits one round, not every batch of one config (``measure.time_interleaved``
for the GEMMs). ``dstk.calibrate.fit_zero_tensor_seconds`` turns the ZeRO-1 and ZeRO-3 steps, less the
same width's ZeRO-0 step, into seconds per parameter tensor, as ``benchmarks/zero_dp1_cost.py
--one-rank`` measured the catalog's figures.
"""

from __future__ import annotations

DEPTHS = (1, 3)
"""Decoder layers of the two models: 12 and 30 parameter tensors (9 a layer, the embedding, final
norm and head), enough apart for a slope; 3 rather than the layer floor's 5 layers keeps the ZeRO-3
steps, the longest, short (a 5-layer ZeRO-3 step took 60-145 ms here)."""
STAGES = (0, 1, 3)
"""ZeRO-0 the reference; ZeRO-1 stands for ZeRO-1/2 (one per-tensor figure, ``zero_tensor_seconds``)."""


def zero_step_seconds(*, device, precision: str, timer, batches: int = 8, steps: int = 1) -> dict | None:
    """``{"layers": [1, 3], "seconds": {"Z": [s1, s3]}, "wall_seconds": ...}`` for Z in ``STAGES``: each
    engine's fastest batch, seconds per step (module docstring), and what measuring took. None
    without transformers or on a GPU (its figures stay the catalog's: host work beside asynchronous
    kernels, not measured there)."""
    import importlib.util
    import time

    t0 = time.perf_counter()
    if device.type != "cpu" or importlib.util.find_spec("transformers") is None:
        return None
    import deepspeed
    import torch
    import torch.distributed as dist
    from transformers import LlamaConfig, LlamaForCausalLM

    from dstk.launch.measure import FLOOR_MODEL

    layers = DEPTHS
    micro = FLOOR_MODEL["micro_batch"]
    widths = {k: v for k, v in FLOOR_MODEL.items() if k not in ("micro_batch", "seq_len")}
    runs = []
    for stage in STAGES:
        for n in layers:
            torch.manual_seed(0)
            model = LlamaForCausalLM(LlamaConfig(num_hidden_layers=n, max_position_embeddings=FLOOR_MODEL["seq_len"],
                                                 **widths))
            config = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": 1,
                      "train_batch_size": micro * dist.get_world_size(), "gradient_clipping": 1.0,
                      "steps_per_print": 2**30, "zero_optimization": {"stage": stage},
                      "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}}}
            if precision != "fp32":
                config[precision] = {"enabled": True}
            engine, *_ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()), config=config)
            ids = torch.randint(0, widths["vocab_size"], (micro, FLOOR_MODEL["seq_len"]))

            def step(engine=engine, ids=ids):
                engine.backward(engine(input_ids=ids, labels=ids).loss)
                engine.step()

            for _ in range(2):
                step()
            runs.append((stage, n, engine, step))
    best = [float("inf")] * len(runs)
    for _ in range(batches):
        for i, (_, _, _, step) in enumerate(runs):
            best[i] = min(best[i], timer(step, steps) / steps)
    for _, _, engine, _ in runs:
        engine.destroy()
    seconds = {str(stage): [best[i] for i, (s, _, _, _) in enumerate(runs) if s == stage] for stage in STAGES}
    return {"layers": list(layers), "seconds": seconds, "wall_seconds": time.perf_counter() - t0}
