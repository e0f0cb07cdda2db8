"""`dstk import` and `--from`: other tools' setups -> a dstk intent -> a plan.

The input files in tests/data/import/ are written here in each tool's own style (the keys and
comments its docs and `accelerate config` show); the accelerate ones are also read by accelerate's
own loader, and training_args.json was written by transformers' ``TrainingArguments.to_json_string()``.
"""

from __future__ import annotations

import json
import os
import pathlib

import pytest
import yaml

from dstk.cli import main
from dstk.importers import detect_kind, import_file, preset_for
from dstk.intent import load_intent

DATA = pathlib.Path(__file__).parent / "data" / "import"

# file -> (kind, import flags, expected intent values "section.field": value, keys that must be dropped,
#          what the best plan must keep: layout attribute -> value)
CASES = {
    "accelerate_deepspeed.yaml": (
        "accelerate", {"model": {"name": "llama-3-8b"}},
        {"cluster.num_nodes": 2, "cluster.gpus_per_node": 8, "training.precision": "bf16", "training.grad_clip": 1.0,
         "constraints.zero_stage": 2, "constraints.offload_optimizer": "cpu", "constraints.offload_params": "none",
         "constraints.tp": 1, "constraints.pp": 1},
        {"deepspeed_config.zero3_init_flag", "deepspeed_config.gradient_accumulation_steps", "main_process_ip"},
        {"zero_stage": 2, "offload_optimizer": "cpu", "tp": 1, "pp": 1},
    ),
    "accelerate_config_file.yaml": (
        "accelerate", {"model": {"name": "llama-3-8b"}},
        {"cluster.gpus_per_node": 8, "constraints.zero_stage": 3, "constraints.offload_optimizer": "cpu",
         "constraints.micro_batch": 2, "training.global_batch": 16, "training.grad_clip": 1.0},
        {"gradient_accumulation_steps", "bf16.enabled", "zero_optimization.reduce_bucket_size"},
        {"zero_stage": 3, "offload_optimizer": "cpu", "micro_batch": 2, "grad_accum": 1},
    ),
    "accelerate_ddp.yaml": (
        "accelerate", {"model": {"name": "gpt2-medium"}},
        {"cluster.gpus_per_node": 4, "training.precision": "fp16", "constraints.zero_stage": 0,
         "constraints.offload": False},
        {"gpu_ids"},
        {"zero_stage": 0, "offload_optimizer": "none"},
    ),
    "accelerate_fsdp.yaml": (
        "accelerate", {"model": {"name": "llama-3-8b"}},
        {"constraints.zero_stage": 3, "constraints.offload_params": "cpu", "constraints.offload_optimizer": "cpu"},
        {"fsdp_config.fsdp_auto_wrap_policy", "fsdp_config.fsdp_state_dict_type"},
        {"zero_stage": 3, "offload_params": "cpu"},
    ),
    "llamafactory_full_sft.yaml": (
        "llamafactory", {},
        {"model.name": "llama-3-8b", "training.seq_len": 4096, "training.lr": 1e-5, "training.precision": "bf16",
         "training.schedule": "cosine", "training.global_batch": 2 * 8 * 8, "constraints.micro_batch": 2,
         "constraints.zero_stage": 2, "constraints.recompute": "full"},
        {"num_train_epochs", "warmup_ratio", "dataset", "train_micro_batch_size_per_gpu"},
        {"zero_stage": 2, "micro_batch": 2, "grad_accum": 8, "recompute": "full"},
    ),
    "llamafactory_lora_sft.yaml": (
        "llamafactory", {"cluster": {"gpu": "a100-80gb"}},
        {"model.name": "qwen2.5-7b", "training.precision": "fp16", "training.attention": "flash",
         "training.train_steps": 500, "training.warmup_steps": 50, "constraints.micro_batch": 1,
         "cluster.gpu": "a100-80gb", "training.lora_rank": 8, "training.lora_targets": "all-linear"},
        {"disable_gradient_checkpointing", "num_train_epochs"},
        {"micro_batch": 1, "grad_accum": 8},
    ),
    "axolotl_full.yml": (
        "axolotl", {},
        {"model.name": "llama-3.2-1b", "training.seq_len": 4096, "training.lr": 2e-5, "training.min_lr_ratio": 0.1,
         "training.attention": "flash", "training.train_steps": 1200, "training.warmup_steps": 100,
         "training.precision": "bf16", "training.global_batch": 2 * 4 * 8, "constraints.zero_stage": 3,
         "constraints.offload_params": "cpu", "constraints.offload_optimizer": "cpu", "constraints.micro_batch": 2,
         "constraints.recompute": "full"},
        {"sample_packing", "num_epochs", "load_in_4bit", "datasets", "zero_optimization.stage3_max_live_parameters"},
        {"zero_stage": 3, "offload_params": "cpu", "micro_batch": 2, "grad_accum": 4},
    ),
    "training_args.json": (
        "hf-args", {"model": {"name": "qwen3-8b"}, "training": {"seq_len": 4096}},
        {"training.lr": 2e-5, "training.weight_decay": 0.05, "training.grad_clip": 0.5, "training.betas": [0.9, 0.95],
         "training.train_steps": 3000, "training.warmup_steps": 90, "training.precision": "bf16",
         "training.global_batch": 4 * 4 * 8, "constraints.micro_batch": 4, "constraints.zero_stage": 2,
         "constraints.recompute": "full", "training.seq_len": 4096},
        {"num_train_epochs", "per_device_eval_batch_size", "output_dir", "fp16.enabled"},
        {"zero_stage": 2, "micro_batch": 4, "grad_accum": 4},
    ),
    "run_clm.sh": (
        "hf-flags", {},
        {"model.name": "gpt2-medium", "cluster.gpus_per_node": 4, "cluster.num_nodes": 1, "training.seq_len": 1024,
         "training.lr": 5e-5, "training.schedule": "linear", "training.warmup_steps": 50, "training.train_steps": 2000,
         "training.weight_decay": 0.01, "training.precision": "bf16", "training.global_batch": 8 * 2 * 4,
         "constraints.micro_batch": 8, "constraints.recompute": "full"},
        {"dataset_name", "output_dir"},
        {"micro_batch": 8, "grad_accum": 2, "dp": 4},
    ),
    "megatron_gpt.args": (
        "megatron", {"cluster": {"num_nodes": 2, "gpus_per_node": 8}},
        {"model.num_layers": 24, "model.hidden_size": 2048, "model.num_heads": 16, "model.vocab_size": 50257,
         "training.seq_len": 2048, "training.global_batch": 512, "training.lr": 2e-4, "training.min_lr_ratio": 0.1,
         "training.warmup_steps": 500, "training.train_steps": 20000, "training.betas": [0.9, 0.95],
         "constraints.engine": "megatron", "constraints.tp": 2, "constraints.pp": 2, "constraints.zero_stage": 1,
         "constraints.micro_batch": 4, "constraints.recompute": "selective"},
        {"--sequence-parallel", "--data-path", "--max-position-embeddings"},
        {"tp": 2, "pp": 2, "micro_batch": 4, "zero_stage": 1, "recompute": "selective"},
    ),
}


def test_every_data_file_has_a_case():
    files = sorted(p.name for p in DATA.iterdir() if p.is_file() and not p.name.startswith("ds_"))
    assert len(files) == 10
    assert files == sorted(CASES)


def _file_keys(path: pathlib.Path) -> set[str]:
    """Every key the file sets, as the import names them (nested accelerate/DeepSpeed keys dotted)."""
    text = path.read_text()
    if path.suffix in (".yaml", ".yml", ".json"):
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        keys = set()
        for k, v in data.items():
            if isinstance(v, dict) and k in ("deepspeed_config", "fsdp_config", "megatron_lm_config"):
                keys |= {f"{k}.{kk}" for kk in v}
            else:
                keys.add(k)
        return keys
    words = [w for line in text.splitlines() for w in line.split("#")[0].split()]
    script = next((i for i, w in enumerate(words) if w.endswith(".py")), None)
    words = words[script + 1:] if script is not None else words
    return {w.lstrip("-").replace("-", "_") if path.suffix == ".sh" else w for w in words if w.startswith("--")}


@pytest.mark.parametrize("name", sorted(CASES))
def test_import_then_plan(name):
    from dstk import plan as planner

    kind, flags, expected, dropped, layout_keeps = CASES[name]
    result = import_file(DATA / name, overrides=flags)
    assert result.kind == kind
    data = result.intent.to_dict()
    for target, value in expected.items():
        section, field = target.split(".")
        assert data[section][field] == value, (target, data[section][field])
    lines = {line.key: line for line in result.lines if line.action != "assumed"}
    for key in dropped:
        assert lines[key].action == "dropped" and lines[key].reason, key
    # every key of the file is accounted for: carried, or dropped with a reason
    for key in _file_keys(DATA / name):
        assert key in lines, f"{key} of {name} has no report line"
        assert lines[key].action in ("carried", "dropped")
        assert lines[key].action == "carried" or lines[key].reason
    # what the file fixed reaches the plan
    ctx = planner.resolve(result.intent)
    plans = planner.plan_intent(ctx, top=None).plans
    assert plans, f"nothing fits for {name}"
    best = plans[0].layout
    for attr, value in layout_keeps.items():
        assert getattr(best, attr) == value, (attr, getattr(best, attr))


def test_detect_kind_for_each_file():
    for name, (kind, *_rest) in CASES.items():
        text = (DATA / name).read_text()
        data = None
        if name.endswith((".yaml", ".yml")):
            data = yaml.safe_load(text)
        elif name.endswith(".json"):
            data = json.loads(text)
        assert detect_kind(text, data) == kind, name


@pytest.mark.parametrize("hub_id, preset", [
    ("meta-llama/Llama-2-7b-hf", "llama-2-7b"), ("meta-llama/Meta-Llama-3-8B-Instruct", "llama-3-8b"),
    ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b"), ("NousResearch/Llama-3.2-1B", "llama-3.2-1b"),
    ("mistralai/Mistral-7B-v0.3", "mistral-7b-v0.3"), ("google/gemma-7b-it", "gemma-7b"),
    ("openai-community/gpt2", "gpt2"), ("meta-llama/Llama-3.3-70B-Instruct", None), ("acme/secret-model", None),
])
def test_preset_for_hub_ids(hub_id, preset):
    assert preset_for(hub_id) == preset


def test_cli_import_writes_a_commented_intent_that_plans(tmp_path, capsys):
    out = tmp_path / "intent.yaml"
    assert main(["import", str(DATA / "llamafactory_full_sft.yaml"), "--gpus", "16", "--gpu", "a100-80gb",
                 "-o", str(out)]) == 0
    text = out.read_text()
    assert "# cutoff_len (" in text and "seq_len: 4096" in text
    report = capsys.readouterr().out
    assert "dropped  num_train_epochs" in report and "carried  cutoff_len = 4096 -> training.seq_len" in report
    intent = load_intent(out)
    assert intent.cluster.world_size == 16 and intent.cluster.gpu == "a100-80gb"
    assert intent.training.global_batch == 2 * 8 * 16  # the accumulation is fixed, so dp grows the global batch
    assert main(["plan", str(out), "--top", "2"]) == 0
    # an existing output is not overwritten without --force
    assert main(["import", str(DATA / "run_clm.sh"), "-o", str(out)]) == 2
    assert load_intent(out).training.seq_len == 4096


def test_cli_import_json_and_stdout(capsys):
    assert main(["import", str(DATA / "megatron_gpt.args"), "--gpus", "16", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["kind"] == "megatron" and data["intent"]["constraints"]["tp"] == 2
    assert {line["action"] for line in data["lines"]} >= {"carried", "dropped"}
    assert yaml.safe_load(data["intent_yaml"])["model"]["num_layers"] == 24
    assert main(["import", str(DATA / "run_clm.sh")]) == 0
    captured = capsys.readouterr()
    assert yaml.safe_load(captured.out)["model"]["name"] == "gpt2-medium"  # the intent on stdout ...
    assert "carried  block_size = 1024" in captured.err  # ... the report on stderr


def test_from_on_plan_generate_estimate(tmp_path, capsys):
    src = str(DATA / "llamafactory_full_sft.yaml")
    assert main(["plan", "--from", src, "--format", "json", "--top", "1"]) == 0
    best = json.loads(capsys.readouterr().out)["plans"][0]["layout"]
    assert (best["zero_stage"], best["micro_batch"], best["dp"]) == (2, 2, 8)
    # flags still win: 16 GPUs
    assert main(["plan", "--from", src, "--gpus", "16", "--format", "json", "--top", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["plans"][0]["layout"]["dp"] == 16
    out = tmp_path / "run"
    assert main(["generate", "--from", str(DATA / "axolotl_full.yml"), "-o", str(out)]) == 0
    ds = json.loads((out / "ds_config.json").read_text())
    assert ds["zero_optimization"]["stage"] == 3 and ds["train_micro_batch_size_per_gpu"] == 2
    assert ds["zero_optimization"]["offload_param"]["device"] == "cpu"
    capsys.readouterr()
    assert main(["estimate", "--from", src, "--format", "json"]) == 0
    est = json.loads(capsys.readouterr().out)
    assert est["layout"]["zero_stage"] == 2 and est["layout"]["micro_batch"] == 2 and est["layout"]["grad_accum"] == 8
    assert est["layout"]["recompute"] == "full" and est["training"]["seq_len"] == 4096
    assert main(["estimate", "--from", src, "--zero", "3", "--format", "json"]) == 0  # a flag wins
    assert json.loads(capsys.readouterr().out)["layout"]["zero_stage"] == 3
    assert main(["plan", str(DATA / "../../../examples/intents/llama-3-8b-1node.yaml"), "--from", src]) == 2


def test_round_trip_plan_to_ds_config_to_accelerate(tmp_path):
    """intent -> plan -> ds_config.json -> an accelerate YAML pointing at it -> import: same intent."""
    from dstk import plan as planner
    from dstk.intent import intent_from_dict

    original = intent_from_dict({
        "model": {"name": "llama-3-8b"}, "cluster": {"num_nodes": 2, "gpus_per_node": 8, "gpu": "h100-sxm"},
        "training": {"seq_len": 4096, "global_batch": 256, "lr": 2e-4, "warmup_steps": 50, "train_steps": 800,
                     "precision": "bf16", "weight_decay": 0.05, "betas": [0.9, 0.98], "grad_clip": 0.7,
                     "min_lr_ratio": 0.2},
        "constraints": {"tp": 1, "pp": 1},
    })
    ctx = planner.resolve(original)
    result = planner.plan_intent(ctx, top=None)
    files = planner.run_dir_files(ctx, result, index=0)
    (tmp_path / "ds_config.json").write_text(files["ds_config.json"])
    (tmp_path / "accelerate.yaml").write_text(yaml.safe_dump({
        "compute_environment": "LOCAL_MACHINE", "distributed_type": "DEEPSPEED", "mixed_precision": "bf16",
        "num_machines": 2, "num_processes": 16, "machine_rank": 0, "main_training_function": "main",
        "deepspeed_config": {"deepspeed_config_file": "ds_config.json", "zero3_init_flag": False},
    }))
    imported = import_file(tmp_path / "accelerate.yaml",
                           overrides={"model": {"name": "llama-3-8b"}, "training": {"seq_len": 4096}}).intent
    assert imported.model == original.model
    assert imported.cluster == original.cluster
    t, o = imported.training, original.training
    for field in ("seq_len", "lr", "warmup_steps", "precision", "weight_decay", "betas", "grad_clip", "min_lr_ratio",
                  "schedule", "optimizer", "eps"):
        assert getattr(t, field) == getattr(o, field), field
    assert t.sequences_per_step == o.sequences_per_step and t.steps == o.steps
    layout = result.plans[0].layout
    c = imported.constraints
    assert (c.zero_stage, c.micro_batch, c.offload_optimizer or "none") == (
        layout.zero_stage, layout.micro_batch, layout.offload_optimizer)
    # and the imported intent plans back to the same layout
    again = planner.plan_intent(planner.resolve(imported), top=None).plans[0].layout
    assert again == layout


def test_round_trip_megatron_args():
    """generate's megatron.args -> import: the same dimensions, degrees and batch."""
    from dstk import plan as planner
    from dstk.intent import intent_from_dict

    original = intent_from_dict(yaml.safe_load((DATA / "../../../examples/intents/megatron-gpt-dims.yaml").read_text()))
    ctx = planner.resolve(original)
    result = planner.plan_intent(ctx, top=None)
    files = planner.run_dir_files(ctx, result, index=0)
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".args", delete=False) as fh:
        fh.write(files["megatron.args"])
    try:
        imported = import_file(fh.name, overrides={"cluster": {"num_nodes": 2, "gpus_per_node": 8}}).intent
    finally:
        os.unlink(fh.name)
    m = imported.model
    assert (m.num_layers, m.hidden_size, m.num_heads, m.vocab_size) == (24, 2048, 16, 50304)
    layout = result.plans[0].layout
    c = imported.constraints
    assert (c.tp, c.pp, c.micro_batch, c.engine) == (layout.tp, layout.pp, layout.micro_batch, "megatron")
    assert imported.training.sequences_per_step == original.training.sequences_per_step


@pytest.mark.parametrize("backend, attention", [("unfused", "eager"), ("local", "eager"), ("flash", "flash"),
                                                ("fused", "flash")])
def test_megatron_attention_backend_imports_as_the_kernel_dstk_prices(tmp_path, backend, attention):
    """``--attention-backend unfused``/``local`` materialise the scores: eager, as generate writes
    eager back (``render.MEGATRON_ATTENTION_BACKEND``); flash and fused are fused kernels."""
    args = tmp_path / "megatron.args"
    args.write_text(f"--num-layers 24\n--hidden-size 2048\n--num-attention-heads 16\n--vocab-size 50304\n--attention-backend {backend}\n")
    imported = import_file(str(args), overrides={"cluster": {"num_nodes": 1, "gpus_per_node": 8}}).intent
    assert imported.training.attention == attention


@pytest.mark.parametrize("backend, reason", [("auto", "picks the kernel at run time"),
                                             ("bogus", "not a value Megatron-LM takes (flash, fused, unfused, local or auto)")])
def test_megatron_attention_backend_auto_or_unknown_is_dropped_with_its_reason(tmp_path, backend, reason):
    """``auto`` leaves the choice to TransformerEngine (priced as SDPA, dstk's default); a value Megatron-LM
    does not take is dropped with the values it does take, at its line, not read as SDPA without a word."""
    from megatron.core.transformer.enums import AttnBackend  # noqa: F401  (the values the reason lists)

    args = tmp_path / "megatron.args"
    args.write_text(f"--num-layers 24\n--hidden-size 2048\n--num-attention-heads 16\n--vocab-size 50304\n--attention-backend {backend}\n")
    result = import_file(str(args), overrides={"cluster": {"num_nodes": 1, "gpus_per_node": 8}})
    assert result.intent.training.attention is None  # unset: the plan prices its default, SDPA
    line = next(x for x in result.lines if x.key == "--attention-backend")
    assert (line.action, line.value) == ("dropped", backend) and reason in line.reason and line.where.endswith(":5")


def test_accelerate_reads_our_accelerate_files():
    """The test files are accelerate's own format: its loader reads them."""
    pytest.importorskip("accelerate")
    from accelerate.commands.config.config_args import load_config_from_file

    for name in sorted(CASES):
        if name.startswith("accelerate_"):
            config = load_config_from_file(str(DATA / name))
            assert config.num_processes == yaml.safe_load((DATA / name).read_text())["num_processes"]


def test_hub_id_found_in_the_local_hf_cache(tmp_path, monkeypatch):
    snap = tmp_path / "models--acme--tiny-llama" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 688, "vocab_size": 1000, "max_position_embeddings": 512}))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    src = tmp_path / "sft.yaml"
    src.write_text("model_name_or_path: acme/tiny-llama\ncutoff_len: 512\nfinetuning_type: full\n")
    result = import_file(src)
    assert result.intent.model.name == str(snap)
    from dstk import plan as planner

    assert planner.plan_intent(planner.resolve(result.intent), top=1).plans


@pytest.mark.parametrize("content, args, code, words", [
    (None, [], 2, ["no such file"]),
    ("just: [a, yaml, list]\n", [], 2, ["not a format dstk imports", "--kind"]),
    ("model_name_or_path: acme/secret-model\ncutoff_len: 1024\n", [], 1, ["hub id", "config.json", "sft.yaml:1"]),
    ("model_name_or_path: gpt2\ncutoff_len: 1024\ndeepspeed: configs/missing_z3.json\n", [], 1,
     ["does not exist", "sft.yaml:3", "deepspeed"]),
    ("distributed_type: DEEPSPEED\nnum_processes: 8\nmixed_precision: bf16\n", [], 2, ["names no model", "--model"]),
    ("base_model: gpt2\nsequence_len: 1024\nmicro_batch_size: x\n", [], 1, ["micro_batch_size", "expected a number"]),
])
def test_bad_input_is_a_clear_error(tmp_path, capsys, content, args, code, words):
    src = tmp_path / "sft.yaml"
    if content is not None:
        src.write_text(content)
    out = tmp_path / "intent.yaml"
    assert main(["import", str(src), "-o", str(out), *args]) == code
    err = capsys.readouterr().err
    assert "Traceback" not in err and "fix:" in err
    for word in words:
        assert word in err, (word, err)
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ([] if content is None else ["sft.yaml"])


def test_deepspeed_triad_that_does_not_multiply_is_an_error(tmp_path, capsys):
    (tmp_path / "ds.json").write_text(json.dumps({"train_batch_size": 100, "train_micro_batch_size_per_gpu": 2,
                                                  "gradient_accumulation_steps": 4}))
    (tmp_path / "acc.yaml").write_text("distributed_type: DEEPSPEED\nnum_processes: 8\nmixed_precision: bf16\n"
                                       "deepspeed_config:\n  deepspeed_config_file: ds.json\n")
    assert main(["import", str(tmp_path / "acc.yaml"), "--model", "gpt2"]) == 1
    err = capsys.readouterr().err
    assert "ds.json:" in err and "2 x accumulation 4 x dp 8 = 64" in err


def test_autotp_and_megatron_lm_degrees(tmp_path):
    """DeepSpeed AutoTP divides the data-parallel degree; accelerate's Megatron-LM plugin pins tp/pp."""
    (tmp_path / "ds.json").write_text(json.dumps({
        "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4, "bf16": {"enabled": True},
        "zero_optimization": {"stage": 1}, "tensor_parallel": {"autotp_size": 2}}))
    (tmp_path / "acc.yaml").write_text("distributed_type: DEEPSPEED\nnum_machines: 1\nnum_processes: 8\n"
                                       "mixed_precision: bf16\ndeepspeed_config:\n  deepspeed_config_file: ds.json\n")
    intent = import_file(tmp_path / "acc.yaml", overrides={"model": {"name": "llama-3-8b"}}).intent
    assert intent.constraints.tp == 2 and intent.training.global_batch == 2 * 4 * (8 // 2)
    (tmp_path / "mlm.yaml").write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: MEGATRON_LM\nmegatron_lm_config:\n"
        "  megatron_lm_gradient_clipping: 1.0\n  megatron_lm_num_micro_batches: 4\n  megatron_lm_pp_degree: 2\n"
        "  megatron_lm_recompute_activations: true\n  megatron_lm_sequence_parallelism: true\n"
        "  megatron_lm_tp_degree: 2\n  megatron_lm_use_distributed_optimizer: true\nmixed_precision: bf16\n"
        "num_machines: 1\nnum_processes: 8\nuse_cpu: false\n")
    result = import_file(tmp_path / "mlm.yaml", overrides={"model": {"name": "llama-3-8b"}})
    c = result.intent.constraints
    assert (c.engine, c.tp, c.pp, c.zero_stage, c.recompute) == ("megatron", 2, 2, 1, "selective")
    dropped = {line.key for line in result.lines if line.action == "dropped"}
    assert "megatron_lm_config.megatron_lm_num_micro_batches" in dropped


# ---------------------------------------------------------------------------------------------- dstk upgrade

OLD_CONFIGS = {
    # DeepSpeed 0.3-0.5 era ZeRO-Offload, written the way its tutorials did
    "zero_offload_2020.json": {
        "train_batch_size": 32, "gradient_accumulation_steps": 4, "fp16": {"enabled": True, "loss_scale": 0},
        "zero_optimization": {"stage": 2, "cpu_offload": True, "cpu_offload_use_pin_memory": True,
                              "contiguous_gradients": True, "overlap_comm": True},
    },
    # 0.6-0.9 era ZeRO-3 with parameter offload, bfloat16 spelling and the fp16-named save flag
    "zero3_2022.json": {
        "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 8, "bfloat16": {"enabled": True},
        "zero_optimization": {"stage": 3, "cpu_offload": True, "cpu_offload_param": True,
                              "stage3_gather_fp16_weights_on_model_save": True, "stage3_max_live_parameters": 1e9},
    },
    # features removed since: elasticity, amp, sparse_attention, MiCS; the boolean ZeRO switch
    "removed_features.json": {
        "train_batch_size": 64, "train_micro_batch_size_per_gpu": 8, "amp": {"enabled": True, "opt_level": "O1"},
        "elasticity": {"enabled": False, "max_train_batch_size": 2000},
        "sparse_attention": {"mode": "fixed", "block": 16}, "zero_optimization": True,
    },
    "mics.json": {
        "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
        "bfloat16": {"enabled": True},
        "zero_optimization": {"stage": 3, "mics_shard_size": 8, "mics_hierarchical_params_gather": False,
                              "cpu_offload_param": False},
    },
}


@pytest.mark.parametrize("name", sorted(OLD_CONFIGS))
def test_upgrade_old_configs(tmp_path, capsys, name):
    from dstk.validate import validate_config

    path = tmp_path / name
    original = json.dumps(OLD_CONFIGS[name], indent=2) + "\n"
    path.write_text(original)
    before = [f for f in validate_config(OLD_CONFIGS[name], world_size=8) if f.code in ("DS105", "DS106")]
    assert before, "the old config must have something to upgrade"
    assert main(["upgrade", str(path)]) == 0
    diff = capsys.readouterr().out
    assert path.read_text() == original  # no --write: nothing written
    assert not list(tmp_path.glob("*.bak*"))
    # the diff is minimal: it removes no more lines than the rewritten keys span (+2 for moved braces/commas)
    spans = 0
    for change in _changes(OLD_CONFIGS[name]):
        node = OLD_CONFIGS[name]
        for part in change.pointer.strip("/").split("/"):
            node = node[part]
        spans += len(json.dumps(node, indent=2).splitlines())
    removed = [line for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")]
    assert 0 < len(removed) <= spans + 2, (len(removed), spans, diff)
    assert main(["upgrade", str(path), "--write"]) == 0
    capsys.readouterr()
    upgraded = json.loads(path.read_text())
    assert (tmp_path / f"{name}.bak").read_text() == original
    after = validate_config(upgraded, world_size=8)
    assert not [f for f in after if f.severity == "error" or f.code in ("DS105", "DS106")], after
    # the meaning is kept: offload, precision and stage read the same as DeepSpeed read the old form
    from dstk.estimate.dsconfig import read_settings

    legacy = OLD_CONFIGS[name]
    if isinstance(legacy.get("zero_optimization"), bool):  # dstk's reader takes the object form only
        legacy = {**legacy, "zero_optimization": {"stage": int(legacy["zero_optimization"])}}
    old, new = read_settings(legacy, hidden_size=1024), read_settings(upgraded, hidden_size=1024)
    assert (old.zero_stage, old.offload_optimizer, old.offload_params, old.precision) == \
        (new.zero_stage, new.offload_optimizer, new.offload_params, new.precision)
    # and a second upgrade has nothing to do
    assert main(["upgrade", str(path), "--write"]) == 0
    assert "nothing to upgrade" in capsys.readouterr().err
    assert not (tmp_path / f"{name}.bak.1").exists()


def _changes(config):
    from dstk.commands.upgrade import upgrade_config

    return upgrade_config(config)[1]


def test_upgrade_refuses_hjson_and_bad_versions(tmp_path, capsys):
    path = tmp_path / "ds.json"
    path.write_text('{\n  // ZeRO-2\n  "zero_optimization": {"stage": 2, "cpu_offload": true}\n}\n')
    before = path.read_text()
    assert main(["upgrade", str(path), "--write"]) == 1
    err = capsys.readouterr().err
    assert "not strict JSON" in err and "fix:" in err and "Traceback" not in err
    assert path.read_text() == before and not list(tmp_path.glob("*.bak*"))
    assert main(["upgrade", str(path), "--deepspeed-version", "0.9.0"]) == 2
    assert main(["upgrade", str(tmp_path / "missing.json")]) == 2


def test_import_and_from_stay_light():
    """import and --from are fast commands: no torch, deepspeed, transformers or accelerate."""
    import subprocess
    import sys

    code = ("import sys, io, contextlib\nfrom dstk.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
            f"    assert main(['import', {str(DATA / 'axolotl_full.yml')!r}]) == 0\n"
            f"    assert main(['plan', '--from', {str(DATA / 'megatron_gpt.args')!r}, '--gpus', '16']) == 0\n"
            f"    assert main(['estimate', '--from', {str(DATA / 'run_clm.sh')!r}]) == 0\n"
            "heavy = [m for m in ('torch', 'deepspeed', 'transformers', 'accelerate') if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_inline_deepspeed_dict_and_accelerate_launch_flags(tmp_path):
    """TrainingArguments(deepspeed={...}) dumps the dict inline; `accelerate launch` flags give the GPUs."""
    (tmp_path / "args.json").write_text(json.dumps({
        "output_dir": "out", "per_device_train_batch_size": 4, "gradient_accumulation_steps": 2,
        "learning_rate": 1e-5, "bf16": True, "max_steps": 100,
        "deepspeed": {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}},
                      "train_micro_batch_size_per_gpu": "auto"}}))
    intent = import_file(tmp_path / "args.json", overrides={"model": {"name": "llama-3-8b"}}).intent
    assert (intent.constraints.zero_stage, intent.constraints.offload_params) == (3, "cpu")
    (tmp_path / "launch.sh").write_text(
        "# two nodes of 8\naccelerate launch --num_processes 16 --num_machines 2 train_sft.py \\\n"
        "  --model_name_or_path llama-3-8b --per_device_train_batch_size 1 --gradient_accumulation_steps 16 \\\n"
        "  --max_seq_length 8192 --learning_rate=2e-5 --bf16 True\n")
    result = import_file(tmp_path / "launch.sh")
    assert result.kind == "hf-flags"
    i = result.intent
    assert (i.cluster.num_nodes, i.cluster.gpus_per_node, i.training.seq_len) == (2, 8, 8192)
    assert i.training.global_batch == 1 * 16 * 16 and i.training.lr == 2e-5
    assert {line.where for line in result.lines if line.key == "max_seq_length"} == {f"{tmp_path / 'launch.sh'}:4"}
