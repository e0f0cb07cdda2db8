"""How long one ``dstk.estimate.estimate`` takes (the planner calls it for every layout).

    .venv/bin/python benchmarks/estimate_speed.py [--repeat 2000]

Prints microseconds per estimate for a few layouts of Llama-2-70B on 1,024 H100s (128 nodes),
the best of 5 rounds. Goal (issue 3): well under 10 ms; the planner wants < 0.5 ms.
"""

from __future__ import annotations

import argparse
import time

from dstk.estimate import estimate
from dstk.hardware import Cluster, get_gpu, get_interconnect
from dstk.layout import Layout, Training
from dstk.models import get_model

LAYOUTS = {
    "dp=1024 ZeRO-3": Layout(dp=1024, zero_stage=3, micro_batch=1, grad_accum=1),
    "dp=128 tp=8 ZeRO-1": Layout(dp=128, tp=8, zero_stage=1, micro_batch=1, grad_accum=8),
    "dp=32 tp=8 pp=4 ZeRO-1": Layout(dp=32, tp=8, pp=4, zero_stage=1, micro_batch=1, grad_accum=32),
    "dp=8 tp=8 pp=16 v=2 full recompute": Layout(dp=8, tp=8, pp=16, micro_batch=1, grad_accum=128,
                                                 virtual_stages=2, recompute="full"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=2000)
    args = parser.parse_args()
    model = get_model("llama-2-70b")
    cluster = Cluster(num_nodes=128, gpus_per_node=8, gpu=get_gpu("h100-sxm"), interconnect=get_interconnect("ib-ndr"))
    training = Training(seq_len=4096, global_batch=1024)
    for name, layout in LAYOUTS.items():
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(args.repeat):
                estimate(model=model, layout=layout, training=training, cluster=cluster)
            best = min(best, (time.perf_counter() - start) / args.repeat)
        print(f"{name:<36} {best * 1e6:7.1f} us per estimate")


if __name__ == "__main__":
    main()
