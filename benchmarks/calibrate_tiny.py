"""``dstk doctor --calibrate`` on this machine, then the tiny Llama planned with the profile and run
on the same 2 CPU ranks: the predicted step (built-in catalog and calibrated) next to the measured.

    .venv/bin/python benchmarks/calibrate_tiny.py [--quick] [--steps 30] [--keep DIR]

Runs the commands a user types (``python -m dstk ...``) in a temporary directory: the
calibration (its wall time and report), ``plan`` with and without ``--hardware``, ``generate``
with it, ``finetune`` of that plan. Two measurements of the same plan on the same 2 ranks:

- **the engine's step** (what the plan's ``step_seconds`` prices): this script started once per
  rank (``--rank-step RUN_DIR FT_DIR``) builds the fine-tune's model from its prepared config and
  ``deepspeed.initialize``-s it with the fine-tune's DeepSpeed config, then times forward +
  backward + ``step()`` of ``--bare-steps`` steps after 3 warm-up ones: the median and the
  fastest step;
- **the fine-tune** (what a user sees): tokens over seconds of ``dstk finetune``'s summary, which
  also holds the first steps' warm-up and the fine-tune's own per-step work (the loss all-reduce,
  the progress record, the monitor's CSV).

Goal (issue 11): the calibrated prediction within ~30% of the engine's step;
``tests/test_doctor_calibrate.py`` checks a factor of 2 under the suite's load.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "examples" / "intents" / "tiny-llama-cpu.yaml"
CORPUS = ROOT / "templates" / "corpus" / "harbour-notes.txt"
STEP_TAG = "DSTK_BARE_STEP "
WARMUP_STEPS = 3


def dstk(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "dstk", *args], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"dstk {' '.join(args)} failed ({proc.returncode}):\n"
                         f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return proc, time.perf_counter() - t0


def rank_step(*, ft_dir: Path, steps: int) -> None:
    """One rank of the engine-step measurement (module docstring); rank 0 prints ``STEP_TAG {json}``."""
    import torch
    import torch.distributed as dist

    import deepspeed
    from transformers import AutoConfig, AutoModelForCausalLM

    deepspeed.init_distributed(dist_backend="gloo")
    config = AutoConfig.from_pretrained(ft_dir / "prepared" / "model_config")
    ds_config = json.loads((ft_dir / "ds_config.json").read_text())
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()), config=ds_config)
    micro, accum = ds_config["train_micro_batch_size_per_gpu"], ds_config.get("gradient_accumulation_steps", 1)
    ids = torch.randint(0, config.vocab_size, (micro, config.max_position_embeddings))
    seconds = []
    for i in range(WARMUP_STEPS + steps):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(accum):
            engine.backward(engine(input_ids=ids, labels=ids).loss)
            engine.step()
        if i >= WARMUP_STEPS:
            seconds.append(time.perf_counter() - t0)
    if dist.get_rank() == 0:
        print(STEP_TAG + json.dumps({"median_seconds": statistics.median(seconds), "best_seconds": min(seconds),
                                     "steps": steps, "tokens_per_step": micro * accum * dist.get_world_size()
                                     * config.max_position_embeddings}), flush=True)


def measure_step(*, ft_dir: Path, steps: int, ranks: int = 2, timeout: float = 600) -> dict:
    """Start ``ranks`` CPU ranks of this script in ``--rank-step`` mode; rank 0's figures."""
    from dstk.launch.rundir import free_port

    port, procs = free_port(), []
    threads = str(max(1, (os.cpu_count() or 1) // ranks))
    for rank in range(ranks):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(ranks),
               "LOCAL_WORLD_SIZE": str(ranks), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", threads), "PYTHONUNBUFFERED": "1"}
        procs.append(subprocess.Popen([sys.executable, __file__, "--rank-step", str(ft_dir), "--bare-steps",
                                       str(steps)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, start_new_session=True))
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
    for line in outputs[0].splitlines():
        if line.startswith(STEP_TAG):
            return json.loads(line[len(STEP_TAG):])
    raise SystemExit("the step measurement printed no result:\n" + "\n".join(o[-2000:] for o in outputs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="doctor --calibrate --quick")
    parser.add_argument("--steps", type=int, default=30, help="fine-tune steps")
    parser.add_argument("--bare-steps", type=int, default=20, help="timed engine steps")
    parser.add_argument("--keep", metavar="DIR", help="work in DIR (new) and keep it")
    parser.add_argument("--rank-step", metavar="FT_DIR", help=argparse.SUPPRESS)  # one rank of measure_step
    args = parser.parse_args()
    if args.rank_step:
        rank_step(ft_dir=Path(args.rank_step), steps=args.bare_steps)
        from dstk.launch.rank import exit_rank

        exit_rank()
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="dstk-calibrate-"))
    work.mkdir(parents=True, exist_ok=True)
    hw = work / "hardware.yaml"
    load = os.getloadavg()[0]
    proc, seconds = dstk("doctor", "--calibrate", "--output", str(hw), *(["--quick"] if args.quick else []))
    print(f"$ dstk doctor --calibrate{' --quick' if args.quick else ''}   ({seconds:.1f} s wall, load average "
          f"{load:.1f} before)")
    print(proc.stdout.rstrip())
    plans = {}
    for label, extra in (("built-in catalog", ()), ("calibrated", ("--hardware", str(hw)))):
        out, _ = dstk("plan", str(TINY), *extra, "--format", "json")
        plans[label] = json.loads(out.stdout)["plans"][0]
    run_dir, ft = work / "run", work / "ft"
    dstk("generate", str(TINY), "--hardware", str(hw), "--output", str(run_dir))
    predicted = json.loads((run_dir / "plan.json").read_text())["time"]
    dstk("finetune", "--plan", str(run_dir), "--data", str(CORPUS), "--output", str(ft), "--steps", str(args.steps))
    summary = json.loads((ft / "summary.json").read_text())
    bare = measure_step(ft_dir=ft, steps=args.bare_steps)
    tokens = bare["tokens_per_step"]
    print(f"\ntiny Llama, 2 CPU ranks ({TINY.relative_to(ROOT)}), {tokens} tokens a step, load average "
          f"{os.getloadavg()[0]:.1f} after:")
    for label, plan in plans.items():
        lay, t = plan["layout"], plan["time"]
        what = (f"dp={lay['dp']} tp={lay['tp']} pp={lay['pp']} ZeRO-{lay['zero_stage']} micro "
                f"{lay['micro_batch']} x {lay['grad_accum']}")
        print(f"  predicted, {label + ':':<18} {t['step_seconds'] * 1e3:8.1f} ms a step "
              f"{t['tokens_per_second']:>9,.0f} tokens/s  ({what})")
    step = predicted["step_seconds"]
    for label, s in (("engine step, median", bare["median_seconds"]), ("engine step, fastest", bare["best_seconds"]),
                     (f"fine-tune, {args.steps} steps", summary["seconds"] / summary["steps"])):
        print(f"  measured, {label + ':':<22} {s * 1e3:8.1f} ms a step {tokens / s:>9,.0f} tokens/s  "
              f"(calibrated prediction {step / s:.2f}x)")
    if not args.keep:
        print(f"(work directory {work})")


if __name__ == "__main__":
    main()
