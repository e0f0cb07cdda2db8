"""dstk finetune --lora-rank: adapters through peft on a frozen base.

Unit tier: the adapter parameter count (``dstk.train.lora_size``, no torch) against peft's real
count on the transformers models of every family; the flag checks, refused before any rank starts.
Distributed tier (2 real gloo ranks through the deepspeed runner, one launch per case): LoRA on
ZeRO-2 and ZeRO-3 -- the loss falls, the base weights after training are bit-identical to the
seeded init while every adapter matrix moved, the merged export and the adapter (peft's
``AutoPeftModelForCausalLM``) give the trained engine's logits, and ``--resume`` from a
checkpoint repeats the lost steps exactly.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dstk.cli import main
from dstk.errors import UsageError
from dstk.models import FAMILIES, family_module
from dstk.train.lora import LoraSettings, resolve_targets, settings_from_flags, target_names
from dstk.train.lora_size import num_lora_params
from tests.procs import loss_segments

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "intents" / "tiny-llama-cpu.yaml"
CORPUS = ROOT / "templates" / "corpus" / "harbour-notes.txt"


# --- the adapter's size ----------------------------------------------------------------------------

def _peft_trainable(cfg: dict, targets: str, *, rank: int) -> int:
    """Trainable parameters of the real transformers model wrapped by peft (on the meta device)."""
    import torch
    import transformers

    from dstk.train import lora

    keys = dict(cfg)
    config = transformers.AutoConfig.for_model(keys.pop("model_type"), **keys)
    settings = LoraSettings(rank=rank, alpha=2.0 * rank, targets=resolve_targets(family=cfg["model_type"], targets=targets),
                            fan_in_fan_out=cfg["model_type"] == "gpt2")
    with torch.device("meta"):
        model = lora.apply(transformers.AutoModelForCausalLM.from_config(config), settings)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("family", FAMILIES)
def test_adapter_size_equals_peft_on_every_family(family):
    module = family_module(family)
    slug, cfg = next(iter(module.PRESETS.items()))
    key = next(k for k in ("num_hidden_layers", "n_layer") if k in cfg)
    cfg = {**cfg, key: 2}  # full width, 2 layers: every module shape, fast
    spec = module.read(cfg, name=slug)
    for targets in ("all-linear", "attention", "o", "down" if family != "mixtral" else "q,v"):
        assert num_lora_params(model=spec, rank=4, targets=targets) == _peft_trainable(cfg, targets, rank=4), targets


def test_adapter_size_of_llama_2_7b_matches_the_published_count():
    """Hu et al. (2021) and peft's docs: r=8 on q,v of Llama-2-7B trains 4,194,304 parameters
    (32 layers x 8 x (4096 + 4096) x 2)."""
    from dstk.models import get_model

    assert num_lora_params(model=get_model("llama-2-7b"), rank=8, targets="q,v") == 4_194_304
    with pytest.raises(ValueError, match="rank"):
        num_lora_params(model=get_model("llama-2-7b"), rank=0)


# --- the flags -------------------------------------------------------------------------------------

def _flags(family="llama", **kw):
    args = dict(rank=8, alpha=None, dropout=None, targets=None, bits=None)
    args.update(kw)
    return settings_from_flags(family=family, **args)


def test_flag_defaults_and_short_names():
    s = _flags()
    assert s.rank == 8 and s.alpha == 16 and s.dropout == 0 and len(s.targets) == 7
    assert _flags(targets="q,v").targets == ("self_attn.q_proj", "self_attn.v_proj")
    assert _flags(targets="q_proj,self_attn.v_proj,q").targets == ("self_attn.q_proj", "self_attn.v_proj")
    assert _flags(family="gpt2", targets="o,down").targets == ("attn.c_proj", "mlp.c_proj")
    assert _flags(family="gpt2").fan_in_fan_out
    assert _flags(family="phi3", targets="qkv,gate_up").targets == ("self_attn.qkv_proj", "mlp.gate_up_proj")
    assert _flags(family="opt", targets="o,up").targets == ("self_attn.out_proj", "fc1")
    assert "self_attn.q_norm" not in target_names("qwen3")["all-linear"]  # a norm, not a linear
    assert _flags(rank=None) is None


@pytest.mark.parametrize("kw,words", [
    (dict(rank=0), "--lora-rank 0: expected an integer >= 1"),
    (dict(dropout=1.0), "--lora-dropout 1.0: expected a value in [0, 1)"),
    (dict(dropout=-0.1), "in [0, 1)"),
    (dict(alpha=0.0), "--lora-alpha 0.0: expected > 0"),
    (dict(bits=8), "only 4"),
    (dict(rank=None, alpha=16.0), "--lora-alpha without --lora-rank"),
    (dict(targets="q,wq"), "--lora-targets wq: not a module of a llama layer"),
    (dict(family="gpt2", targets="q"), "not a module of a gpt2 layer"),
    (dict(family="mixtral", targets="gate"), "MoE experts are not linear modules"),
    (dict(targets=","), "empty"),
])
def test_bad_flags_are_refused_with_a_fix(kw, words):
    with pytest.raises(UsageError) as exc:
        _flags(**kw)
    assert words in exc.value.message and exc.value.hint


def test_unknown_target_lists_the_family_names():
    with pytest.raises(UsageError) as exc:
        _flags(targets="wq")
    for name in ("q", "k", "v", "o", "gate", "up", "down", "q_proj", "all-linear"):
        assert name in exc.value.hint.split("choose from ")[1].split(", or")[0].split(", ")
    with pytest.raises(UsageError) as exc:
        _flags(family="gpt2", targets="q")
    assert "qkv" in exc.value.hint and "c_attn" in exc.value.hint


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("plan") / "run"
    assert main(["generate", str(EXAMPLE), "--precision", "fp32", "--output", str(out)]) == 0
    return out


def _finetune_cli(run_dir, out, *extra):
    return main(["finetune", "--plan", str(run_dir), "--data", str(CORPUS), "--output", str(out), *extra])


@pytest.mark.parametrize("extra,code,words", [
    (["--lora-rank", "0"], 2, "expected an integer >= 1"),
    (["--lora-rank", "4", "--lora-targets", "q,wq"], 2, "choose from q, k, v, o"),
    (["--merge"], 2, "--merge without --lora-rank"),
    (["--lora-rank", "4", "--trainer", "hf"], 1, "native trainer only"),
    (["--lora-rank", "4", "--lora-bits", "4"], 1, "pip install bitsandbytes"),
])
def test_cli_refuses_before_any_rank_starts(extra, code, words, run_dir, tmp_path, capsys):
    if "--lora-bits" in extra:
        import torch

        if torch.cuda.is_available():
            pytest.skip("the CPU refusal of QLoRA; this machine has CUDA")
    out = tmp_path / "out"
    assert _finetune_cli(run_dir, out, *extra, "--prepare-only") == code
    err = capsys.readouterr().err
    assert words in err and "fix:" in err and "Traceback" not in err, err
    assert not out.exists()
    if "--lora-bits" in extra:
        assert "CUDA" in err


def test_lora_with_a_pipeline_plan_is_refused(tmp_path, capsys):
    run = tmp_path / "pp"
    assert main(["generate", str(EXAMPLE), "--pp", "2", "--precision", "fp32", "--output", str(run)]) == 0
    assert _finetune_cli(run, tmp_path / "o", "--lora-rank", "4", "--prepare-only") == 1
    assert "pipeline" in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_prepare_only_writes_the_lora_settings_and_resume_keeps_them(run_dir, tmp_path, capsys):
    from dstk.train.spec import TrainSpec

    out = tmp_path / "out"
    assert _finetune_cli(run_dir, out, "--lora-rank", "4", "--lora-targets", "q,v", "--lora-dropout", "0.1",
                         "--merge", "--steps", "5", "--prepare-only") == 0
    assert "LoRA: rank 4, alpha 8" in capsys.readouterr().err
    spec = TrainSpec.load(out / "finetune.json")
    assert spec.lora == LoraSettings(rank=4, alpha=8.0, dropout=0.1, targets=("self_attn.q_proj", "self_attn.v_proj"))
    assert spec.merge
    assert main(["finetune", "--output", str(out), "--resume", "--prepare-only"]) == 0
    assert TrainSpec.load(out / "finetune.json").lora == spec.lora
    assert main(["finetune", "--output", str(out), "--resume", "--lora-rank", "8", "--prepare-only"]) == 1
    assert "LoRA flags differ" in capsys.readouterr().err


# --- 2 real ranks ----------------------------------------------------------------------------------

STEPS, SAVE_EVERY, SEED = 30, 10, 1


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _run(args: list[str], *, timeout: float = 240) -> str:
    proc = subprocess.run([sys.executable, "-m", "dstk.cli", "finetune", *args], env=_env(), capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc.stdout + proc.stderr


def _lora_finetune(out: Path, *, zero: int) -> str:
    """As a user types it: plan flags, no run directory; fp32 so that "bit-identical" is exact."""
    return _run(["--model", "tiny-llama", "--data", str(CORPUS), "--gpus", "2", "--zero", str(zero),
                 "--precision", "fp32", "--lr", "1e-2", "--seq-len", "64", "--steps", str(STEPS), "--seed", str(SEED),
                 "--save-every", str(SAVE_EVERY), "--log-every", "10", "--output", str(out),
                 "--lora-rank", "8", "--merge"])


def _segments(out: Path) -> list[list[tuple[int, float]]]:
    return loss_segments(out / "logs" / "csv" / "Train_loss.csv")


def _initial_model(out: Path):
    """The base and adapters exactly as the ranks built them: seeded init, then peft's wrap."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from dstk.train import lora
    from dstk.train.spec import TrainSpec

    spec = TrainSpec.load(out / "finetune.json")
    torch.manual_seed(spec.seed)
    base = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(spec.model_source), dtype=torch.float32)
    init_base = {k: v.clone() for k, v in base.state_dict().items()}
    return init_base, lora.apply(base, spec.lora)


def _check_lora_run(out: Path) -> None:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    summary = json.loads((out / "summary.json").read_text())
    assert summary["adapter_dir"] == str(out.resolve() / "adapter") and summary["export_dir"] == summary["model_dir"]
    assert summary["base_model"] == summary["base_dir"] == str(out.resolve() / "base")  # random init: written
    # The loss falls. A frozen *random* base (embeddings and lm_head included) leaves the adapters
    # little to learn: the train loss goes from ~6.25 (ln 512) to a ~6.1 plateau, so the bar is
    # 0.05 (steps fluctuate by ~0.02), and the held-out loss must beat the untrained model's.
    losses = [l for _, l in _segments(out)[0]]
    k = len(losses) // 5
    assert sum(losses[-k:]) / k < sum(losses[:k]) / k - 0.05, losses

    # Only the adapters changed: the base the ranks hold at the end (gathered from every ZeRO
    # partition into OUTPUT/base) is the seeded init bit for bit; every adapter matrix moved.
    init_base, init_peft = _initial_model(out)
    evals = torch.load(out / "prepared" / "eval.pt")
    with torch.no_grad():
        untrained = float(init_peft(input_ids=evals, labels=evals).loss)  # B = 0: the base itself
    assert summary["eval_loss"] < untrained - 0.05, (summary["eval_loss"], untrained)
    trained_base = AutoModelForCausalLM.from_pretrained(out / "base").state_dict()
    assert trained_base.keys() == init_base.keys() and len(init_base) > 10
    changed = [k for k in init_base if not torch.equal(init_base[k], trained_base[k])]
    assert not changed, f"frozen base weights changed: {changed}"
    adapter = load_file(out / "adapter" / "adapter_model.safetensors")
    init_adapter = {k.replace(".default", ""): v for k, v in init_peft.state_dict().items() if ".lora_" in k}
    assert adapter.keys() == init_adapter.keys() and len(adapter) == 2 * 7 * 2  # A, B x 7 modules x 2 layers
    still = [k for k in adapter if torch.equal(adapter[k], init_adapter[k])]
    assert not still, f"adapter weights that did not train: {still}"

    _check_exports(out)


def _check_exports(out: Path) -> None:
    """The adapter (through peft) and the merged model give the trained engine's logits."""
    import torch
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoModelForCausalLM

    probe = torch.load(out / "probe_logits.pt")
    with torch.no_grad():
        merged = AutoModelForCausalLM.from_pretrained(out / "model")(input_ids=probe["logits_input_ids"]).logits
        peft_model = AutoPeftModelForCausalLM.from_pretrained(out / "adapter")  # finds its base itself
        unmerged = peft_model(input_ids=probe["logits_input_ids"]).logits
    # Merging folds (alpha/r) B A into W in fp32: the same sums in another order.
    assert torch.allclose(merged, probe["logits"], rtol=0, atol=1e-5), (merged - probe["logits"]).abs().max()
    assert torch.equal(unmerged, probe["logits"]), (unmerged - probe["logits"]).abs().max()


@pytest.mark.distributed
@pytest.mark.timeout(480)
def test_lora_zero2_trains_only_the_adapters_exports_and_resumes_exactly(tmp_path):
    out = tmp_path / "zero2"
    log = _lora_finetune(out, zero=2)
    assert "LoRA: 16,384 trainable parameters of 155,968" in log
    _check_lora_run(out)
    [first] = _segments(out)
    assert [s for s, _ in first] == list(range(1, STEPS + 1))

    # Lose the last checkpoint, resume from step 20: steps 21..30 repeat exactly, and the
    # export is the same model.
    import torch

    probe = torch.load(out / "probe_logits.pt")
    shutil.rmtree(out / "checkpoints" / f"step-{STEPS:06d}")
    log = _run(["--output", str(out), "--resume"])
    assert f"continuing at step {STEPS - SAVE_EVERY + 1}" in log
    # The resume drops the rows past its checkpoint and writes them again, under the same header
    # (dstk.train.logs.trim_csv_metrics): the same file, each step once, the same losses.
    [again] = _segments(out)
    assert again == first, (again, first)
    assert torch.equal(torch.load(out / "probe_logits.pt")["logits"], probe["logits"])
    _check_lora_run(out)


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_lora_zero3_partitions_the_frozen_base_and_trains_only_the_adapters(tmp_path):
    out = tmp_path / "zero3"
    _lora_finetune(out, zero=3)
    assert json.loads((out / "ds_config.json").read_text())["zero_optimization"]["stage"] == 3
    _check_lora_run(out)

    # A base with weights (--model HF_DIR: here the merged model just written) is not copied: the
    # adapter points at it, and peft loads the two into the trained engine's logits.
    again = tmp_path / "pretrained"
    _run(["--model", str(out / "model"), "--data", str(CORPUS), "--gpus", "2", "--zero", "2", "--precision", "fp32",
          "--seq-len", "64", "--steps", "5", "--output", str(again), "--lora-rank", "4", "--lora-targets", "q,v",
          "--merge"])
    summary = json.loads((again / "summary.json").read_text())
    assert summary["base_model"] == str((out / "model").resolve()) and "base_dir" not in summary
    assert not (again / "base").exists()
    _check_exports(again)


def test_summary_names_the_adapter_and_the_merged_model():
    from dstk.train.progress import format_summary

    text = format_summary(num_steps=3, first_loss=6.0, last_loss=5.0, eval_loss=None, tokens=10, elapsed_seconds=1.0,
                          export_dir=None, checkpoint=None, adapter_dir="o/adapter", base_dir="o/base")
    assert "LoRA adapter: o/adapter" in text and "AutoPeftModelForCausalLM" in text and "o/base" in text
    assert "HF model" not in text  # without --merge there is no OUTPUT/model
    text = format_summary(num_steps=3, first_loss=6.0, last_loss=5.0, eval_loss=None, tokens=10, elapsed_seconds=1.0,
                          export_dir="o/model", checkpoint=None, adapter_dir="o/adapter")
    assert "exported merged HF model: o/model" in text
