"""One rank of the pipeline memory check: build a tiny real HF model, wrap it with
``dstk.models.to_pipeline`` (2 stages), drop the caller's model, ``deepspeed.initialize`` the
pipeline with the ZeRO stage / precision given on the command line and print, per rank, one JSON
line: this rank's stage and parameter count, the bytes of every unique tensor storage the case
added (after initialize and after the first ``train_batch``), how many of those bytes the engine
does not reach, and the bytes of live ``nn.Parameter`` objects outside the engine's module.
Started by ``tests/test_pipeline_dist.py`` and ``tests/test_estimate_deepspeed.py``."""

from __future__ import annotations

import gc
import json
import sys

import deepspeed
import torch
import transformers

from estimate_ranks import BUCKET, storages


def engine_storages(engine, *, states_only: bool = False) -> dict[int, int]:
    """data_ptr -> bytes of what the engine itself reaches: its module's parameters, gradients and
    buffers (the shared rotary included), everything hanging off its optimizer (flat buffers,
    master weights, optimizer states) and, unless ``states_only``, off the engine (pipeline
    send/receive buffers, the last outputs). Unlike ``storages`` this does not start from every
    tensor the garbage collector knows."""
    seen: dict[int, int] = {}
    visited: set[int] = set()

    def add(t: torch.Tensor) -> None:
        s = t.untyped_storage()
        if t.device.type != "meta" and s.nbytes():
            seen[s.data_ptr()] = s.nbytes()

    def walk(obj, depth: int) -> None:
        if depth > 8 or id(obj) in visited:
            return
        visited.add(id(obj))
        if isinstance(obj, torch.Tensor):
            add(obj)
            if obj.grad is not None:
                add(obj.grad)
        elif isinstance(obj, dict):  # optimizer.state is a defaultdict keyed by parameter
            for v in list(obj.values()):
                walk(v, depth + 1)
        elif type(obj) in (list, tuple, set):
            for v in list(obj):
                walk(v, depth + 1)
        elif (hasattr(obj, "__dict__") and not isinstance(obj, (type, torch.nn.Module))
              and type(obj).__module__.startswith(("deepspeed", "torch"))):
            for v in list(vars(obj).values()):
                walk(v, depth + 1)

    for module in engine.module.modules():
        for t in [*module.parameters(recurse=False), *module.buffers(recurse=False)]:
            walk(t, 0)
        for rotary in getattr(module, "_rotary", ()):  # DecoderPipe hides the shared rotary in a tuple
            for t in rotary.buffers():
                walk(t, 0)
    for root in ((engine.optimizer,) if states_only else (vars(engine), engine.optimizer)):
        walk(root, 0)
    return seen


def run_case(case: dict) -> dict:
    from dstk.models import to_pipeline

    gc.collect()
    before = set(storages([]))
    keys = dict(case["config"])
    config = transformers.AutoConfig.for_model(keys.pop("model_type"), **keys)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if case["precision"] == "bf16" else torch.float32
    model = transformers.AutoModelForCausalLM.from_config(config).to(dtype)
    pipe = to_pipeline(model, num_stages=2, seq_len=16)
    del model  # the caller lets its model go: nothing of it may stay alive beyond this rank's stage
    stage = case["stage"]
    ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2,
          "zero_optimization": {"stage": stage, "reduce_bucket_size": BUCKET, "allgather_bucket_size": BUCKET},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
          "gradient_clipping": 1.0, "steps_per_print": 10**9}
    if case["precision"] == "bf16":
        ds["bf16"] = {"enabled": True}
    engine, *_ = deepspeed.initialize(model=pipe, model_parameters=list(pipe.parameters()), config=ds)
    del pipe
    own = {p.untyped_storage().data_ptr() for p in engine.module.parameters()}

    def snapshot(point: str) -> None:
        gc.collect()
        live = {ptr: b for ptr, (b, _) in storages([engine, engine.optimizer]).items() if ptr not in before}
        reached = engine_storages(engine)
        foreign = {}
        for obj in gc.get_objects():
            if isinstance(obj, torch.nn.Parameter) and obj.device.type != "meta":
                ptr = obj.untyped_storage().data_ptr()
                if ptr not in own and ptr not in before:
                    foreign[ptr] = obj.untyped_storage().nbytes()
        out[point] = sum(live.values())
        out[f"{point}_states"] = sum(b for ptr, b in engine_storages(engine, states_only=True).items() if ptr in live)
        out[f"{point}_unreached"] = sorted((b for ptr, b in live.items() if ptr not in reached), reverse=True)
        out[f"{point}_foreign"] = sum(foreign.values())

    out: dict = {"stage_id": engine.stage_id,
                 "stage_params": sum(p.numel() for p in {id(p): p for p in engine.module.parameters()}.values())}
    snapshot("init")
    ids = torch.randint(0, case["config"]["vocab_size"], (1, 16))
    engine.train_batch(data_iter=iter([(ids, ids)] * 2))
    del ids
    snapshot("step")
    engine.destroy()
    return out


def main() -> None:
    deepspeed.init_distributed(dist_backend="gloo")
    results = [run_case(case) for case in json.loads(sys.argv[1])]
    print(f"RESULT {torch.distributed.get_rank()} " + json.dumps(results), flush=True)
    from dstk.launch.rank import exit_rank

    exit_rank()


if __name__ == "__main__":
    main()
