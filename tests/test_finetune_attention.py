"""dstk finetune trains with the attention kernel the plan priced (``training.attention``): the spec
prepare.py writes carries transformers' ``attn_implementation``, the worker's ``build_model`` (the
native loop, the pipeline through ``to_pipeline``, the HF Trainer) builds the real transformers model
with it; a kernel that cannot load is refused in the parent, before any rank starts.

In-process: ``prepare`` then ``build_model`` on a tiny Llama (random init from the plan, and a
``save_pretrained`` directory with weights). One real 2-rank ``dstk finetune`` (eager) end to end.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dstk.cli import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "intents" / "tiny-llama-cpu.yaml"
CORPUS = ROOT / "templates" / "corpus" / "harbour-notes.txt"


@pytest.fixture(scope="module")
def run_dirs(tmp_path_factory):
    """Run directories from `dstk generate` with each CPU kernel, and one whose plan.json predates
    ``training.attention`` (the key removed)."""
    root = tmp_path_factory.mktemp("plans")
    dirs = {}
    for kernel in ("eager", "sdpa"):
        dirs[kernel] = root / kernel
        assert main(["generate", str(EXAMPLE), "--attention", kernel, "--output", str(dirs[kernel])]) == 0
    dirs["old"] = root / "old"
    assert main(["generate", str(EXAMPLE), "--output", str(dirs["old"])]) == 0
    plan_path = dirs["old"] / "plan.json"
    plan = json.loads(plan_path.read_text())
    del plan["training"]["attention"]
    plan_path.write_text(json.dumps(plan, indent=2) + "\n")
    return dirs


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A tiny Llama with weights, as `save_pretrained` writes it (the plan's dimensions)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    out = tmp_path_factory.mktemp("hf") / "tiny-llama"
    config = LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=128, vocab_size=512, max_position_embeddings=64)
    LlamaForCausalLM(config).save_pretrained(out)
    return out


def _prepare(run_dir: Path, out: Path, *extra: str) -> int:
    return main(["finetune", "--plan", str(run_dir), "--data", str(CORPUS), "--output", str(out), "--steps", "2",
                 "--prepare-only", *extra])


@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
@pytest.mark.parametrize("source", ["plan-config", "hf-dir"])
def test_the_model_is_built_with_the_plans_kernel(kernel, source, run_dirs, hf_dir, tmp_path):
    from dstk.train.spec import TrainSpec
    from dstk.train.worker import build_model

    out = tmp_path / "out"
    assert _prepare(run_dirs[kernel], out, *(["--model", str(hf_dir)] if source == "hf-dir" else [])) == 0
    spec = TrainSpec.load(out / "finetune.json")
    assert spec.attn_implementation == kernel and spec.pretrained == (source == "hf-dir")
    model = build_model(spec)
    assert model.config._attn_implementation == kernel
    # each decoder layer's attention reads the same config at its forward (the pipeline's stages too)
    assert model.model.layers[0].self_attn.config._attn_implementation == kernel


def test_lora_adapters_go_on_a_base_built_with_the_plans_kernel(run_dirs, tmp_path):
    from dstk.train.spec import TrainSpec
    from dstk.train.worker import build_model

    out = tmp_path / "out"
    assert _prepare(run_dirs["eager"], out, "--lora-rank", "4") == 0
    model = build_model(TrainSpec.load(out / "finetune.json"))
    assert type(model).__name__.startswith("Peft") and model.config._attn_implementation == "eager"


def test_a_plan_without_a_kernel_keeps_transformers_default(run_dirs, tmp_path):
    from dstk.train.spec import TrainSpec
    from dstk.train.worker import build_model

    out = tmp_path / "out"
    assert _prepare(run_dirs["old"], out) == 0
    spec = TrainSpec.load(out / "finetune.json")
    assert spec.attn_implementation is None
    assert build_model(spec).config._attn_implementation == "sdpa"  # transformers' default for Llama
    # a finetune.json written before the field existed still loads (a resumed old run)
    data = json.loads((out / "finetune.json").read_text())
    del data["attn_implementation"]
    (out / "finetune.json").write_text(json.dumps(data))
    assert TrainSpec.load(out / "finetune.json").attn_implementation is None


@pytest.mark.skipif(importlib.util.find_spec("flash_attn") is not None, reason="flash_attn is installed here")
def test_flash_without_flash_attn_is_refused_before_any_rank(tmp_path, capsys):
    """A plan priced with FlashAttention-2 (an A100 plan) on a machine without flash_attn: one
    refusal with the fix, not a traceback from every rank."""
    run = tmp_path / "flash"
    assert main(["generate", str(EXAMPLE), "--gpu", "a100-80gb", "--attention", "flash", "--output", str(run)]) == 0
    assert json.loads((run / "plan.json").read_text())["training"]["attention"] == "flash"
    out = tmp_path / "out"
    assert _prepare(run, out) == 1
    err = capsys.readouterr().err
    assert "flash_attn" in err and "--attention sdpa" in err and "fix:" in err and "Traceback" not in err
    assert not out.exists()


def test_a_kernel_the_model_class_lacks_is_refused(run_dirs, tmp_path, capsys):
    """--model BLOOM (no SDPA in transformers' BloomForCausalLM) with a plan priced sdpa:
    from_pretrained(attn_implementation="sdpa") would raise on every rank."""
    from transformers import BloomConfig, BloomForCausalLM

    bloom = tmp_path / "bloom"
    BloomForCausalLM(BloomConfig(n_layer=2, hidden_size=64, n_head=4, vocab_size=512)).save_pretrained(bloom)
    out = tmp_path / "out"
    assert _prepare(run_dirs["sdpa"], out, "--model", str(bloom)) == 1
    err = capsys.readouterr().err
    assert "BloomForCausalLM" in err and "--attention eager" in err and "Traceback" not in err
    assert not out.exists()
    assert _prepare(run_dirs["eager"], out, "--model", str(bloom)) == 0  # what transformers runs for it


@pytest.mark.distributed
def test_a_real_finetune_trains_with_eager(run_dirs, tmp_path):
    """2 real CPU ranks through the deepspeed runner: the ranks built the model with eager attention."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "dstk.cli", "finetune", "--plan", str(run_dirs["eager"]), "--data", str(CORPUS),
           "--output", str(out), "--steps", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["attn_implementation"] == "eager"
    assert "attention: eager (the plan's training.attention)" in proc.stdout + proc.stderr
