"""The planner against the layouts of published Megatron runs: does each published layout fit under
the megatron engine, and is the planner's pick predicted no slower than it?

    .venv/bin/python benchmarks/plan_published.py

Rows (models, hardware and the estimator calls as in ``benchmarks/estimate_published.py``, which
says where each figure comes from: GPT-3-style decoders, s = 2048, V = 51200, fp16, eager attention,
A100-80GB, 8 per node, HDR InfiniBand):

- Narayanan et al. 2021 (arXiv 2104.04473) Table 2, PTD-P: 175B on TP 8 x PP 12 (384/768/1536 GPUs,
  batch 1536) and 530B on TP 8 x PP 35 (560/1120/2240 GPUs, batch 2240); micro-batch 1, full
  recompute, no distributed optimizer (ZeRO 0).
- Korthikanti et al. 2022 (arXiv 2205.05198) Table 5: 530B on TP 8 x PP 35 (280 GPUs, batch 280) and
  1T on TP 8 x PP 64 (512 GPUs, batch 512), micro-batch 1, full recompute and "selective + SP".

For each row: the published layout's predicted per-GPU memory against the usable memory (default
10% headroom) and its predicted step time; the planner's pick for the same model, GPUs and batch
(engine megatron, nothing pinned) and its predicted step time; and the ratio. Nothing is fitted
here: the planner and the estimator are the library's. Exit status 1 when a published layout does
not fit or a pick is predicted slower than the published layout.
"""

from __future__ import annotations

import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from estimate_published import SEQ, _cluster, _estimate, gpt  # noqa: E402

from dstk.intent import Constraints  # noqa: E402
from dstk.layout import Layout, Training  # noqa: E402
from dstk.plan import Search, describe, gib, plan  # noqa: E402

MODELS = {"175B": (96, 12288, 96), "530B": (128, 20480, 105), "1T": (160, 25600, 128)}
# (source, model, GPUs, global batch, tp, pp, recompute, sequence parallel)
ROWS = (
    ("Narayanan T2 PTD-P", "175B", 384, 1536, 8, 12, "full", False),
    ("Narayanan T2 PTD-P", "175B", 768, 1536, 8, 12, "full", False),
    ("Narayanan T2 PTD-P", "175B", 1536, 1536, 8, 12, "full", False),
    ("Narayanan T2 PTD-P", "530B", 560, 2240, 8, 35, "full", False),
    ("Narayanan T2 PTD-P", "530B", 1120, 2240, 8, 35, "full", False),
    ("Narayanan T2 PTD-P", "530B", 2240, 2240, 8, 35, "full", False),
    ("Korthikanti T5", "530B", 280, 280, 8, 35, "full", False),
    ("Korthikanti T5", "530B", 280, 280, 8, 35, "selective", True),
    ("Korthikanti T5", "1T", 512, 512, 8, 64, "full", False),
    ("Korthikanti T5", "1T", 512, 512, 8, 64, "selective", True),
)


def check_row(source: str, name: str, gpus: int, batch: int, tp: int, pp: int, recompute: str, sp: bool) -> dict:
    """The published layout's fit and time, and the planner's pick for the same job."""
    heads, hidden, layers = MODELS[name]
    model = gpt(heads, hidden, layers)
    training = Training(seq_len=SEQ, global_batch=batch, precision="fp16", attention="eager")
    cluster = _cluster(gpus)

    def estimate(layout: Layout):
        return _estimate(engine="megatron", model=model, layout=layout, training=training, cluster=cluster)

    search = Search(world_size=gpus, gpus_per_node=cluster.gpus_per_node, num_layers=layers, num_heads=heads,
                    num_kv_heads=heads, global_batch=batch, capacity_bytes=cluster.gpu.memory_bytes,
                    overhead_bytes=cluster.gpu.overhead_bytes, constraints=Constraints(engine="megatron"))
    dp = gpus // (tp * pp)
    published = Layout(dp=dp, tp=tp, pp=pp, micro_batch=1, grad_accum=batch // dp, recompute=recompute,
                       sequence_parallel=sp)
    est = estimate(published)
    start = time.perf_counter()
    result = plan(search=search, estimate=estimate, top=1)
    seconds = time.perf_counter() - start
    pick = result.plans[0] if result.plans else None
    return {
        "row": f"{source} {name} {gpus} GPUs {recompute}{' + SP' if sp else ''}",
        "published": published, "published_bytes": est.memory.per_gpu.total_bytes,
        "published_seconds": est.time.step_seconds, "usable_bytes": search.usable_bytes,
        "fits": est.memory.per_gpu.total_bytes <= search.usable_bytes,
        "pick": pick, "pick_seconds": pick.estimate.time.step_seconds if pick else None,
        "num_considered": result.num_considered, "search_seconds": seconds,
    }


def main() -> int:
    bad = 0
    for row in ROWS:
        r = check_row(*row)
        pick = r["pick"]
        fit = "fits" if r["fits"] else "DOES NOT FIT"
        print(f"{r['row']}")
        print(f"  published {describe(r['published'])}: {gib(r['published_bytes'])} of {gib(r['usable_bytes'])} "
              f"usable ({fit}), {r['published_seconds']:.2f} s/step")
        if pick is None:
            print(f"  planner: nothing fits ({r['num_considered']} layouts)")
            bad += 1
            continue
        ratio = r["pick_seconds"] / r["published_seconds"]
        print(f"  planner   {describe(pick.layout)}: {gib(pick.estimate.memory.per_gpu.total_bytes)}, "
              f"{r['pick_seconds']:.2f} s/step = {ratio:.3f}x the published layout "
              f"({r['num_considered']} layouts, {r['search_seconds']:.2f} s)")
        for line in pick.why[:2]:
            print(f"    why: {line}")
        bad += (not r["fits"]) + (ratio > 1 + 1e-9)
    print(f"\n{len(ROWS) - bad if bad <= len(ROWS) else 0} of {len(ROWS)} rows: published layout fits and the pick "
          f"is predicted no slower" if not bad else f"\n{bad} problem(s) in {len(ROWS)} rows")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
