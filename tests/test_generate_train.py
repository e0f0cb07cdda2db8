"""Generated DeepSpeed configs train a tiny Llama for two optimizer steps on 2 real CPU ranks (gloo):
DP, ZeRO-1/2/3, ZeRO-2 with CPU optimizer offload, PP=2 (issue 5's adapter) and AutoTP=2 (plus a third step, see STEPS), all
in one spawned run.

The configs come from ``dstk generate`` with the layout pinned (``--zero``, ``--tp``, ...), so the
whole path intent -> plan -> ds_config.json is exercised; the rank script is this file.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve()
EXAMPLE = HERE.parent.parent / "examples" / "intents" / "tiny-llama-cpu.yaml"
# DeepSpeed's warmup schedulers run optimizer step 1 at lr 0 (iteration -1) and step 2 at the warmup
# minimum (0 here), so two steps cannot move the weights; the third shows that training happens.
STEPS = 3
KINDS = {  # name -> pinned flags for `dstk generate`
    "dp": ["--zero", "0", "--dp", "2"],  # data parallel over the 2 ranks, whatever the planner's free pick
    "zero1": ["--zero", "1", "--dp", "2"],
    "zero2": ["--zero", "2", "--dp", "2"],
    "zero3": ["--zero", "3", "--dp", "2"],
    "zero2-offload": ["--zero", "2", "--offload-optimizer", "cpu", "--dp", "2"],
    "pp2": ["--pp", "2"],  # DeepSpeed's pipeline engine through dstk.models.to_pipeline (issue 5)
    "autotp2": ["--tp", "2", "--zero", "1"],  # AutoTP last: it sets up a TP mesh for the process
    "autotp2-zero3-offload": ["--tp", "2", "--zero", "3", "--offload-optimizer", "cpu", "--offload-params", "cpu"],
}


def _rank_main(run_dirs: list[str]) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    rank = int(os.environ["RANK"])
    for run_dir in run_dirs:
        config = json.loads((Path(run_dir) / "ds_config.json").read_text())
        plan = json.loads((Path(run_dir) / "plan.json").read_text())
        m = plan["model"]
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(
            hidden_size=m["hidden_size"], intermediate_size=m["ffn_hidden_size"], num_hidden_layers=m["num_layers"],
            num_attention_heads=m["num_heads"], num_key_value_heads=m["num_kv_heads"], vocab_size=m["vocab_size"],
            max_position_embeddings=plan["training"]["seq_len"],
        ))
        gen = torch.Generator().manual_seed(1)  # the same batch on every rank: AutoTP ranks must agree
        batch = torch.randint(0, m["vocab_size"], (config["train_micro_batch_size_per_gpu"],
                                                   plan["training"]["seq_len"]), generator=gen)
        losses = []
        if plan["layout"]["pp"] > 1:
            from dstk.models import to_pipeline

            pipe = to_pipeline(model, num_stages=plan["layout"]["pp"], seq_len=plan["training"]["seq_len"])
            engine, _, _, _ = deepspeed.initialize(model=pipe, model_parameters=pipe.parameters(), config=config)

            def batches():
                while True:
                    yield batch, batch

            data = batches()
            for _step in range(STEPS):
                losses.append(float(engine.train_batch(data_iter=data)))
            losses.append(float(engine.eval_batch(data_iter=data)))
        else:
            engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
            for _step in range(STEPS):
                for _micro in range(config["gradient_accumulation_steps"]):
                    loss = engine(input_ids=batch, labels=batch).loss
                    engine.backward(loss)
                    engine.step()
                losses.append(float(loss))
            with torch.no_grad():
                losses.append(float(engine(input_ids=batch, labels=batch).loss))
        assert engine.global_steps == STEPS, engine.global_steps
        assert all(x == x and x < 100 for x in losses), losses
        if rank == 0:
            print(f"RESULT {Path(run_dir).name} {json.dumps({'losses': losses, 'steps': engine.global_steps})}",
                  flush=True)
        engine.destroy()
        del engine, model
    from dstk.launch.rank import exit_rank

    exit_rank()


@pytest.mark.distributed
@pytest.mark.timeout(420)
def test_generated_configs_train_two_steps_on_two_cpu_ranks(tmp_path):
    from dist import run_ranks

    from dstk.cli import main

    dirs = []
    for name, flags in KINDS.items():
        out = tmp_path / name
        assert main(["generate", str(EXAMPLE), *flags, "--output", str(out)]) == 0, name
        dirs.append(str(out))
        layout = json.loads((out / "plan.json").read_text())["layout"]
        assert layout["dp"] * layout["tp"] * layout["pp"] == 2
    results = run_ranks(HERE, *dirs, world_size=2, timeout=400,
                        env={"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"})
    lines = [l for l in results[0].output.splitlines() if l.startswith("RESULT ")]
    found = {l.split()[1]: json.loads(l.split(" ", 2)[2]) for l in lines}
    assert sorted(found) == sorted(KINDS), results[0].output[-3000:]
    for name, res in found.items():
        assert res["steps"] == STEPS
        assert res["losses"][-1] < res["losses"][0], (name, res)  # the same batch: the steps helped


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_a_generated_run_dir_launches_with_dstk_launch(tmp_path):
    """The run directory as `dstk launch` reads it: the real deepspeed runner starts 2 ranks of
    this file with --deepspeed_config RUN_DIR/ds_config.json."""
    import subprocess

    from dstk.cli import main

    out = tmp_path / "run"
    assert main(["generate", str(EXAMPLE), "--zero", "2", "--output", str(out)]) == 0
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "dstk", "launch", str(out), "--", str(HERE)],
                          capture_output=True, text=True, timeout=280, env=env, cwd=tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "RESULT run " in proc.stdout, proc.stdout[-3000:]


if __name__ == "__main__":
    argv = sys.argv[1:]
    if "--deepspeed_config" in argv:  # started by `dstk launch`: the run directory holds the config
        argv = [str(Path(argv[argv.index("--deepspeed_config") + 1]).parent)]
    _rank_main(argv)
