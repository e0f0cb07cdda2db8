"""How long the planner's full search takes: Llama-2-70B on 1,024 GPUs (128 nodes x 8 H100).

    .venv/bin/python benchmarks/plan_speed.py [--repeat 5]

Prints the layouts considered, how many fit, and the wall time of resolve + search + ranking +
why lines (best and median of the repeats). Goal (issue 4): at most 1 s on the 2-core machine.
"""

from __future__ import annotations

import argparse
import statistics
import time

from dstk import plan as planner
from dstk.intent import intent_from_dict

INTENT = {
    "model": {"name": "llama-2-70b"},
    "cluster": {"num_nodes": 128, "gpus_per_node": 8, "gpu": "h100-sxm"},
    "training": {"seq_len": 4096, "global_batch": 1024},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    intent = intent_from_dict(INTENT)
    times = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        ctx = planner.resolve(intent)
        result = planner.plan_intent(ctx)
        times.append(time.perf_counter() - start)
    best = result.plans[0]
    print(f"model llama-2-70b, 1024 GPUs: {result.num_considered} layouts estimated, {result.num_fitting} fit")
    print(f"winner: {planner.describe(best.layout)} ({best.estimate.time.step_seconds:.3g} s/step)")
    print(f"plan_speed: first {times[0]:.3f} s, best {min(times):.3f} s, median {statistics.median(times):.3f} s over {args.repeat} runs "
          f"(goal <= 1 s)")


if __name__ == "__main__":
    main()
