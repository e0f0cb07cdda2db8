"""Export (issue 13): ``dstk generate`` writes accelerate_config.yaml and training_args.json that
accelerate's own loader, transformers' TrainingArguments and its DeepSpeed integration accept, and
that agree with ds_config.hf.json by construction. Real accelerate / transformers, no mocks."""

from __future__ import annotations

import json

import pytest

from dstk import plan as planner
from dstk.importers import import_file
from dstk.intent import intent_from_dict

INTENTS = {
    "8b-2x8-bf16": {
        "model": {"name": "llama-3-8b"}, "cluster": {"num_nodes": 2, "gpus_per_node": 8, "gpu": "h100-sxm"},
        "training": {"seq_len": 4096, "global_batch": 256, "lr": 2e-4, "warmup_steps": 50, "train_steps": 800,
                     "precision": "bf16", "weight_decay": 0.05, "betas": [0.9, 0.98], "grad_clip": 0.7,
                     "min_lr_ratio": 0.2},
        "constraints": {"tp": 1, "pp": 1},
    },
    "1b-1x4-fp16-z3": {
        "model": {"name": "llama-3.2-1b"}, "cluster": {"num_nodes": 1, "gpus_per_node": 4, "gpu": "v100-32gb"},
        "training": {"seq_len": 2048, "global_batch": 32, "precision": "fp16", "schedule": "linear",
                     "train_steps": 300},
        "constraints": {"zero_stage": 3, "tp": 1, "pp": 1},
    },
}


def _generate(name: str, directory) -> tuple:
    intent = intent_from_dict(INTENTS[name])
    ctx = planner.resolve(intent)
    result = planner.plan_intent(ctx, top=None)
    files = planner.run_dir_files(ctx, result, index=0)
    for fname, text in files.items():
        (directory / fname).write_text(text)
    return intent, result.plans[0].layout, files


@pytest.fixture(params=sorted(INTENTS))
def run_dir(request, tmp_path):
    intent, layout, files = _generate(request.param, tmp_path)
    return tmp_path, intent, layout, files


def test_hf_flavour_has_no_optimizer_or_scheduler(run_dir):
    _, _, _, files = run_dir
    hf = json.loads(files["ds_config.hf.json"])
    assert "optimizer" not in hf and "scheduler" not in hf
    ds = json.loads(files["ds_config.json"])
    assert "optimizer" in ds and "scheduler" in ds  # the plain flavour keeps DeepSpeed's own


def test_hf_flavour_keeps_deepspeeds_optimizer_under_offload():
    """Under optimizer offload accelerate swaps the Trainer's optimizer for DeepSpeedCPUAdam with
    only lr and weight decay (betas and eps lost), so that HF file keeps DeepSpeed's optimizer block,
    its numbers "auto"; still no scheduler block."""
    from dstk import render
    from dstk.intent import TrainingIntent
    from dstk.layout import Layout

    config = render.ds_config(layout=Layout(dp=2, zero_stage=2, offload_optimizer="cpu"),
                              training=TrainingIntent(), hf=True)
    assert config["optimizer"]["params"]["lr"] == "auto" and "scheduler" not in config


def test_accelerate_loader_reads_the_exported_config(run_dir):
    from accelerate.commands.config.config_args import load_config_from_file

    directory, intent, layout, _ = run_dir
    config = load_config_from_file(str(directory / "accelerate_config.yaml"))
    assert str(config.distributed_type) in ("DEEPSPEED", "DistributedType.DEEPSPEED")
    assert config.num_processes == layout.world_size
    assert config.num_machines == intent.cluster.num_nodes
    assert config.deepspeed_config["deepspeed_config_file"] == "ds_config.hf.json"
    assert config.deepspeed_config["zero3_init_flag"] == (layout.zero_stage == 3)
    assert config.mixed_precision is None  # precision lives in the DeepSpeed file, filled from training_args


def test_accelerate_launch_accepts_config_with_deepspeed_file(run_dir, monkeypatch):
    """What ``accelerate launch`` passes to the ranks (ACCELERATE_CONFIG_DS_FIELDS, computed as
    ``launch_command`` does) must not trip DeepSpeedPlugin's check that refuses accelerate
    settings next to ``deepspeed_config_file`` (e.g. mixed_precision)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import DeepSpeedPlugin

    directory, _, layout, _ = run_dir
    monkeypatch.chdir(directory)
    args = launch_command_parser().parse_args(["--config_file", "accelerate_config.yaml", "train.py"])
    args, defaults, mp_from_config = _validate_launch_command(args)
    fields = list(defaults.deepspeed_config.keys()) + (["mixed_precision"] if mp_from_config else [])
    monkeypatch.setenv("ACCELERATE_CONFIG_DS_FIELDS", ",".join(fields).lower())
    plugin = DeepSpeedPlugin(hf_ds_config=defaults.deepspeed_config["deepspeed_config_file"])
    assert plugin.zero_stage == layout.zero_stage


def test_training_args_and_hf_config_fill_auto_without_mismatch(run_dir, monkeypatch):
    from transformers import LlamaConfig, LlamaForCausalLM, TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    directory, intent, layout, files = run_dir
    monkeypatch.chdir(directory)
    kwargs = json.loads(files["training_args.json"])
    args = TrainingArguments(**kwargs, use_cpu=True, report_to=[])
    assert args.deepspeed == "ds_config.hf.json"
    hf = HfTrainerDeepSpeedConfig(json.loads(files["ds_config.hf.json"]))
    hf.trainer_config_process(args)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, vocab_size=64))
    hf.trainer_config_finalize(args, model, kwargs["max_steps"])  # raises ValueError on any mismatch
    filled = hf.config
    assert '"auto"' not in json.dumps(filled)
    assert filled["train_micro_batch_size_per_gpu"] == layout.micro_batch
    assert filled["gradient_accumulation_steps"] == layout.grad_accum
    assert filled["gradient_clipping"] == intent.training.grad_clip
    precision = intent.training.precision
    assert filled.get("bf16", {}).get("enabled", False) == (precision == "bf16")
    assert filled.get("fp16", {}).get("enabled", False) == (precision == "fp16")
    # the numbers the plain DeepSpeed file runs with are the Trainer's
    ds = json.loads(files["ds_config.json"])
    assert args.learning_rate == ds["optimizer"]["params"]["lr"]
    assert [args.adam_beta1, args.adam_beta2] == ds["optimizer"]["params"]["betas"]
    assert args.weight_decay == ds["optimizer"]["params"]["weight_decay"]
    assert args.warmup_steps == ds["scheduler"]["params"]["warmup_num_steps"]
    assert args.max_steps == ds["scheduler"]["params"].get("total_num_steps", intent.training.steps)
    assert args.max_grad_norm == ds["gradient_clipping"]


def test_a_disagreeing_training_arg_is_a_mismatch(run_dir, monkeypatch):
    """The oracle can fail: an explicit value in the DeepSpeed file that disagrees is refused."""
    from transformers import TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    directory, _, layout, files = run_dir
    monkeypatch.chdir(directory)
    kwargs = json.loads(files["training_args.json"])
    kwargs["per_device_train_batch_size"] = layout.micro_batch + 1
    args = TrainingArguments(**kwargs, use_cpu=True, report_to=[])
    config = json.loads(files["ds_config.hf.json"])
    config["train_micro_batch_size_per_gpu"] = layout.micro_batch
    hf = HfTrainerDeepSpeedConfig(config)
    hf.trainer_config_process(args)
    with pytest.raises(ValueError, match="mismatch"):
        hf.trainer_config_finalize(args, None, kwargs["max_steps"])


def test_round_trip_through_import(run_dir):
    """generate -> accelerate_config.yaml / training_args.json -> dstk import: the same cluster,
    ZeRO stage and accumulation (accelerate file) and the same training (training arguments)."""
    directory, intent, layout, _ = run_dir
    name = intent.model.name
    acc = import_file(directory / "accelerate_config.yaml",
                      overrides={"model": {"name": name}, "training": {"seq_len": intent.training.seq_len}}).intent
    assert acc.model == intent.model
    assert acc.cluster.num_nodes == intent.cluster.num_nodes
    assert acc.cluster.num_nodes * acc.cluster.gpus_per_node == layout.world_size
    assert acc.constraints.zero_stage == layout.zero_stage
    targs = import_file(directory / "training_args.json",
                        overrides={"model": {"name": name}, "training": {"seq_len": intent.training.seq_len},
                                   "cluster": {"num_nodes": intent.cluster.num_nodes,
                                               "gpus_per_node": intent.cluster.gpus_per_node,
                                               "gpu": intent.cluster.gpu}}).intent
    t, o = targs.training, intent.training
    for field in ("lr", "warmup_steps", "precision", "weight_decay", "betas", "grad_clip", "min_lr_ratio",
                  "schedule", "optimizer", "eps"):
        assert getattr(t, field) == getattr(o, field), field
    assert t.sequences_per_step == o.sequences_per_step and t.steps == o.steps
    assert targs.constraints.micro_batch == layout.micro_batch
    again = planner.plan_intent(planner.resolve(targs), top=None).plans[0].layout
    assert again == layout


# --- dstk validate --training-args: the same mismatches transformers raises -----------------------

MUTATIONS = {
    "agree": {},
    "lr": {"learning_rate": 1e-4},
    "batch": {"per_device_train_batch_size": 3},
    "accum+clip": {"gradient_accumulation_steps": 5, "max_grad_norm": 0.3},
    "betas+eps+wd": {"adam_beta2": 0.999, "adam_epsilon": 1e-6, "weight_decay": 0.0},
    "precision": {"bf16": False},
    "steps+warmup": {"max_steps": 123, "warmup_steps": 0.1},
    "warmup-as-fraction": {"warmup_steps": 0.0625},  # 800 x 0.0625 = 50 steps: agrees
}


def _transformers_mismatches(config: dict, kwargs: dict) -> set[str]:
    """The pointers transformers' own filler reports as mismatches (its ValueError text)."""
    from transformers import TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    args = TrainingArguments(**kwargs, use_cpu=True, report_to=[])
    hf = HfTrainerDeepSpeedConfig(json.loads(json.dumps(config)))
    hf.trainer_config_process(args)
    try:
        hf.trainer_config_finalize(args, None, args.max_steps)
    except ValueError as exc:
        lines = [line for line in str(exc).splitlines() if line.startswith("- ds ")]
        return {"/" + line[len("- ds "):].split("=", 1)[0].replace(".", "/") for line in lines}
    return set()


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_validate_training_args_finds_what_transformers_finds(mutation, tmp_path, monkeypatch):
    """The plain ds_config.json (explicit values everywhere) against the exported training arguments,
    changed: dstk's DS240 pointers are exactly transformers' mismatches, without importing it."""
    from dstk.validate.training_args import training_args_findings

    _, layout, files = _generate("8b-2x8-bf16", tmp_path)
    monkeypatch.chdir(tmp_path)
    config = json.loads(files["ds_config.json"])
    kwargs = {**json.loads(files["training_args.json"]), **MUTATIONS[mutation]}
    expected = _transformers_mismatches(config, kwargs)
    # TrainingArguments.world_size is 1 in this process: the triad is compared at 1 rank on both sides
    found = {f.pointer for f in training_args_findings(config, kwargs, world_size=1) if f.code == "DS240"}
    assert found == expected
    if mutation not in ("agree", "warmup-as-fraction"):
        assert found - {"/train_batch_size"}, "the mutation should show"
    hf_found = training_args_findings(json.loads(files["ds_config.hf.json"]), kwargs, world_size=1)
    assert [f for f in hf_found if f.code == "DS240"] == []  # all "auto": nothing to disagree with


def test_validate_cli_training_args(tmp_path, capsys):
    from dstk.cli import main

    _generate("8b-2x8-bf16", tmp_path)
    ta = json.loads((tmp_path / "training_args.json").read_text())
    assert main(["validate", str(tmp_path / "ds_config.hf.json"), "--hf", "--training-args",
                 str(tmp_path / "training_args.json"), "--world-size", "16"]) == 0
    ta["learning_rate"] = 1e-5
    (tmp_path / "changed.json").write_text(json.dumps(ta))
    code = main(["validate", str(tmp_path / "ds_config.json"), "--training-args", str(tmp_path / "changed.json"),
                 "--world-size", "16", "--format", "json"])
    assert code == 1
    report = json.loads(_last_json(capsys))
    findings = report["files"][0]["findings"]
    assert {(f["code"], f["pointer"]) for f in findings} == {
        ("DS240", "/optimizer/params/lr"), ("DS241", "/optimizer"), ("DS241", "/scheduler")}
    assert all(f["line"] for f in findings)


def _last_json(capsys) -> str:
    out = capsys.readouterr().out
    return out[out.index('{\n  "files"'):]


def test_ds241_only_where_the_block_replaces_the_trainers_choice():
    from dstk import render
    from dstk.intent import TrainingIntent
    from dstk.layout import Layout
    from dstk.validate.training_args import training_args_findings

    ta = {"optim": "adamw_torch", "lr_scheduler_type": "linear"}
    plain = render.ds_config(layout=Layout(dp=2, zero_stage=2), training=TrainingIntent())
    assert {f.pointer for f in training_args_findings(plain, ta) if f.code == "DS241"} == {"/optimizer", "/scheduler"}
    offload = render.ds_config(layout=Layout(dp=2, zero_stage=2, offload_optimizer="cpu"), training=TrainingIntent(),
                               hf=True)
    assert [f for f in training_args_findings(offload, ta)] == []  # the offload optimizer block is wanted
