"""ZeRO over one data-parallel rank on CPU ranks: the tiny Llama
(``examples/intents/tiny-llama-cpu.yaml``) on 2 gloo ranks as ``tp=2 dp=1`` with ZeRO 0/1/2/3 and as
``dp=2`` with ZeRO 0/3, each with the config ``dstk generate`` writes, measured next to
``dstk estimate --config``'s prediction.

    .venv/bin/python benchmarks/zero_dp1_cost.py [--steps 5] [--repeats 10] [--launches 2]
    .venv/bin/python benchmarks/zero_dp1_cost.py --one-rank [--shapes tiny,deep,wide]

``--one-rank`` runs instead ZeRO 0/1/2/3 on a single rank (dp=1, no collective at all) for the tiny
Llama and shapes that scale its parameter tensors and modules (``deep``: 4 layers, 1.9x the tensors
and modules, 1.5x the elements) or its elements alone (``wide``: h = 128, the same tensors and
modules, 3.1x the elements): what ZeRO's own work (hooks, copies, bookkeeping) costs per step and
what it scales with (``steptime.zero_overhead_seconds``; the ``cpu`` entry's ``zero_tensor_seconds``
and ``zero3_tensor_seconds`` come from it), next to the prediction. "over Z0" columns subtract the
same shape's (or layout's) ZeRO-0, measured and predicted.

With dp=1, ZeRO has one partition: it shards nothing, yet DeepSpeed still runs its hooks, its
flat-buffer copies and (ZeRO-3) its gather/release bookkeeping. This prints what that costs next to
ZeRO-0 on the same layout, so the planner's rule for ZeRO at dp=1 rests on numbers.

The ranks and timing are ``benchmarks/zero_cpu_cost.py``'s worker (configs take turns, per batch the
slowest rank's time). AutoTP sets DeepSpeed's process-wide tensor-parallel mesh, so tp=2 and dp=2
configs run in separate launches, alternated ``--launches`` times; the best and the median are over
every round of every launch.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from zero_cpu_cost import dstk_cli, worker_records

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "examples" / "intents" / "tiny-llama-cpu.yaml"
LAYOUTS = (("tp=2 dp=1", 2, 1, (0, 1, 2, 3)), ("dp=2", 1, 2, (0, 3)))
SHAPES = {"tiny": {}, "deep": {"num_layers": 4}, "wide": {"hidden_size": 128, "ffn_hidden_size": 256}}
"""``--one-rank`` shapes: the tiny Llama, twice its layers (tensors, modules and elements x2), and
twice its width (tensors and modules x1, elements ~x4)."""


def _counts(hf: dict) -> tuple[int, int, int]:
    """``(parameter tensors, modules, elements)`` of the HF Llama built from ``hf``."""
    layers, h, f, v = hf["num_hidden_layers"], hf["hidden_size"], hf["intermediate_size"], hf["vocab_size"]
    kv = h // hf["num_attention_heads"] * hf["num_key_value_heads"]
    tied = hf.get("tie_word_embeddings", False)
    tensors = 9 * layers + 2 + (0 if tied else 1)
    modules = 13 * layers + 7  # HF's module tree: ``len(list(model.named_modules()))``
    elements = layers * (2 * h * h + 2 * h * kv + 3 * h * f + 2 * h) + v * h * (1 if tied else 2) + h
    return tensors, modules, elements


def _intent(*, work: Path, name: str, model: dict, gpus_per_node: int) -> Path:
    """The tiny intent with ``model`` fields and ``gpus_per_node`` changed, written under ``work``."""
    import yaml

    intent = yaml.safe_load(TINY.read_text())
    intent["model"].update(model)
    intent["cluster"]["gpus_per_node"] = gpus_per_node
    path = work / f"intent-{name}.yaml"
    path.write_text(yaml.safe_dump(intent))
    return path


def _spec(*, name: str, group: str, layout: tuple, intent: Path, work: Path) -> tuple[dict, float]:
    """``dstk generate`` of ``intent`` with ``layout`` flags and ``dstk estimate --config`` of what it
    wrote: the worker's spec and the predicted seconds per step."""
    out = work / name.replace(" ", "_").replace("=", "")
    dstk_cli("generate", str(intent), *layout, "--output", str(out))
    plan = json.loads((out / "plan.json").read_text())
    cfg = json.loads((out / "ds_config.json").read_text())
    cfg.pop("scheduler", None)
    cfg["steps_per_print"] = 2**30
    path = out.with_suffix(".json")
    path.write_text(json.dumps(cfg, indent=1))
    est = json.loads(dstk_cli("estimate", "--intent", str(intent), "--config", str(path), "--format", "json"))
    time_ = est.get("time") or est.get("plan", {}).get("time")
    return ({"name": name, "group": group, "config": cfg, "hf_config": plan["model"]["hf_config"],
             "seq_len": plan["training"]["seq_len"]}, time_["step_seconds"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--launches", type=int, default=2)
    parser.add_argument("--one-rank", action="store_true", help="ZeRO 0-3 on one rank, several shapes")
    parser.add_argument("--shapes", default="tiny,deep,wide", help="--one-rank shapes: " + ", ".join(SHAPES))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dstk-zero-dp1-"))
    groups: dict[str, list[dict]] = {}
    rows = []
    if args.one_rank:
        world = 1
        for shape in args.shapes.split(","):
            for zero in (0, 1, 2, 3):
                name = f"1 rank {shape} ZeRO-{zero}"
                intent = _intent(work=work, name=shape, model=SHAPES[shape], gpus_per_node=1)
                spec, predicted = _spec(name=name, group=shape, work=work, layout=("--zero", str(zero)), intent=intent)
                groups.setdefault("all", []).append(spec)
                rows.append({"name": name, "predicted": predicted, "shape": shape, "zero": zero,
                             "counts": _counts(spec["hf_config"]), "ga": spec["config"]["gradient_accumulation_steps"]})
    else:
        world = 2
        for label, tp, dp, stages in LAYOUTS:
            for zero in stages:
                name = f"{label} ZeRO-{zero}"
                spec, predicted = _spec(name=name, group=label, work=work, intent=TINY,
                                        layout=("--zero", str(zero), "--tp", str(tp), "--dp", str(dp)))
                groups.setdefault(label, []).append(spec)
                rows.append({"name": name, "predicted": predicted})
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    times: dict[str, list[float]] = {}
    calls: dict[str, dict] = {}
    for _ in range(args.launches):
        for label, specs in groups.items():
            spec_path = work / f"specs-{label.replace(' ', '_').replace('=', '')}.json"
            spec_path.write_text(json.dumps(specs))
            for r in worker_records(spec_path, steps=args.steps, repeats=args.repeats, world_size=world):
                times.setdefault(r["name"], []).extend(r["times"])
                calls[r["name"]] = r["collectives"]
    wall = time.perf_counter() - t0
    shutil.rmtree(work, ignore_errors=True)
    print(f"{world} gloo rank(s), {args.steps} steps x {args.repeats} batches x {args.launches} launches per config, "
          f"{wall:.0f} s wall, load average {load:.1f} before, {os.getloadavg()[0]:.1f} after")
    if args.one_rank:
        print(f"{'config':<22} {'tensors':>7} {'modules':>7} {'elements':>9} {'ga':>3} {'median':>8} {'best':>8} "
              f"{'over Z0':>8} {'predicted':>9} {'pred over Z0':>12}")
        base = {}
        for row in rows:
            t = min(times[row["name"]])
            if row["zero"] == 0:
                base[row["shape"]] = (t, row["predicted"])
            b, pb = base[row["shape"]]
            n_t, n_m, n_e = row["counts"]
            print(f"{row['name']:<22} {n_t:>7} {n_m:>7} {n_e:>9} {row['ga']:>3} "
                  f"{statistics.median(times[row['name']]) * 1e3:6.1f}ms {t * 1e3:6.1f}ms "
                  f"{(t - b) * 1e3:+6.1f}ms {row['predicted'] * 1e3:7.1f}ms {(row['predicted'] - pb) * 1e3:+10.1f}ms")
        return
    # "over Z0": best round and prediction minus the same layout's ZeRO-0 (the load of the run cancels
    # in part): what ZeRO's own work and its collectives add.
    print(f"{'config':<18} {'median':>8} {'best':>8} {'predicted':>9} {'over Z0':>8} {'pred over Z0':>12}  "
          "collectives per step")
    base = {}
    for row in rows:
        t = times[row["name"]]
        label = row["name"].rsplit(" ZeRO-", 1)[0]
        base.setdefault(label, (min(t), row["predicted"]))
        b, pb = base[label]
        print(f"{row['name']:<18} {statistics.median(t) * 1e3:6.1f}ms {min(t) * 1e3:6.1f}ms "
              f"{row['predicted'] * 1e3:7.1f}ms {(min(t) - b) * 1e3:+6.1f}ms {(row['predicted'] - pb) * 1e3:+10.1f}ms  "
              + ", ".join(f"{k} {v:g}" for k, v in calls[row["name"]].items()))


if __name__ == "__main__":
    main()
