"""How fast is `dstk validate` compared with DeepSpeed's own parse of the same file?

Prints two figures:
  1. cold start: wall time of a fresh `python -m dstk.cli validate FILE` process versus a fresh
     process that imports deepspeed and runs `DeepSpeedConfig(FILE)` (median of N runs each);
  2. in-process throughput of `dstk.validate.validate_config` in configs per second.

Usage: .venv/bin/python benchmarks/validate_speed.py [--runs 5] [--file PATH] [--baseline DIR]

``--baseline DIR`` also times another dstk (a directory holding a ``dstk`` package, put first on
PYTHONPATH; e.g. an older commit: ``git archive HEAD~1 toolkit | tar -x -C /tmp/old`` and a symlink
``/tmp/old-pkg/dstk -> /tmp/old/toolkit``). The runs of all commands are interleaved, so a busy machine
slows them alike and the ratios stay comparable.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CONFIG = {
    "train_batch_size": 64, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
    "bf16": {"enabled": True}, "gradient_clipping": 1.0, "steps_per_print": 100,
    "zero_optimization": {"stage": 3, "overlap_comm": True, "contiguous_gradients": True,
                          "offload_optimizer": {"device": "cpu", "pin_memory": True},
                          "stage3_prefetch_bucket_size": 5e7, "stage3_param_persistence_threshold": 1e5},
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 10000, "warmup_num_steps": 500}},
    "tensorboard": {"enabled": True, "output_path": "logs/", "job_name": "bench"},
}

DS_SCRIPT = ("import sys; from deepspeed.runtime.config import DeepSpeedConfig; DeepSpeedConfig(sys.argv[1])")


def _time(commands: dict[str, tuple[list[str], dict]], runs: int) -> dict[str, float]:
    """Median wall time of each command, the runs interleaved (a, b, c, a, b, c, ...)."""
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, (cmd, env) in commands.items():
            start = time.perf_counter()
            subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--file", help="config to time (default: a ZeRO-3 offload config written here)")
    parser.add_argument("--seconds", type=float, default=3.0, help="duration of the throughput loop")
    parser.add_argument("--baseline", metavar="DIR", help="also time the dstk package found in DIR")
    args = parser.parse_args()

    env = dict(os.environ, OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as tmp:
        path = args.file
        if path is None:
            path = os.path.join(tmp, "ds_config.json")
            with open(path, "w") as fh:
                json.dump(CONFIG, fh, indent=2)
        with open(path) as fh:
            config = json.load(fh)
        validate = [sys.executable, "-m", "dstk.cli", "validate", path, "--world-size", "8"]
        commands = {"dstk": (validate, env), "deepspeed": ([sys.executable, "-c", DS_SCRIPT, path], env)}
        if args.baseline:
            baseline_env = dict(env, PYTHONPATH=os.pathsep.join(filter(None, [args.baseline,
                                                                             env.get("PYTHONPATH")])))
            commands["baseline"] = (validate, baseline_env)
        medians = _time(commands, args.runs)
        dstk, ds = medians["dstk"], medians["deepspeed"]

    from dstk.validate import validate_config

    validate_config(config, world_size=8)  # warm the schema and validator caches
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        validate_config(config, world_size=8)
        count += 1
    per_second = count / (time.perf_counter() - start)

    print(f"cold start, median of {args.runs}: dstk validate {dstk:.2f} s, DeepSpeedConfig parse {ds:.2f} s "
          f"({ds / dstk:.1f}x)")
    if args.baseline:
        base = medians["baseline"]
        print(f"cold start, baseline {args.baseline}: dstk validate {base:.2f} s ({ds / base:.1f}x)")
    print(f"in-process: {per_second:.0f} configs/s ({1000 / per_second:.2f} ms per config)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
