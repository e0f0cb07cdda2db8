"""One rank of the model-state check: build a tiny real HF model, ``deepspeed.initialize`` it
with the ZeRO stage / precision / offload given on the command line, and print (rank 0, one JSON
line) the bytes of every unique tensor storage this rank holds after initialize and after the
first optimizer step. Started by ``tests/test_estimate_deepspeed.py`` through ``tests/dist.py``."""

from __future__ import annotations

import gc
import json
import sys

import deepspeed
import torch
import transformers

BUCKET = 50_000  # elements: small buckets so they do not dwarf a tiny model (the test passes it to the estimator)


def storages(roots) -> dict[int, tuple[int, str]]:
    """data_ptr -> (bytes, dtype) of every live tensor storage: all tensors the garbage collector
    tracks, plus what hangs off ``roots`` (grads and attributes held only from C++ would be
    missed by gc alone)."""
    seen: dict[int, tuple[int, str]] = {}
    visited: set[int] = set()

    def add(t: torch.Tensor) -> None:
        if t.device.type == "meta":
            return
        s = t.untyped_storage()
        if s.nbytes():
            seen[s.data_ptr()] = (s.nbytes(), str(t.dtype))

    def walk(obj, depth: int) -> None:
        if depth > 6 or id(obj) in visited:
            return
        visited.add(id(obj))
        if isinstance(obj, torch.Tensor):
            add(obj)
            if obj.grad is not None:
                add(obj.grad)
            for name in ("ds_tensor",):
                if hasattr(obj, name):
                    walk(getattr(obj, name), depth + 1)
            return
        if type(obj) is dict:
            for v in list(obj.values()):
                walk(v, depth + 1)
        elif type(obj) in (list, tuple, set):
            for v in list(obj):
                walk(v, depth + 1)
        elif (hasattr(obj, "__dict__") and not isinstance(obj, type)
              and type(obj).__module__.startswith(("deepspeed", "torch"))):  # not transformers' lazy maps
            for v in list(vars(obj).values()):
                walk(v, depth + 1)

    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor):
            walk(obj, 0)
    for root in roots:
        walk(root, 0)
    return seen


def run_case(case: dict) -> dict:
    """Bytes of the storages this case adds over what was alive before it (so earlier cases,
    whatever DeepSpeed keeps of them, do not count), at three points of the first step."""
    gc.collect()
    before = set(storages([]))
    keys = dict(case["config"])
    config = transformers.AutoConfig.for_model(keys.pop("model_type"), **keys)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    stage = case["stage"]
    zero = {"stage": stage, "reduce_bucket_size": BUCKET, "allgather_bucket_size": BUCKET}
    if stage == 3:
        zero.update(stage3_prefetch_bucket_size=BUCKET, stage3_param_persistence_threshold=case["threshold"],
                    stage3_max_live_parameters=BUCKET)
    if case["offload"] != "none":
        zero["offload_optimizer"] = {"device": case["offload"]}
    ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "zero_optimization": zero,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
          "gradient_clipping": 1.0, "steps_per_print": 10**9}
    if case["precision"] == "bf16":
        ds["bf16"] = {"enabled": True}
    if case.get("tp", 1) > 1:
        ds["tensor_parallel"] = {"autotp_size": case["tp"]}
        ds["train_micro_batch_size_per_gpu"] = 1
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds)
    del model

    def snapshot() -> int:
        # every rank past its collectives: a gloo work object still in flight holds its bucket (seen once
        # under load in CI: one 100 KB bucket more at the backward point, -3.08%)
        torch.distributed.barrier()
        gc.collect()
        return sum(b for ptr, (b, _) in storages([engine, engine.optimizer]).items() if ptr not in before)

    out = {"init": snapshot()}
    ids = torch.randint(0, case["config"]["vocab_size"], (1, 16))
    loss = engine(input_ids=ids, labels=ids).loss
    engine.backward(loss)
    del loss
    out["backward"] = snapshot()
    engine.step()
    out["step"] = snapshot()
    engine.destroy()
    return out


def main() -> None:
    deepspeed.init_distributed(dist_backend="gloo")
    results = [run_case(case) for case in json.loads(sys.argv[1])]
    if torch.distributed.get_rank() == 0:
        print("RESULT " + json.dumps(results), flush=True)
    from dstk.launch.rank import exit_rank

    exit_rank()


if __name__ == "__main__":
    main()
