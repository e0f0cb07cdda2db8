"""``dstk validate --hf --deepspeed``: "auto" filled as transformers' Trainer fills it, from what is given only.

The oracle of the fill is transformers' own ``HfTrainerDeepSpeedConfig`` (``trainer_config_process`` and
``trainer_config_finalize``) with real ``TrainingArguments``; the oracle of the check is DeepSpeed's
``DeepSpeedConfig`` in the child process that ``--deepspeed`` starts."""

from __future__ import annotations

import copy
import json
import tempfile
import types

import pytest

from dstk.cli import main
from dstk.validate.rules import HF_FILLS
from dstk.validate.training_args import fill_auto, unfilled_findings

HIDDEN = {"/zero_optimization/reduce_bucket_size", "/zero_optimization/stage3_prefetch_bucket_size",
          "/zero_optimization/stage3_param_persistence_threshold"}

ALL_AUTO = {
    "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "train_batch_size": "auto",
    "gradient_clipping": "auto", "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"},
    "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto", "overlap_comm": True},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                      "warmup_num_steps": "auto", "total_num_steps": "auto"}},
}
ZERO3 = {
    "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": "auto", "train_batch_size": "auto",
    "fp16": {"enabled": "auto"},
    "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                          "stage3_param_persistence_threshold": "auto"},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                 "warmup_num_steps": "auto"}},
}
NO_SCHEDULER = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": 4,
                "train_batch_size": "auto", "gradient_clipping": 1.0, "zero_optimization": {"stage": 1}}

VARIANTS = {
    "all-auto-bf16": (ALL_AUTO, dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, learning_rate=3e-4,
                                     weight_decay=0.1, adam_beta2=0.95, adam_epsilon=1e-6, max_grad_norm=0.5,
                                     bf16=True, max_steps=100, warmup_steps=10)),
    "all-auto-ratio": (ALL_AUTO, dict(per_device_train_batch_size=1, max_steps=30, warmup_steps=0.25)),
    "zero3-fp16": (ZERO3, dict(per_device_train_batch_size=2, gradient_accumulation_steps=3, fp16=True,
                               max_steps=40, warmup_steps=0.05)),
    "no-scheduler": (NO_SCHEDULER, dict(per_device_train_batch_size=8, gradient_accumulation_steps=4,
                                        save_on_each_node=True)),
}


def _pointers(node, prefix=""):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _pointers(value, f"{prefix}/{key}")
    else:
        yield prefix, node


def _transformers_fill(config: dict, args: dict, *, hidden_size: int = 64) -> dict:
    """transformers' own fill: TrainingArguments(**args), then the two stages the Trainer runs."""
    from transformers import TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig, unset_hf_deepspeed_config

    with tempfile.TemporaryDirectory() as out:
        training = TrainingArguments(output_dir=out, report_to=[], use_cpu=True, **args)
        hf = HfTrainerDeepSpeedConfig(copy.deepcopy(config))
        try:
            hf.trainer_config_process(training)
            model = types.SimpleNamespace(config=types.SimpleNamespace(hidden_size=hidden_size))
            hf.trainer_config_finalize(training, model, args.get("max_steps", 10) if args.get("max_steps", -1) > 0
                                       else 10)
            return hf.config
        finally:
            unset_hf_deepspeed_config()


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_fill_equals_transformers_fill_except_the_models_hidden_size(name):
    config, args = VARIANTS[name]
    theirs = _transformers_fill(config, args)
    filled = fill_auto(config, training_args=args, world_size=1)
    unfilled = {u.pointer for u in filled.unfilled}
    auto_hidden = {p for p, v in _pointers(config) if v == "auto" and p in HIDDEN}
    if config["zero_optimization"]["stage"] != 3:
        auto_hidden &= {"/zero_optimization/reduce_bucket_size"}
    assert unfilled == auto_hidden  # everything else is known from the training arguments and the world size
    expected = dict(_pointers(theirs))
    for pointer in auto_hidden:
        expected.pop(pointer)
    assert dict(_pointers(filled.config)) == expected
    assert not filled.batch_stand_in


def test_without_training_args_nothing_is_invented():
    filled = fill_auto(ALL_AUTO, training_args=None, world_size=None)
    autos = {p for p, v in _pointers(ALL_AUTO) if v == "auto"}
    reported = {u.pointer for u in filled.unfilled}
    # only warmup_min_lr (always 0, not a training argument) is filled; every other "auto" is reported and left out
    assert reported == autos - {"/scheduler/params/warmup_min_lr"}
    assert all(p in HF_FILLS for p in reported)
    values = dict(_pointers(filled.config))
    assert values["/scheduler/params/warmup_min_lr"] == 0
    assert not any(p in values for p in reported - {"/train_micro_batch_size_per_gpu"})
    assert filled.batch_stand_in and values["/train_micro_batch_size_per_gpu"] == 1
    findings = unfilled_findings(filled)
    assert {f.code for f in findings} == {"DS242"} and {f.pointer for f in findings} == reported
    micro = next(f for f in findings if f.pointer == "/train_micro_batch_size_per_gpu")
    assert "stand-in" in micro.message or "only to reach" in micro.message
    tbs = next(f for f in findings if f.pointer == "/train_batch_size")
    assert "--world-size" in tbs.hint and "--training-args" in tbs.hint


def test_values_the_file_pins_fill_their_twins():
    """An explicit lr is the Trainer's learning_rate (else it stops with a mismatch), so an "auto"
    warmup_max_lr gets it; an explicit micro-batch and accumulation give the global batch at a known world size."""
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "train_batch_size": "auto",
              "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}},
              "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_max_lr": "auto", "total_num_steps": 500,
                                                                "warmup_num_steps": "auto"}}}
    filled = fill_auto(config, training_args=None, world_size=2)
    assert filled.config["train_batch_size"] == 16
    assert filled.config["scheduler"]["params"]["warmup_max_lr"] == 3e-4
    assert [u.pointer for u in filled.unfilled] == ["/scheduler/params/warmup_num_steps"]
    assert not filled.batch_stand_in


def _write(tmp_path, name, config):
    path = tmp_path / name
    path.write_text(json.dumps(config, indent=1))
    return str(path)


def test_cli_without_training_args_reports_what_auto_needs_and_deepspeed_accepts_the_rest(tmp_path, capsys):
    path = _write(tmp_path, "hf.json", ALL_AUTO)
    assert main(["validate", "--hf", "--deepspeed", "--no-project", "--format", "json", path]) == 0
    (entry,) = json.loads(capsys.readouterr().out)["files"]
    assert entry["deepspeed"]["accepted"], entry["deepspeed"]
    codes = {f["pointer"]: f["code"] for f in entry["findings"]}
    assert codes["/train_micro_batch_size_per_gpu"] == "DS242" and codes["/scheduler/params/total_num_steps"] == "DS242"
    assert "/scheduler/params/warmup_min_lr" not in codes
    assert all(f["line"] for f in entry["findings"])


def test_cli_fills_from_training_args_and_deepspeed_judges_the_filled_values(tmp_path, capsys):
    """per_device_train_batch_size 4 reaches DeepSpeed as the micro-batch: with the explicit
    train_batch_size 8 and accumulation 1 at one rank, DeepSpeed rejects the triad (4 x 1 x 1 != 8);
    had the micro-batch been left out, DeepSpeed would derive 8 and accept."""
    bad = _write(tmp_path, "bad.json", {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": 1,
                                        "train_batch_size": 8, "bf16": {"enabled": "auto"}})
    args = tmp_path / "training_args.json"
    args.write_text(json.dumps({"per_device_train_batch_size": 4, "bf16": True}))
    code = main(["validate", "--hf", "--deepspeed", "--no-project", "--world-size", "1", "--training-args", str(args),
                 "--format", "json", bad])
    (entry,) = json.loads(capsys.readouterr().out)["files"]
    assert code == 1
    assert not entry["deepspeed"]["accepted"] and "train_batch_size" in entry["deepspeed"]["error"]
    found = {f["code"] for f in entry["findings"]}
    assert "DS301" in found and "DS242" not in found


def test_dstk_exports_fill_completely_and_deepspeed_accepts_them_at_the_plans_size(tmp_path, capsys):
    """generate's ds_config.hf.json with its training_args.json (as the Trainer would run them): every
    "auto" is filled from the two files and the world size, and DeepSpeed accepts the result at dp 2."""
    root = __import__("pathlib").Path(__file__).resolve().parent.parent
    run = tmp_path / "run"
    assert main(["generate", str(root / "examples" / "intents" / "tiny-llama-cpu.yaml"), "-o", str(run)]) == 0
    capsys.readouterr()
    hf = str(run / "ds_config.hf.json")
    assert "auto" in (run / "ds_config.hf.json").read_text()
    assert main(["validate", "--hf", "--deepspeed", "--no-project", "--world-size", "2", "--training-args",
                 str(run / "training_args.json"), "--format", "json", hf]) == 0
    (entry,) = json.loads(capsys.readouterr().out)["files"]
    assert entry["deepspeed"]["accepted"] and entry["findings"] == [], entry
