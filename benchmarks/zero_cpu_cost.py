"""ZeRO's own cost on CPU ranks: the bare DeepSpeed step of the tiny Llama
(``examples/intents/tiny-llama-cpu.yaml``) on 2 gloo ranks for ZeRO 0/1/2/3, with the configs
``dstk generate`` writes and with DeepSpeed's default buckets (``"zero_optimization":
{"stage": Z}`` as users write it), the collectives each step issues (counted by wrapping
DeepSpeed's torch backend) and the measured ms/step next to ``dstk estimate --config``'s.

    .venv/bin/python benchmarks/zero_cpu_cost.py [--steps 5] [--repeats 20] [--hardware FILE]
    .venv/bin/python benchmarks/zero_cpu_cost.py --zero3-calls

``--zero3-calls`` counts instead ZeRO-3's collectives in forward, backward and ``engine.step()`` of
steps 1-3 (a tiny and a 5M Llama; generated, default and tighter ``stage3_*`` settings; with and
without HF's full recompute) next to ``steptime.zero3_gathers`` / ``collective_calls`` (about 40 s).
``--flush-calls`` counts the gradient reductions of ZeRO-1, 2 and 3 with a ``reduce_bucket_size``
smaller than the models' largest matrices (the tiny Llama, tied and untied, and the 5M one), so
how the bucket packs the gradients in backward order decides the count, next to
``steptime.grad_flushes`` and the old ``ceil(P / bucket)`` (about a minute).

    .venv/bin/python benchmarks/zero_cpu_cost.py --flush-calls

One launch of 2 ranks runs all eight configs in turn (about a minute here). The step is
``engine.backward(loss); engine.step()`` over the plan's micro-batch and accumulation, with no
data loading and no scheduler; per batch of ``--steps`` steps the slowest rank's time, in
``--repeats`` rounds where the configs take turns. The model predicts an unloaded machine, so the
error is against the best round (``min``); on a shared host the median carries the other
processes' load (it is printed too). Goal (issue 11): predicted ZeRO-0/1/2 in the measured order, each within
25%.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "examples" / "intents" / "tiny-llama-cpu.yaml"
TAG = "ZERO_CPU_COST "
_OPS = ("all_reduce", "inference_all_reduce", "all_reduce_coalesced", "reduce", "all_gather", "all_gather_into_tensor",
        "all_gather_coalesced", "reduce_scatter_tensor", "reduce_scatter", "broadcast", "all_to_all_single", "send",
        "recv", "isend", "irecv")


def _backend_counter(sizes: dict | None = None):
    """``(counts, counting)``: ``counting(True)`` wraps DeepSpeed's torch backend
    (``deepspeed.comm.torch.TorchBackend``) so that each collective adds one to ``counts[op]``
    (and, given ``sizes``, appends the elements of its last tensor argument, the reduced or
    scattered input, to ``sizes[op]``); ``counting(False)`` puts DeepSpeed's own methods back."""
    import torch
    from deepspeed.comm.torch import TorchBackend

    counts: dict[str, int] = {}
    originals = {name: getattr(TorchBackend, name) for name in _OPS if hasattr(TorchBackend, name)}

    def wrap(name):
        inner = originals[name]

        def counted(self, *args, **kwargs):
            counts[name] = counts.get(name, 0) + 1
            if sizes is not None:
                tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
                sizes.setdefault(name, []).append(tensors[-1].numel() if tensors else 0)
            return inner(self, *args, **kwargs)
        return counted

    def counting(on: bool) -> None:
        for name, inner in originals.items():
            setattr(TorchBackend, name, wrap(name) if on else inner)

    return counts, counting


def _worker(spec_path: str, steps: int, repeats: int) -> None:
    """One rank: every config of ``spec_path`` in turn, a ``TAG`` line per config from rank 0."""
    import torch
    import torch.distributed as tdist

    # Only while counting: a Python wrapper around the backend slowed the backward pass of ZeRO-0
    # 2-3x here (measured), so the timed steps run DeepSpeed's own methods.
    counts, counting = _backend_counter()

    import deepspeed
    from transformers import LlamaConfig, LlamaForCausalLM

    deepspeed.init_distributed(dist_backend="gloo")
    rank = tdist.get_rank()
    specs = json.loads(Path(spec_path).read_text())
    for group in sorted({spec["group"] for spec in specs}):
        runs = []
        for spec in (s for s in specs if s["group"] == group):
            cfg, hf = spec["config"], spec["hf_config"]
            torch.manual_seed(0)
            model = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in hf.items() if k != "model_type"}))
            engine, *_ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()), config=cfg)
            ids = torch.randint(0, hf["vocab_size"], (cfg["train_micro_batch_size_per_gpu"], spec["seq_len"]))

            def step(engine=engine, ids=ids, ga=cfg["gradient_accumulation_steps"]):
                for _ in range(ga):
                    engine.backward(engine(input_ids=ids, labels=ids).loss)
                    engine.step()

            for _ in range(3):
                step()
            runs.append((spec, engine, step, []))
        # Rounds over the configs in turn, so a load that drifts (a shared host) hits each alike.
        for _ in range(repeats):
            for spec, engine, step, times in runs:
                tdist.barrier()
                t0 = time.perf_counter()
                for _ in range(steps):
                    step()
                t = torch.tensor([(time.perf_counter() - t0) / steps], dtype=torch.float64)
                tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
                times.append(float(t.item()))
        for spec, engine, step, times in runs:
            counts.clear()
            counting(True)
            for _ in range(2):
                step()
            counting(False)
            if rank == 0:
                print(TAG + json.dumps({"name": spec["name"], "seconds": statistics.median(times), "min": min(times),
                                        "times": times, "collectives": {k: v / 2 for k, v in sorted(counts.items())}}),
                      flush=True)
            engine.destroy()
    from dstk.launch.rank import exit_rank

    exit_rank()


_PHASES = ("forward", "backward", "step")


def count_zero3(*, config: dict, hf_config: dict, seq_len: int, recompute: bool, num_steps: int = 3) -> list[dict]:
    """Collective calls of each phase (forward, backward, ``engine.step``) of steps ``1..num_steps``
    of one micro-batch per step under ``config``, counted by wrapping DeepSpeed's torch backend
    (``deepspeed.comm.torch.TorchBackend``); call once per rank inside an initialised gloo group.
    ``recompute``: HF's ``gradient_checkpointing_enable()`` (full recompute of each layer).
    Returns one ``{"forward": {op: n}, "backward": ..., "step": ..., "sizes": {phase: {op: [elements,
    ...]}}}`` per step."""
    import torch
    import deepspeed
    from transformers import AutoConfig, AutoModelForCausalLM

    sizes: dict[str, list[int]] = {}
    counts, counting = _backend_counter(sizes)
    torch.manual_seed(0)
    hf = {k: v for k, v in hf_config.items() if k != "model_type"}
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(hf_config.get("model_type", "llama"), **hf))
    if recompute:
        model.gradient_checkpointing_enable()
    model.train()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()), config=config)
    ids = torch.randint(0, hf_config["vocab_size"], (config["train_micro_batch_size_per_gpu"], seq_len))
    steps = []
    counting(True)
    try:
        for _ in range(num_steps):
            phases: dict = {"sizes": {}}
            for phase in _PHASES:
                counts.clear()
                sizes.clear()
                if phase == "forward":
                    loss = engine(input_ids=ids, labels=ids).loss
                elif phase == "backward":
                    engine.backward(loss)
                else:
                    engine.step()
                phases[phase] = dict(sorted(counts.items()))
                phases["sizes"][phase] = {k: list(v) for k, v in sorted(sizes.items())}
            steps.append(phases)
    finally:
        counting(False)
    engine.destroy()
    return steps


def _count_worker(spec_path: str) -> None:
    """One rank of ``--zero3-calls``: ``count_zero3`` for every spec, a ``TAG`` line each from rank 0."""
    import deepspeed
    import torch.distributed as tdist

    deepspeed.init_distributed(dist_backend="gloo")
    for spec in json.loads(Path(spec_path).read_text()):
        steps = count_zero3(config=spec["config"], hf_config=spec["hf_config"], seq_len=spec["seq_len"],
                            recompute=spec["recompute"])
        if tdist.get_rank() == 0:
            print(TAG + json.dumps({"name": spec["name"], "steps": steps}), flush=True)
    from dstk.launch.rank import exit_rank

    exit_rank()


def worker_records(spec_path: Path, *, steps: int, repeats: int, world_size: int = 2) -> list[dict]:
    """One launch of ``_worker`` over the configs in ``spec_path`` on ``world_size`` gloo ranks: rank
    0's ``TAG`` records (name, times, collectives, ...). The leaked shm buffers are removed after.
    Shared by ``zero_dp1_cost.py`` and ``buckets_latency_ab.py``, which run the same worker."""
    sys.path.insert(0, str(ROOT / "tests"))
    from dist import run_ranks

    from dstk.launch.shm import leaked_buffers, remove_leaked

    results = run_ranks(__file__, "--worker", str(spec_path), "--steps", str(steps), "--repeats", str(repeats),
                        env={"PYTHONPATH": str(ROOT)}, timeout=900, world_size=world_size)
    remove_leaked(leaked_buffers())  # DeepSpeed's CPU shm all-reduce never unlinks its 66 MiB per rank
    return [json.loads(line[len(TAG):]) for line in results[0].output.splitlines() if line.startswith(TAG)]


def dstk_cli(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "dstk", *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    if proc.returncode != 0:
        raise SystemExit(f"dstk {' '.join(args)} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return proc.stdout


LARGER = ("--num-layers", "4", "--hidden-size", "256", "--num-heads", "4", "--num-kv-heads", "2",
          "--ffn-hidden-size", "688", "--vocab-size", "4096")
"""A shape whose embedding and head (1M elements) exceed the generated prefetch bucket and whose
MLP weights (176k) exceed DeepSpeed's default persistence threshold (1e5) while its attention
weights stay under it."""


TIGHT = {
    "small-bucket": {"stage3_prefetch_bucket_size": 3000, "stage3_param_persistence_threshold": 0},
    "short-reuse": {"stage3_prefetch_bucket_size": 20000, "stage3_max_live_parameters": 60000,
                    "stage3_max_reuse_distance": 10000, "stage3_param_persistence_threshold": 100},
    "lookahead": {"stage3_prefetch_bucket_size": 20000, "stage3_max_reuse_distance": 0,
                  "stage3_param_persistence_threshold": 100},
}
"""Settings that make modules exceed the prefetch bucket (every module, norms included, one call);
that cap the gathered parameters and release them between forward and backward; and that release
everything the prefetcher has not looked past (reuse distance 0, no live cap)."""


def zero3_specs(work: Path) -> list[dict]:
    """The ``--zero3-calls`` cases: ``{tiny, larger} x {generated, default, TIGHT} x {recompute none,
    full}``, each with its config and HF config."""
    specs = []
    for shape, extra in (("tiny", ()), ("larger", LARGER)):
        for recompute in ("none", "full"):
            out = work / f"{shape}-{recompute}"
            dstk_cli("generate", str(TINY), *extra, "--zero", "3", "--dp", "2", "--recompute", recompute,
                  "--output", str(out))
            plan = json.loads((out / "plan.json").read_text())
            generated = json.loads((out / "ds_config.json").read_text())
            generated.pop("scheduler", None)
            generated["steps_per_print"] = 2**30
            for buckets in ("generated", "default", *TIGHT):
                cfg = copy.deepcopy(generated)
                if buckets != "generated":
                    cfg["zero_optimization"] = {"stage": 3, **TIGHT.get(buckets, {})}
                specs.append({"name": f"{shape} {buckets} recompute={recompute}", "config": cfg,
                              "hf_config": plan["model"]["hf_config"], "seq_len": plan["training"]["seq_len"],
                              "recompute": recompute == "full"})
    return specs


def predicted_zero3(spec: dict, *, first_step: bool) -> dict:
    """What dstk predicts for one spec's micro-batch (one per step): all-gathers in forward, backward
    and after the step (``steptime.zero3_gathers``), reduce-scatters and all-reduces
    (``steptime.collective_calls``)."""
    from dstk.estimate import _model_facts
    from dstk.estimate import steptime as st
    from dstk.estimate.dsconfig import read_settings
    from dstk.models import family_module

    facts = _model_facts(family_module("llama").read(dict(spec["hf_config"]), name=spec["name"]))
    buffers = read_settings(spec["config"]).buffers
    recompute = "full" if spec["recompute"] else "none"
    gathers = st.zero3_gathers(facts=facts, buffers=buffers, recompute=recompute, first_step=first_step)
    params = facts.layers * sum(facts.layer_persistent) + facts.embed + facts.final + facts.lm_head
    calls = st.collective_calls(zero_stage=3, dp=2, tp=1, pp=1, grad_accum=1, stage_layers=facts.layers,
                                recompute=recompute, trainable_params=params,
                                reduce_bucket_size=buffers.reduce_bucket_size, zero3=gathers,
                                grad_tensors=st.stage_grad_tensors(facts, layers=facts.layers, first=True, last=True))
    return {"all_gather": [gathers.forward_calls, gathers.backward_calls, gathers.step_calls],
            "reduce_scatter": calls.dp_buckets, "all_reduce": calls.dp_tail - gathers.step_calls}


def measured_zero3(phases: dict) -> dict:
    """``count_zero3``'s counts of one step in ``predicted_zero3``'s form."""
    def ops(phase, *names):
        return sum(phases[phase].get(name, 0) for name in names)
    return {"all_gather": [ops(p, "all_gather_into_tensor", "all_gather") for p in _PHASES],
            "reduce_scatter": sum(ops(p, "reduce_scatter_tensor", "reduce_scatter") for p in _PHASES),
            "all_reduce": sum(ops(p, "all_reduce") for p in _PHASES)}


FLUSH_BASE = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "train_batch_size": 4,
              "bf16": {"enabled": True}, "steps_per_print": 2**30,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}}
TINY_HF = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 512, "max_position_embeddings": 4096,
           "tie_word_embeddings": False}
LARGER_HF = {**TINY_HF, "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
             "num_key_value_heads": 2, "intermediate_size": 688, "vocab_size": 4096}
GPT2_HF = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 512, "n_positions": 64}
FLUSH_CASES = (
    ("tiny", TINY_HF, 6000), ("tiny", TINY_HF, 20000), ("tiny-tied", {**TINY_HF, "tie_word_embeddings": True}, 6000),
    ("larger", LARGER_HF, 100000), ("larger", LARGER_HF, 50000),
    ("gpt2", GPT2_HF, 6000),
)
"""Models and ``reduce_bucket_size`` values smaller than their largest tensors: the tiny Llama's
MLP matrices (8,192 elements) and embedding/head (32,768) exceed 6,000; at 20,000 only the
embedding and head do; the 5M shape's MLP matrices (176,128) and embedding (1M) exceed 100,000,
and at 50,000 its q and o projections (65,536) too (one of them straddles the 2 ranks' partition
boundary). A tiny GPT-2 (tied, learned positions, biases after each matrix) at 6,000: its QKV
(12,288) and MLP (16,384) matrices exceed the bucket."""


def flush_specs() -> list[dict]:
    """The ``--flush-calls`` cases: ``FLUSH_CASES`` x ZeRO 1, 2, 3 (and ZeRO-1 with ``overlap_comm``,
    which reduces in backward order), one micro-batch per step, DeepSpeed's other defaults."""
    specs = []
    for shape, hf, bucket in FLUSH_CASES:
        for zero, overlap in ((1, None), (1, True), (2, None), (3, None)):
            zero_cfg = {"stage": zero, "reduce_bucket_size": bucket}
            if overlap is not None:
                zero_cfg["overlap_comm"] = overlap
            name = f"{shape} bucket={bucket} ZeRO-{zero}{' overlap' if overlap else ''}"
            specs.append({"name": name, "config": {**FLUSH_BASE, "zero_optimization": zero_cfg}, "hf_config": hf,
                          "seq_len": 16, "recompute": False})
    return specs


def predicted_flushes(spec: dict) -> dict:
    """Gradient reductions of one micro-batch (one per step) for ``spec``: what
    ``steptime.collective_calls`` counts from the model's tensors (``grad_flushes``), and the old
    ``ceil(P / reduce_bucket_size)``."""
    from dstk.estimate import _model_facts
    from dstk.estimate import steptime as st
    from dstk.estimate.dsconfig import read_settings
    from dstk.models import family_module

    hf = spec["hf_config"]
    facts = _model_facts(family_module(hf.get("model_type", "llama")).read(dict(hf), name=spec["name"]))
    buffers = read_settings(spec["config"]).buffers
    zero = spec["config"]["zero_optimization"]["stage"]
    tensors = st.stage_grad_tensors(facts, layers=facts.layers, first=True, last=True)
    calls = st.collective_calls(zero_stage=zero, dp=2, tp=1, pp=1, grad_accum=1, stage_layers=facts.layers,
                                trainable_params=sum(tensors), reduce_bucket_size=buffers.reduce_bucket_size,
                                grad_tensors=tensors, overlap_comm=buffers.overlaps(zero))
    return {"flushes": calls.dp_buckets, "sizes": [int(e) for e in calls.dp_bucket_elements],
            "ceil": -int(-sum(tensors) // buffers.reduce_bucket_size)}


def measured_flushes(phases: dict, *, zero: int) -> int:
    """Gradient reductions in ``count_zero3``'s phases of one step: ZeRO-3's reduce-scatters (all in
    backward), ZeRO-1/2's all-reduces in backward (the overflow flag and the norm are ``step()``'s)."""
    names = ("reduce_scatter_tensor", "reduce_scatter") if zero == 3 else ("all_reduce", "reduce")
    return sum(phases["backward"].get(n, 0) for n in names)


def measured_flush_sizes(phases: dict, *, zero: int) -> list[int]:
    """Elements of each of ``measured_flushes``' calls, in issue order (one op kind per stage)."""
    name = "reduce_scatter_tensor" if zero == 3 else "all_reduce"
    return phases["sizes"]["backward"].get(name, [])


def count_on_ranks(specs: list[dict], *, timeout: float = 900) -> tuple[dict[str, list[dict]], float]:
    """Run ``--count-worker`` over ``specs`` on 2 gloo ranks: ({spec name: its steps' counted calls}, wall
    seconds). DeepSpeed's leaked shm buffers are removed after."""
    sys.path.insert(0, str(ROOT / "tests"))
    from dist import run_ranks

    from dstk.launch.shm import leaked_buffers, remove_leaked

    with tempfile.TemporaryDirectory(prefix="dstk-count-") as tmp:
        spec_path = Path(tmp) / "specs.json"
        spec_path.write_text(json.dumps(specs))
        t0 = time.perf_counter()
        results = run_ranks(__file__, "--count-worker", str(spec_path), env={"PYTHONPATH": str(ROOT)},
                            timeout=timeout)
        wall = time.perf_counter() - t0
    remove_leaked(leaked_buffers())
    measured = {}
    for line in results[0].output.splitlines():
        if line.startswith(TAG):
            r = json.loads(line[len(TAG):])
            measured[r["name"]] = r["steps"]
    return measured, wall


def _flush_calls() -> None:
    specs = flush_specs()
    measured, wall = count_on_ranks(specs)
    print(f"Gradient reductions per micro-batch on 2 gloo ranks (steps 1-3), {wall:.0f} s wall")
    print("sizes: whether every call's elements (in issue order) are the predicted flush's")
    print(f"{'config':<40} {'measured':>12} {'flushes':>8} {'sizes':>6} {'ceil(P/B)':>9}")
    rows = same = same_sizes = same_ceil = 0
    for spec in specs:
        zero = spec["config"]["zero_optimization"]["stage"]
        got = [measured_flushes(p, zero=zero) for p in measured[spec["name"]]]
        want = predicted_flushes(spec)
        sizes = all(measured_flush_sizes(p, zero=zero) == want["sizes"] for p in measured[spec["name"]])
        rows += 1
        same += all(g == want["flushes"] for g in got)
        same_sizes += sizes
        same_ceil += all(g == want["ceil"] for g in got)
        print(f"{spec['name']:<40} {'/'.join(map(str, got)):>12} {want['flushes']:>8} "
              f"{'same' if sizes else 'differ':>6} {want['ceil']:>9}"
              f"{'' if all(g == want['flushes'] for g in got) else '  <- differs'}")
    print(f"{same} of {rows} configs' counts predicted exactly by the flushes ({same_sizes} call by call, sizes "
          f"included), {same_ceil} by ceil(P / bucket)")


def _zero3_calls() -> None:
    work = Path(tempfile.mkdtemp(prefix="dstk-zero3-calls-"))
    specs = zero3_specs(work)
    measured, wall = count_on_ranks(specs)
    shutil.rmtree(work, ignore_errors=True)
    print(f"ZeRO-3 collectives per step on 2 gloo ranks (one micro-batch per step), {wall:.0f} s wall")
    print("AG: all-gathers in forward / backward / after optimizer.step; RS reduce-scatters; AR all-reduces")
    print(f"{'config':<36} {'step':>4}  {'measured AG':>14} {'RS':>2} {'AR':>2}  "
          f"{'predicted AG':>14} {'RS':>2} {'AR':>2}")
    rows = same = 0
    for spec in specs:
        for i, phases in enumerate(measured[spec["name"]], start=1):
            got, want = measured_zero3(phases), predicted_zero3(spec, first_step=i == 1)
            rows += 1
            same += got == want
            ag = "/".join(map(str, got["all_gather"]))
            pag = "/".join(map(str, want["all_gather"]))
            print(f"{spec['name']:<36} {i:>4}  {ag:>14} {got['reduce_scatter']:>2} {got['all_reduce']:>2}  "
                  f"{pag:>14} {want['reduce_scatter']:>2} {want['all_reduce']:>2}"
                  f"{'' if got == want else '  <- differs'}")
    print(f"{same} of {rows} rows predicted exactly")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--hardware", metavar="FILE", help="a --hardware profile for the predictions")
    parser.add_argument("--buckets", choices=("both", "generated", "default"), default="both",
                        help="which configs to run (default: both)")
    parser.add_argument("--zero3-calls", action="store_true",
                        help="count ZeRO-3's collectives per phase instead (tiny and larger Llama, generated and "
                             "default configs, with and without recompute) next to collective_calls'")
    parser.add_argument("--flush-calls", action="store_true",
                        help="count ZeRO-1/2/3's gradient reductions with buckets smaller than the largest matrices "
                             "next to steptime.grad_flushes'")
    parser.add_argument("--worker", metavar="SPECS", help=argparse.SUPPRESS)
    parser.add_argument("--count-worker", metavar="SPECS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker, args.steps, args.repeats)
        return
    if args.count_worker:
        _count_worker(args.count_worker)
        return
    if args.zero3_calls:
        _zero3_calls()
        return
    if args.flush_calls:
        _flush_calls()
        return
    work = Path(tempfile.mkdtemp(prefix="dstk-zero-cost-"))
    hw = ["--hardware", args.hardware] if args.hardware else []
    specs, rows = [], []
    for buckets in ("generated", "default") if args.buckets == "both" else (args.buckets,):
        for zero in (0, 1, 2, 3):
            out = work / f"z{zero}"
            if not (out / "plan.json").exists():
                # dp pinned: with latency priced, the planner's free ZeRO-3 pick is tp=2 dp=1 (no gathers).
                dstk_cli("generate", str(TINY), "--zero", str(zero), "--dp", "2", "--output", str(out), *hw)
            plan = json.loads((out / "plan.json").read_text())
            cfg = json.loads((out / "ds_config.json").read_text())
            cfg.pop("scheduler", None)
            cfg["steps_per_print"] = 2**30
            if buckets == "default":
                cfg = copy.deepcopy(cfg)
                cfg["zero_optimization"] = {"stage": zero}
            path = work / f"{buckets}-z{zero}.json"
            path.write_text(json.dumps(cfg, indent=1))
            est = json.loads(dstk_cli("estimate", "--intent", str(TINY), "--config", str(path), "--format", "json", *hw))
            time_ = est.get("time") or est.get("plan", {}).get("time")
            name = f"ZeRO-{zero} {buckets}"
            specs.append({"name": name, "group": buckets, "config": cfg, "hf_config": plan["model"]["hf_config"],
                          "seq_len": plan["training"]["seq_len"]})
            rows.append({"name": name, "predicted": time_["step_seconds"], "zero": zero, "buckets": buckets,
                         "bucket": cfg["zero_optimization"].get("reduce_bucket_size", "default")})
    spec_path = work / "specs.json"
    spec_path.write_text(json.dumps(specs))
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    measured = {r["name"]: r for r in worker_records(spec_path, steps=args.steps, repeats=args.repeats)}
    wall = time.perf_counter() - t0
    shutil.rmtree(work, ignore_errors=True)
    print(f"2 gloo ranks, {args.steps} steps x {args.repeats} batches per config, {wall:.0f} s wall, "
          f"load average {load:.1f} before{', ' + args.hardware if args.hardware else ''}")
    print(f"{'config':<20} {'bucket':>9} {'median':>8} {'best':>8} {'predicted':>9} {'error':>7}  collectives per step")
    errors = []
    for row in rows:
        m = measured[row["name"]]
        err = row["predicted"] / m["min"] - 1
        if row["buckets"] == "generated" and row["zero"] < 3:
            errors.append(abs(err))
        ops = ", ".join(f"{k} {v:g}" for k, v in m["collectives"].items())
        print(f"{row['name']:<20} {row['bucket']!s:>9} {m['seconds'] * 1e3:6.1f}ms {m['min'] * 1e3:6.1f}ms "
              f"{row['predicted'] * 1e3:8.1f}ms "
              f"{err:+7.1%}  {ops}")
    gen = [r for r in rows if r["buckets"] == "generated" and r["zero"] < 3]
    by_measured = [r["zero"] for r in sorted(gen, key=lambda r: measured[r["name"]]["min"])]
    by_predicted = [r["zero"] for r in sorted(gen, key=lambda r: r["predicted"])]
    print(f"ZeRO-0/1/2 (generated) order: measured (best) {by_measured}, predicted {by_predicted}; "
          f"worst error {max(errors):.1%}")


if __name__ == "__main__":
    main()
