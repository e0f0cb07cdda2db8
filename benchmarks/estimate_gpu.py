"""Predicted vs measured on one GPU: peak memory (``torch.cuda.max_memory_allocated``) and step
time of a ~1B Llama (Llama-3.2-1B dimensions, random weights from its config, no download) under
DeepSpeed, ZeRO 0 and 3, with and without full recompute, bf16, AdamW; each case predicted with
the catalog's figures and, with ``--hardware FILE``, with a calibrated profile
(``dstk doctor --calibrate``): before and after calibration, one line each.

    python benchmarks/estimate_gpu.py [--gpu h200] [--hardware hw.yaml] [--json OUT.json]
        [--seq-len 2048] [--micro-batch 4] [--steps 6] [--cases 0:none,0:full,3:none,3:full]
    python benchmarks/estimate_gpu.py --cpu-smoke [--hardware hw.yaml]   # the same path, tiny model, gloo

The prediction is the planner's own call: the intent is resolved by ``dstk.plan.resolve`` (with
``cluster.hardware`` set to the profile for the calibrated line) and the layout priced by
``Context.estimate``, the function that ranks the planner's layouts, with the ZeRO buffers
``dstk generate`` writes. The run uses the DeepSpeed config ``dstk generate`` writes for that
layout (``dstk.render.ds_config``), with ``torch_adam`` (DeepSpeed's fused Adam would need a CUDA
op build on the machine). Where the calibrated profile would choose other buffers than the
measured config holds, its line prices the measured config's buffers and says so.

Measured: the step is forward + backward + optimizer step of the engine, timed with the
accelerator synchronized; the figure is the median of the steps after the first two. The memory
is ``max_memory_allocated`` over initialize and every step (what the estimator's peak is; the
CUDA context is outside it, so the GPU entry's ``overhead_bytes`` is set to 0 for the
prediction). On CPU ranks (``--cpu-smoke``) there is no allocator peak to read: memory is not
measured there, only the step time.

Prints one line per case and source, and with ``--json`` writes every figure (rewritten after each
case, so a run stopped by a timeout keeps the cases done). Run on a GPU by ``benchmarks/gpu_check.sh``;
``tests/test_gpu_check.py`` runs its ``--cpu-smoke`` path.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import statistics
import sys
import time

GPU_MODEL = "llama-3.2-1b"
SMOKE_MODEL = {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "num_kv_heads": 2, "ffn_hidden_size": 128,
               "vocab_size": 512}
"""The smoke's model: examples/intents/tiny-llama-cpu.yaml's dimensions."""
CASES = ((0, "none"), (0, "full"), (3, "none"), (3, "full"))
WARMUP_STEPS = 2


def intent_for(*, model: str | dict, gpu_slug: str, hardware: str | None, seq_len: int, micro_batch: int,
               steps: int):
    """The intent a user would write for this run: one node, one GPU, bf16, sdpa attention."""
    from dstk.intent import intent_from_dict

    cluster = {"num_nodes": 1, "gpus_per_node": 1, "gpu": gpu_slug}
    if hardware:
        cluster["hardware"] = hardware
    return intent_from_dict({
        "model": {"name": model} if isinstance(model, str) else dict(model),
        "cluster": cluster,
        "training": {"seq_len": seq_len, "global_batch": micro_batch, "precision": "bf16", "attention": "sdpa",
                     "train_steps": max(steps, 2), "warmup_steps": 1},
    }, source="benchmarks/estimate_gpu.py")


def context_for(intent):
    """``dstk.plan.resolve(intent)`` with the GPU's ``overhead_bytes`` at 0: ``max_memory_allocated``
    does not count the CUDA context and the framework's reserve that the overhead stands for."""
    from dstk.plan import resolve

    ctx = resolve(intent)
    gpu = ctx.cluster.gpu.replace(overhead_bytes=0)
    return dataclasses.replace(ctx, cluster=dataclasses.replace(ctx.cluster, gpu=gpu))


def predict(*, ctx, layout, buffers) -> dict:
    """The planner's estimate of ``layout`` (``Context.estimate``); where the context's own buffers
    differ from ``buffers`` (those of the config that runs), the same estimator with ``buffers``."""
    from dstk.estimate import estimate

    own = ctx.buffers(layout)[0]
    if own == buffers:
        est, note = ctx.estimate(layout), "the planner's call (Context.estimate)"
    else:
        est = estimate(model=ctx.model, layout=layout, training=ctx.training, cluster=ctx.cluster, buffers=buffers,
                       engine=ctx.intent.constraints.engine)
        note = "the measured config's ZeRO buffers (this hardware would choose others)"
    t = est.time
    return {"memory_bytes": est.memory.per_gpu.total_bytes, "step_seconds": t.step_seconds,
            "compute_seconds": t.compute_seconds, "comm_seconds": t.comm_seconds,
            "tokens_per_second": t.tokens_per_second, "note": note}


def measure(*, spec, ds_config: dict, seq_len: int, micro_batch: int, recompute: str, steps: int) -> dict:
    """Build the model from its config on the accelerator, ``deepspeed.initialize`` it with
    ``ds_config`` and time ``steps`` training steps (module docstring)."""
    import deepspeed
    import torch
    import transformers
    from deepspeed.accelerator import get_accelerator

    acc = get_accelerator()
    cuda = acc.device_name() == "cuda"
    keys = dict(spec.hf_config)
    config = transformers.AutoConfig.for_model(keys.pop("model_type"), **keys, attn_implementation="sdpa")
    config.use_cache = False
    torch.manual_seed(0)
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    with torch.device(acc.current_device_name()):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    if recompute == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=[p for p in model.parameters()],
                                      config=ds_config)
    ids = torch.randint(0, spec.vocab_size, (micro_batch, seq_len), device=engine.device)
    times, loss = [], None
    for _ in range(steps):
        acc.synchronize()
        start = time.perf_counter()
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        acc.synchronize()
        times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() if cuda else None
    last_loss = float(loss.detach().float().item())
    engine.destroy()
    del engine, model, loss
    gc.collect()
    acc.empty_cache()
    timed = times[WARMUP_STEPS:] or times
    return {"peak_bytes": peak, "step_seconds": statistics.median(timed), "all_step_seconds": times,
            "loss": last_loss}


def _err(predicted: float | None, measured: float | None) -> float | None:
    return None if predicted is None or not measured else predicted / measured - 1


def case_line(*, zero: int, recompute: str, source: str, predicted: dict, measured: dict) -> str:
    """One line: predicted and measured memory and step time, and the errors."""
    gib = 2**30
    mem_err, step_err = _err(predicted["memory_bytes"], measured["peak_bytes"]), _err(predicted["step_seconds"],
                                                                                       measured["step_seconds"])
    memory = (f"memory: predicted {predicted['memory_bytes'] / gib:7.3f} GiB, "
              + (f"measured {measured['peak_bytes'] / gib:7.3f} GiB ({mem_err:+.1%})" if measured["peak_bytes"]
                 else "measured n/a (no allocator peak on CPU ranks)"))
    return (f"ZeRO-{zero} recompute={recompute:<4} {source:<10} {memory}; step: predicted "
            f"{predicted['step_seconds']:.4f} s, measured {measured['step_seconds']:.4f} s ({step_err:+.1%})")


def hardware_lines(*, catalog, calibrated) -> list[str]:
    """The calibrated figures next to the catalog's: the GEMM curve at each measured width, HBM
    bandwidth, the per-layer and per-step floors."""
    lines = [f"hardware: catalog {catalog.slug!r} vs calibrated profile ({calibrated.name})"]
    peak_c, peak_m = catalog.bf16_flops or catalog.fp32_flops, calibrated.bf16_flops or calibrated.fp32_flops
    for dim, _ in calibrated.gemm_efficiency or ():
        fc, fm = catalog.gemm_fraction(dim), calibrated.gemm_fraction(dim)
        lines.append(f"  GEMM d={int(dim):>5}: catalog {fc:.3f} of {peak_c / 1e12:.0f} TFLOP/s = "
                     f"{fc * peak_c / 1e12:7.1f}, measured {fm:.3f} of {peak_m / 1e12:.0f} = {fm * peak_m / 1e12:7.1f} "
                     f"TFLOP/s ({fm * peak_m / (fc * peak_c) - 1:+.1%})")
    hc, hm = catalog.hbm_bytes_per_s, calibrated.hbm_bytes_per_s
    lines.append(f"  HBM: catalog {hc / 1e9 if hc else float('nan'):.0f} GB/s, measured "
                 f"{hm / 1e9 if hm else float('nan'):.0f} GB/s")
    for name in ("layer_overhead_seconds", "step_overhead_seconds"):
        lines.append(f"  {name}: catalog {getattr(catalog, name) * 1e3:.3f} ms, calibrated "
                     f"{getattr(calibrated, name) * 1e3:.3f} ms")
    return lines


def _gpu_dict(gpu) -> dict:
    return {"slug": gpu.slug, "name": gpu.name, "bf16_flops": gpu.bf16_flops, "hbm_bytes_per_s": gpu.hbm_bytes_per_s,
            "gemm_efficiency": [list(p) for p in gpu.gemm_efficiency or ()],
            "layer_overhead_seconds": gpu.layer_overhead_seconds, "step_overhead_seconds": gpu.step_overhead_seconds}


def _write(path: str | None, data: dict) -> None:
    if path:
        tmp = f"{path}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2)
        os.replace(tmp, path)


def run(*, model, gpu_slug: str, hardware: str | None, seq_len: int, micro_batch: int, steps: int,
        cases, json_path: str | None) -> dict:
    """Every case: measured once, predicted with the catalog and (with ``hardware``) the profile."""
    import torch
    import transformers
    from deepspeed import __version__ as ds_version
    from deepspeed.accelerator import get_accelerator

    from dstk.layout import Layout
    from dstk.render import ds_config

    sources = {"catalog": context_for(intent_for(model=model, gpu_slug=gpu_slug, hardware=None, seq_len=seq_len,
                                                 micro_batch=micro_batch, steps=steps))}
    if hardware:
        sources["calibrated"] = context_for(intent_for(model=model, gpu_slug=gpu_slug, hardware=hardware,
                                                       seq_len=seq_len, micro_batch=micro_batch, steps=steps))
    base = sources["catalog"]
    acc = get_accelerator()
    device = acc.device_name()
    report = {"model": model, "num_params": base.model.num_params, "gpu": gpu_slug, "hardware": hardware,
              "device": device, "device_name": torch.cuda.get_device_name(0) if device == "cuda" else None,
              "seq_len": seq_len, "micro_batch": micro_batch, "steps": steps, "warmup_steps": WARMUP_STEPS,
              "versions": {"python": sys.version.split()[0], "torch": torch.__version__, "deepspeed": ds_version,
                           "transformers": transformers.__version__},
              "gpus": {name: _gpu_dict(ctx.cluster.gpu) for name, ctx in sources.items()}, "cases": []}
    print(f"{base.model.name}: {base.model.num_params / 1e6:,.1f} M parameters, seq {seq_len} x micro-batch "
          f"{micro_batch}, bf16, {steps} steps (median of the last {max(1, steps - WARMUP_STEPS)}); {device}"
          + (f" ({report['device_name']})" if report["device_name"] else ""), flush=True)
    if "calibrated" in sources:
        print("\n".join(hardware_lines(catalog=base.cluster.gpu, calibrated=sources["calibrated"].cluster.gpu)),
              flush=True)
    _write(json_path, report)
    for zero, recompute in cases:
        layout = Layout(dp=1, zero_stage=zero, micro_batch=micro_batch, grad_accum=1, recompute=recompute)
        buffers = base.buffers(layout)[0]
        config = ds_config(layout=layout, training=base.intent.training, torch_adam=True, buffers=buffers)
        config["steps_per_print"] = 10**9
        predicted = {name: predict(ctx=ctx, layout=layout, buffers=buffers) for name, ctx in sources.items()}
        t0 = time.perf_counter()
        try:
            measured = measure(spec=base.model, ds_config=config, seq_len=seq_len, micro_batch=micro_batch,
                               recompute=recompute, steps=steps)
        except Exception as exc:  # one case failing (out of memory, say) must not lose the others
            error = f"{type(exc).__name__}: {str(exc)[:500]}"
            print(f"ZeRO-{zero} recompute={recompute:<4} FAILED after {time.perf_counter() - t0:.1f} s: {error}",
                  flush=True)
            report["cases"].append({"zero_stage": zero, "recompute": recompute, "ds_config": config,
                                    "error": error, "predicted": predicted})
            _write(json_path, report)
            gc.collect()
            acc.empty_cache()
            continue
        measured["case_seconds"] = time.perf_counter() - t0
        for name, pred in predicted.items():
            pred["memory_error"] = _err(pred["memory_bytes"], measured["peak_bytes"])
            pred["step_error"] = _err(pred["step_seconds"], measured["step_seconds"])
            print(case_line(zero=zero, recompute=recompute, source=name, predicted=pred, measured=measured),
                  flush=True)
        report["cases"].append({"zero_stage": zero, "recompute": recompute, "ds_config": config,
                                "measured": measured, "predicted": predicted})
        _write(json_path, report)
    return report


def _load(path: str):
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return {"unreadable": text[-2000:]}


def summarize(*, out_dir: str, work_dir: str, status: int) -> dict:
    """``benchmarks/gpu_check.sh``'s last stage: the stages' times and exit statuses, the set-up, the
    calibration (every figure and its source) and the cases, gathered into ``OUT/gpu_check.json``,
    and a digest printed for the note."""
    stages = []
    try:
        with open(os.path.join(work_dir, "stages.jsonl"), encoding="utf-8") as f:
            stages = [json.loads(line) for line in f if line.strip()]
    except OSError:
        pass
    calibrate = _load(os.path.join(out_dir, "calibrate.json"))
    cases = _load(os.path.join(out_dir, "estimate_gpu.json"))
    summary = {"status": status, "stages": stages, "setup": _load(os.path.join(work_dir, "setup.json")),
               "calibrate": calibrate, "estimate": cases}
    _write(os.path.join(out_dir, "gpu_check.json"), summary)
    lines = ["stages: " + ", ".join(f"{s['name']} {s['seconds']:.1f} s"
                                    + ("" if s["rc"] == 0 else f" (exit {s['rc']}, limit {s['limit_s']} s)")
                                    for s in stages)]
    profile = (calibrate or {}).get("profile") if isinstance(calibrate, dict) else None
    if profile:
        lines.append(f"calibrated {profile['slug']!r} ({profile['name']}):")
        for fig in profile["figures"]:
            value = fig["value"]
            if isinstance(value, list):
                value = " ".join(f"{int(d)}:{x:.3g}" for d, x in value)
            lines.append(f"  {fig['source']:<8} {fig['key']:<26} {value}")
        lines += [f"  warning: {w}" for w in profile.get("warnings", ())]
    else:
        lines.append("calibration: no profile (see calibrate.json / the log)")
    for case in (cases or {}).get("cases", ()):
        if "error" in case:
            lines.append(f"ZeRO-{case['zero_stage']} recompute={case['recompute']:<4} FAILED: {case['error']}")
            continue
        for name, pred in case["predicted"].items():
            lines.append(case_line(zero=case["zero_stage"], recompute=case["recompute"], source=name,
                                   predicted=pred, measured=case["measured"]))
    print("\n".join(lines), flush=True)
    return summary


def parse_cases(text: str) -> tuple[tuple[int, str], ...]:
    """``0:none,3:full`` -> ((0, "none"), (3, "full"))."""
    out = []
    for item in text.split(","):
        zero, _, recompute = item.strip().partition(":")
        if zero not in ("0", "1", "2", "3") or recompute not in ("none", "selective", "full"):
            raise SystemExit(f"--cases: expected STAGE:RECOMPUTE items such as 0:none,3:full, got {item!r}")
        out.append((int(zero), recompute))
    return tuple(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", default=None,
                        help="catalog entry (default: from the device name, as doctor --calibrate picks it; cpu "
                             "with --cpu-smoke)")
    parser.add_argument("--hardware", default=None, metavar="FILE",
                        help="a profile from `dstk doctor --calibrate`: a second, calibrated prediction per case")
    parser.add_argument("--json", default=None, metavar="FILE", help="write every figure here")
    parser.add_argument("--seq-len", type=int, default=None, help="default 2048 (64 with --cpu-smoke)")
    parser.add_argument("--micro-batch", type=int, default=None, help="default 4 (2 with --cpu-smoke)")
    parser.add_argument("--steps", type=int, default=None, help="default 6 (4 with --cpu-smoke)")
    parser.add_argument("--cases", default=None, help="STAGE:RECOMPUTE,... (default 0:none,0:full,3:none,3:full; "
                                                      "0:none,3:full with --cpu-smoke)")
    parser.add_argument("--cpu-smoke", action="store_true",
                        help="the same path on CPU ranks (gloo) with a tiny Llama: keeps the GPU script working")
    parser.add_argument("--summary", default=None, metavar="OUT_DIR", help=argparse.SUPPRESS)
    parser.add_argument("--work", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--status", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.summary:  # gpu_check.sh's last stage: no DeepSpeed, no process group
        summarize(out_dir=args.summary, work_dir=args.work or args.summary, status=args.status)
        return 0
    smoke = args.cpu_smoke
    # One process that is its own single rank: set the rendezvous here, never inherit it (a caller that
    # ran DeepSpeed in-process, such as a test session, leaves MASTER_PORT pointing at its live store).
    from dstk.launch.rundir import free_port

    os.environ.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())})
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    device = get_accelerator().device_name()
    if smoke != (device == "cpu"):
        raise SystemExit(f"estimate_gpu.py: DeepSpeed's accelerator here is {device!r}: "
                         + ("--cpu-smoke runs on CPU ranks (set DS_ACCELERATOR=cpu)" if smoke
                            else "this benchmark needs a CUDA GPU (or --cpu-smoke)"))
    deepspeed.init_distributed(dist_backend=get_accelerator().communication_backend_name())
    gpu_slug = args.gpu
    if gpu_slug is None:  # the entry `doctor --calibrate` bases its profile on: from the device name
        import torch

        from dstk.calibrate import guess_gpu_slug

        gpu_slug = guess_gpu_slug(None if smoke else torch.cuda.get_device_name(0), cpu=smoke)
        if gpu_slug is None:
            raise SystemExit(f"estimate_gpu.py: no catalog entry matches {torch.cuda.get_device_name(0)!r}: "
                             "give --gpu SLUG (dstk gpus lists them)")
    report = run(model=dict(SMOKE_MODEL) if smoke else GPU_MODEL, gpu_slug=gpu_slug,
        hardware=args.hardware, seq_len=args.seq_len or (64 if smoke else 2048),
        micro_batch=args.micro_batch or (2 if smoke else 4), steps=args.steps or (4 if smoke else 6),
        cases=parse_cases(args.cases) if args.cases else ((0, "none"), (3, "full")) if smoke else CASES,
        json_path=args.json)
    sys.stdout.flush()
    return 1 if any("error" in case for case in report["cases"]) else 0


if __name__ == "__main__":
    code = main()
    if "--summary" in sys.argv:
        sys.exit(code)
    from dstk.launch.rank import exit_rank  # a rank: leave as rank scripts do

    exit_rank(code)
