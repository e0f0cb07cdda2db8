"""`dstk generate`: the run directory, atomic and refusing to overwrite; every generated config
accepted by DeepSpeed's parser at the plan's dp and by megatron-core."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_generate_oracles import ds_parse, megatron_config  # noqa: F401  (ds_parse is a fixture)

from dstk import plan as planner
from dstk.cli import main
from dstk.intent import intent_from_dict, load_intent
from dstk.render import read_megatron_args

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "examples" / "intents" / "tiny-llama-cpu.yaml")
FILES = ["README.md", "accelerate_config.yaml", "ds_config.hf.json", "ds_config.json", "megatron.args", "plan.json",
         "training_args.json"]
INTENTS = sorted((ROOT / "examples" / "intents").glob("*.yaml")) + sorted((ROOT / "tests" / "data" / "plan").glob("*.yaml"))


def test_generate_writes_the_run_directory(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["generate", TINY, "--output", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == FILES
    plan = json.loads((out / "plan.json").read_text())
    for key in ("dstk_version", "model", "cluster", "training", "layout", "memory", "time", "why", "alternatives"):
        assert key in plan, key
    assert plan["cluster"]["gpu"] == "cpu" and plan["model"]["num_layers"] == 2
    ds = json.loads((out / "ds_config.json").read_text())
    assert ds["train_batch_size"] == plan["training"]["global_batch"] == 8
    assert ds["train_micro_batch_size_per_gpu"] == plan["layout"]["micro_batch"]
    assert "dstk launch" in (out / "README.md").read_text()
    assert "wrote" in capsys.readouterr().out


def test_existing_directory_is_not_overwritten_without_force(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["generate", TINY, "--output", str(out)]) == 0
    before = {p.name: p.read_text() for p in out.iterdir()}
    assert main(["generate", TINY, "--output", str(out), "--global-batch", "16"]) == 2
    assert "--force" in capsys.readouterr().err
    assert {p.name: p.read_text() for p in out.iterdir()} == before
    assert main(["generate", TINY, "--output", str(out), "--global-batch", "16", "--force"]) == 0
    assert json.loads((out / "ds_config.json").read_text())["train_batch_size"] == 16


def test_pick_chooses_another_plan_and_out_of_range_writes_nothing(tmp_path, capsys):
    assert main(["generate", TINY, "--output", str(tmp_path / "a"), "--pick", "2", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert "picked by hand (--pick 2)" in data["plan"]["why"][0]
    assert main(["generate", TINY, "--output", str(tmp_path / "b"), "--pick", "9999"]) == 2
    assert not (tmp_path / "b").exists()


def test_nothing_fits_writes_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["generate", "--model", "llama-2-70b", "--gpus", "8", "--gpu", "a10", "--no-offload",
                 "--seq-len", "4096", "--global-batch", "64", "--output", str(out)]) == 1
    assert not out.exists()


def _intent(path: Path):
    data = yaml.safe_load(path.read_text())
    return intent_from_dict(data["intent"]) if "expect" in data else load_intent(path)


@pytest.mark.parametrize("path", INTENTS, ids=lambda p: p.stem)
def test_generated_configs_pass_deepspeed_and_megatron_core(path, ds_parse):
    intent = _intent(path)
    ctx = planner.resolve(intent)
    result = planner.plan_intent(ctx, top=3)
    if not result.plans:  # only the golden case that says so
        assert yaml.safe_load(path.read_text()).get("expect", {}).get("fits") is False
        return
    for index in range(min(3, len(result.plans))):
        files = planner.run_dir_files(ctx, result, index=index)
        layout = result.plans[index].layout
        parsed = ds_parse(json.loads(files["ds_config.json"]), dp=layout.dp)
        assert parsed.train_batch_size == layout.global_batch
        assert parsed.zero_optimization_stage == layout.zero_stage
        config, _ = megatron_config(read_megatron_args_lines(files["megatron.args"]))
        assert config.tensor_model_parallel_size == layout.tp
        assert config.pipeline_model_parallel_size == layout.pp
        assert read_megatron_args(files["megatron.args"])


def read_megatron_args_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize("attention, backend", [("eager", "unfused"), ("flash", "flash"), ("sdpa", None)])
def test_megatron_args_name_the_attention_kernel_the_plan_priced(attention, backend):
    """`--attention eager` is priced as materialised scores: megatron.args asks TransformerEngine for
    its unfused attention (left to "auto" it would run flash or fused, not the plan); flash asks for
    flash; sdpa leaves Megatron's auto. megatron-core's TransformerConfig takes the value."""
    from megatron.core.transformer.enums import AttnBackend

    raw = yaml.safe_load((ROOT / "examples" / "intents" / "megatron-gpt-dims.yaml").read_text())
    raw["training"]["attention"] = attention
    ctx = planner.resolve(intent_from_dict(raw))
    files = planner.run_dir_files(ctx, planner.plan_intent(ctx, top=None), index=0)
    config, opts = megatron_config(read_megatron_args_lines(files["megatron.args"]))
    assert opts.get("--attention-backend") == backend
    assert config.attention_backend == (AttnBackend[backend] if backend else AttnBackend.auto)
