"""An outside user's audit of `dstk import` / `--from` and `dstk validate` on the setups other tools ship:
each test is a defect found by importing configs written as LLaMA-Factory (``examples/train_lora/*.yaml``,
``examples/deepspeed/ds_z3_config.json``, ``examples/accelerate/ds_multi_nodes.yaml``), axolotl
(``examples/llama-3/lora-8b.yml``, ``qlora.yml``, ``deepspeed_configs/zero3_bf16.json``) and accelerate
(``examples/config_yaml_templates/deepspeed.yaml``) write them, and fails on the code before its fix.
The fixtures are written here from the keys and values those files use, not copied."""

from __future__ import annotations

import json

import pytest
import yaml

from dstk.cli import main
from dstk.importers import import_file

# LLaMA-Factory's ds_z3_config.json: every batch/precision value "auto", ZeRO-3, no offload block.
LF_DS_Z3 = {
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto", "zero_allow_untested_optimizer": True,
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
             "hysteresis": 2, "min_loss_scale": 1},
    "bf16": {"enabled": "auto"},
    "zero_optimization": {"stage": 3, "overlap_comm": False, "contiguous_gradients": True, "sub_group_size": 1e9,
                          "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                          "stage3_param_persistence_threshold": "auto", "stage3_max_live_parameters": 1e9,
                          "stage3_max_reuse_distance": 1e9, "stage3_gather_16bit_weights_on_model_save": True},
}

LF_LORA = """### model
model_name_or_path: Qwen/Qwen2.5-7B-Instruct
trust_remote_code: true

### method
stage: sft
do_train: true
finetuning_type: lora
lora_rank: {rank}
lora_target: {target}
deepspeed: examples/deepspeed/ds_z3_config.json  # choices: [ds_z0_config.json, ds_z2_config.json, ds_z3_config.json]

### dataset
dataset: identity,alpaca_en_demo
template: qwen
cutoff_len: 2048
max_samples: 1000

### output
output_dir: saves/qwen2.5-7b/lora/sft
report_to: none

### train
per_device_train_batch_size: 1
gradient_accumulation_steps: 2
learning_rate: 1.0e-4
num_train_epochs: 3.0
lr_scheduler_type: cosine
warmup_ratio: 0.1
bf16: true
ddp_timeout: 180000000
"""


def _run(capsys, argv):
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def _lf_repo(tmp_path, *, rank=8, target="all", extra=""):
    """A LLaMA-Factory checkout's layout: the training YAML under examples/train_lora/, the DeepSpeed file
    under examples/deepspeed/, the path in the YAML relative to the repository root (where
    `llamafactory-cli train` runs)."""
    root = tmp_path / "LLaMA-Factory"
    (root / "examples" / "deepspeed").mkdir(parents=True)
    (root / "examples" / "train_lora").mkdir(parents=True)
    (root / "examples" / "deepspeed" / "ds_z3_config.json").write_text(json.dumps(LF_DS_Z3, indent=2))
    path = root / "examples" / "train_lora" / "qwen_lora_sft_ds3.yaml"
    path.write_text(LF_LORA.format(rank=rank, target=target) + extra)
    return root, path


def _lines(result) -> dict:
    return {line.key: line for line in result.lines}


def test_llamafactory_lora_is_planned_as_lora(tmp_path, monkeypatch, capsys):
    """LLaMA-Factory's LoRA examples (finetuning_type: lora, lora_rank, lora_target) were imported as full
    fine-tuning: `dstk plan --from` priced 20.8 GiB per GPU of gradients and optimizer states for a run that
    trains 0.27% of the parameters, and the report only said to pass --lora-rank by hand."""
    root, path = _lf_repo(tmp_path, rank=16, target="q_proj, v_proj",
                          extra="lora_alpha: 32\nlora_dropout: 0.05\nadditional_target: embed_tokens\n")
    monkeypatch.chdir(root)
    result = import_file(path)
    t = result.intent.training
    assert (t.lora_rank, t.lora_alpha, t.lora_dropout, t.lora_targets, t.lora_bits) == (16, 32, 0.05, "q_proj,v_proj",
                                                                                        None)
    lines = _lines(result)
    assert lines["lora_rank"].action == "carried" and lines["lora_rank"].target == "training.lora_rank"
    assert lines["lora_target"].where.endswith(":10")
    # a key that changes memory but that dstk cannot price is named, with which way the plan errs
    assert lines["additional_target"].action == "dropped" and "lower bound" in lines["additional_target"].reason
    code, out, err = _run(capsys, ["plan", "--from", str(path), "--gpus", "8", "--top", "1"])
    assert code == 0, err
    assert "LoRA: " in out and "rank 16" in out

    # "all" is every linear module; LLaMA-Factory's defaults: finetuning_type lora, rank 8
    (root / "default.yaml").write_text("model_name_or_path: Qwen/Qwen2.5-7B-Instruct\nstage: sft\n"
                                       "cutoff_len: 1024\nper_device_train_batch_size: 2\nbf16: true\n")
    result = import_file(root / "default.yaml")
    assert (result.intent.training.lora_rank, result.intent.training.lora_targets) == (8, None)
    assert "finetuning_type (absent)" in _lines(result)
    # full fine-tuning stays full, and a LoRA key it carries is said to be unused
    (root / "full.yaml").write_text("model_name_or_path: Qwen/Qwen2.5-7B-Instruct\nfinetuning_type: full\n"
                                    "lora_rank: 8\ncutoff_len: 1024\n")
    result = import_file(root / "full.yaml")
    assert result.intent.training.lora_rank is None
    assert _lines(result)["lora_rank"].action == "dropped"


def test_llamafactory_qlora_and_a_wrong_target_name(tmp_path, monkeypatch, capsys):
    """quantization_bit: 4 (bitsandbytes, LLaMA-Factory's default method) is QLoRA; an 8-bit base is named as
    priced at 16 bits. A misspelt lora_target was written into the intent and refused by `dstk plan` as
    `--lora-targets q_projj`, a flag the user never typed: now the import names the file's line."""
    root, path = _lf_repo(tmp_path, extra="quantization_bit: 4\n")
    monkeypatch.chdir(root)
    path.write_text(path.read_text().replace('deepspeed: examples/deepspeed/ds_z3_config.json', ''))
    assert import_file(path).intent.training.lora_bits == 4
    path.write_text(path.read_text().replace("quantization_bit: 4", "quantization_bit: 8"))
    result = import_file(path)
    assert result.intent.training.lora_bits is None
    assert "16-bit base weights" in _lines(result)["quantization_bit"].reason
    path.write_text(path.read_text().replace("lora_target: all", "lora_target: q_projj,v_proj"))
    code, out, err = _run(capsys, ["import", str(path), "--gpus", "8"])
    assert code == 1
    assert "qwen_lora_sft_ds3.yaml:10: lora_target: q_projj" in err and "q_proj" in err.split("fix:")[1]


AXOLOTL_ZERO3_BF16 = {
    "zero_optimization": {"stage": 3, "overlap_comm": True, "contiguous_gradients": True, "sub_group_size": 0,
                          "reduce_bucket_size": "auto", "prefetch_bucket_size": "auto",
                          "param_persistence_threshold": "auto", "max_live_parameters": 0, "max_reuse_distance": 0,
                          "gather_16bit_weights_on_model_save": True},
    "bf16": {"enabled": True}, "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "wall_clock_breakdown": False,
}


def test_axolotl_lora_and_qlora_are_planned_as_such(tmp_path, capsys):
    """axolotl's lora-8b.yml / qlora.yml (adapter, lora_r, lora_target_linear, load_in_4bit/8bit,
    lora_modules_to_save) were imported as full 16-bit training; lora_modules_to_save, which trains the
    embeddings and lm_head in full, was listed among the keys "with no effect on the plan"."""
    (tmp_path / "deepspeed_configs").mkdir()
    (tmp_path / "deepspeed_configs" / "zero3_bf16.json").write_text(json.dumps(AXOLOTL_ZERO3_BF16))
    lora = {"base_model": "NousResearch/Meta-Llama-3-8B", "model_type": "LlamaForCausalLM", "load_in_8bit": True,
            "load_in_4bit": False, "sequence_len": 4096, "sample_packing": True, "adapter": "lora",
            "lora_model_dir": None, "lora_r": 32, "lora_alpha": 16, "lora_dropout": 0.05, "lora_target_linear": True,
            "lora_modules_to_save": ["embed_tokens", "lm_head"], "gradient_accumulation_steps": 4,
            "micro_batch_size": 2, "num_epochs": 4, "optimizer": "adamw_bnb_8bit", "lr_scheduler": "cosine",
            "learning_rate": 0.0002, "bf16": "auto", "gradient_checkpointing": True, "flash_attention": True,
            "deepspeed": "deepspeed_configs/zero3_bf16.json"}
    (tmp_path / "lora-8b.yml").write_text(yaml.safe_dump(lora, sort_keys=False))
    result = import_file(tmp_path / "lora-8b.yml")
    t = result.intent.training
    assert (t.lora_rank, t.lora_alpha, t.lora_dropout, t.lora_targets, t.lora_bits) == (32, 16, 0.05, "all-linear",
                                                                                        None)
    lines = _lines(result)
    assert "lower bound" in lines["lora_modules_to_save"].reason
    assert "8-bit base" in lines["load_in_8bit"].reason
    code, _, err = _run(capsys, ["import", str(tmp_path / "lora-8b.yml")])
    assert code == 0
    quiet = [line for line in err.splitlines() if "more with no effect on the plan" in line]
    assert quiet and "lora_modules_to_save" not in quiet[0]
    assert "dropped  lora_modules_to_save" in err

    qlora = dict(lora, adapter="qlora", load_in_8bit=False, load_in_4bit=True, lora_target_linear=None,
                 lora_target_modules=["q_proj", "v_proj"], deepspeed=None)
    (tmp_path / "qlora.yml").write_text(yaml.safe_dump(qlora, sort_keys=False))
    t = import_file(tmp_path / "qlora.yml").intent.training
    assert (t.lora_rank, t.lora_targets, t.lora_bits) == (32, "q_proj,v_proj", 4)
    code, out, err = _run(capsys, ["plan", "--from", str(tmp_path / "qlora.yml"), "--gpus", "1", "--gpu", "a100-80gb",
                                   "--top", "1"])
    assert code == 0, err
    assert "QLoRA" in out or "4-bit" in out


def test_accelerate_keys_accelerate_refuses_or_ignores_are_named(tmp_path, capsys):
    """accelerate refuses zero_stage / gradient_accumulation_steps / mixed_precision from the YAML next to
    deepspeed_config_file (ValueError when the plugin is built), refuses an unknown top-level key, and silently
    ignores an unknown deepspeed_config key. The import carried the refused zero_stage (or reported it as
    "agrees"), and called a misspelt key "a launch setting"."""
    (tmp_path / "ds.json").write_text(json.dumps(LF_DS_Z3))
    (tmp_path / "acc.yaml").write_text(
        "debug: false\ndeepspeed_config:\n  deepspeed_config_file: ds.json\n  zero3_init_flag: true\n"
        "  zero_stage: 2\n  gradient_acumulation_steps: 4\ndistributed_type: DEEPSPEED\nmixed_precision: bf16\n"
        "num_machines: 1\nnum_process: 8\nuse_cpu: false\n")
    code, _, err = _run(capsys, ["import", str(tmp_path / "acc.yaml"), "--model", "llama-3-8b", "--format", "json"])
    assert code == 0, err
    capsys.readouterr()
    result = import_file(tmp_path / "acc.yaml", overrides={"model": {"name": "llama-3-8b"}})
    lines = _lines(result)
    assert result.intent.constraints.zero_stage == 3  # the DeepSpeed file's, as accelerate would run once fixed
    refused = lines["deepspeed_config.zero_stage"]
    assert refused.action == "dropped" and "refuses it next to deepspeed_config_file" in refused.reason
    assert "refuses it" in lines["mixed_precision"].reason and result.intent.training.precision == "bf16"
    typo = lines["deepspeed_config.gradient_acumulation_steps"]
    assert typo.action == "dropped" and "did you mean gradient_accumulation_steps?" in typo.reason
    assert "ignores it" in typo.reason
    top = lines["num_process"]
    assert "refuses the file" in top.reason and "did you mean num_processes?" in top.reason
    assert top.where.endswith(":10")
    # without a config file the inline keys are accelerate's own settings and are carried
    (tmp_path / "inline.yaml").write_text(
        "distributed_type: DEEPSPEED\nnum_processes: 8\nmixed_precision: bf16\ndeepspeed_config:\n"
        "  zero_stage: 2\n  gradient_accumulation_steps: 4\n  offload_optimizer_device: cpu\n")
    result = import_file(tmp_path / "inline.yaml", overrides={"model": {"name": "llama-3-8b"}})
    assert result.intent.constraints.zero_stage == 2 and result.intent.constraints.offload_optimizer == "cpu"
    assert "refuses" not in _lines(result)["mixed_precision"].reason


def test_a_deepspeed_path_relative_to_the_repository_root_is_found(tmp_path, monkeypatch, capsys):
    """LLaMA-Factory's YAMLs name examples/deepspeed/ds_z3_config.json relative to the repository root.
    Importing one from any other directory failed ("does not exist"): now the nearest directory above the
    file that has it is used, and the report says to run the tool from there."""
    root, path = _lf_repo(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    result = import_file(path, overrides={"cluster": {"num_nodes": 1, "gpus_per_node": 8}})
    assert result.intent.constraints.zero_stage == 3
    assert result.followed == (str(root / "examples" / "deepspeed" / "ds_z3_config.json"),)
    assert f"run it from {root}" in _lines(result)["deepspeed"].reason
    # from the root itself nothing is said
    monkeypatch.chdir(root)
    assert "run it from" not in _lines(import_file(path))["deepspeed"].reason
    # a path that is nowhere is still an error with the places looked in
    path.write_text(path.read_text().replace("examples/deepspeed/ds_z3_config.json", "examples/ds/none.json"))
    monkeypatch.chdir(elsewhere)
    code, _, err = _run(capsys, ["import", str(path)])
    assert code == 1 and "in the directories above it" in err


def test_generate_from_a_trainer_setup_keeps_the_trainers_optimizer_values(tmp_path, monkeypatch, capsys):
    """A LLaMA-Factory YAML leaves weight decay, Adam betas/eps to TrainingArguments (0.0, 0.9/0.999, 1e-8)
    and its cosine schedule decays to 0. `dstk generate --from` wrote training_args.json with dstk's own
    defaults instead (weight_decay 0.1, adam_beta2 0.95, cosine_with_min_lr at 10%): a different run."""
    root, path = _lf_repo(tmp_path)
    monkeypatch.chdir(root)
    code, _, err = _run(capsys, ["generate", "--from", str(path), "--gpus", "8", "--output", str(tmp_path / "run")])
    assert code == 0, err
    args = json.loads((tmp_path / "run" / "training_args.json").read_text())
    assert (args["weight_decay"], args["adam_beta1"], args["adam_beta2"], args["adam_epsilon"]) == (0.0, 0.9, 0.999,
                                                                                                    1e-8)
    assert args["learning_rate"] == 1e-4
    assert args.get("lr_scheduler_kwargs", {}).get("min_lr_rate", 0.0) == 0.0
    lines = _lines(import_file(path))
    assert lines["training.weight_decay"].action == "assumed"
    assert "TrainingArguments' default" in lines["training.weight_decay"].reason
    # a value the file sets still wins
    path.write_text(path.read_text() + "weight_decay: 0.01\nadam_beta2: 0.95\n")
    t = import_file(path).intent.training
    assert (t.weight_decay, t.betas) == (0.01, (0.9, 0.95))


def test_many_processes_on_one_machine_is_said(tmp_path):
    """LLaMA-Factory's examples/accelerate/ds_multi_nodes.yaml has num_processes: 16 and no num_machines:
    accelerate starts all 16 on one machine unless launched with --num_machines; dstk priced one 16-GPU
    NVLink node without a word."""
    (tmp_path / "ds.json").write_text(json.dumps(LF_DS_Z3))
    (tmp_path / "multi.yaml").write_text(
        "deepspeed_config:\n  deepspeed_config_file: ds.json\n  deepspeed_multinode_launcher: standard\n"
        "  zero3_init_flag: true\ndistributed_type: DEEPSPEED\nnum_processes: 16\nrdzv_backend: c10d\n")
    result = import_file(tmp_path / "multi.yaml", overrides={"model": {"name": "llama-3-8b"}})
    line = _lines(result)["cluster.num_nodes"]
    assert line.action == "assumed" and "--gpus 16 --gpus-per-node 8" in line.reason
    (tmp_path / "multi.yaml").write_text((tmp_path / "multi.yaml").read_text() + "num_machines: 2\n")
    result = import_file(tmp_path / "multi.yaml", overrides={"model": {"name": "llama-3-8b"}})
    assert (result.intent.cluster.num_nodes, result.intent.cluster.gpus_per_node) == (2, 8)


@pytest.mark.parametrize("hf", [True, False])
def test_validate_names_the_stage3_alias_hf_fills(tmp_path, capsys, hf):
    """axolotl's zero3_bf16.json writes prefetch_bucket_size / param_persistence_threshold "auto" without the
    stage3_ prefix: DeepSpeed reads those names, but HF's Trainer fills "auto" only under stage3_..., so
    DeepSpeed drops them to 5e7 / 1e5. validate said "write the value"; the fix is the rename."""
    (tmp_path / "zero3_bf16.json").write_text(json.dumps(AXOLOTL_ZERO3_BF16, indent=2))
    code, out, err = _run(capsys, ["validate", str(tmp_path / "zero3_bf16.json"), *(["--hf"] if hf else [])])
    text = out + err
    assert "zero3_bf16.json:8:5" in text
    assert "rename the key to stage3_prefetch_bucket_size" in text
    assert "rename the key to stage3_param_persistence_threshold" in text
    assert code == (0 if hf else 1)


def test_validate_on_another_tools_yaml_says_which_file_to_validate(tmp_path, monkeypatch, capsys):
    """`dstk validate` on the LLaMA-Factory YAML (the file a user has open) printed 23 DS101 "unknown
    top-level key" errors and a DS008 warning; on axolotl's YAML, "cannot parse as JSON or hjson", fix "fix
    the syntax". Now one finding says what the file is and which DeepSpeed file to validate instead."""
    root, path = _lf_repo(tmp_path)
    monkeypatch.chdir(root)
    code, out, err = _run(capsys, ["validate", str(path), "--format", "json"])
    assert code == 1
    findings = [f for f in json.loads(out)["files"][0]["findings"] if f["code"] != "DS010"]
    assert len(findings) == 1, findings
    assert "LLaMA-Factory" in findings[0]["message"]
    assert "dstk validate examples/deepspeed/ds_z3_config.json --hf;" in findings[0]["hint"]
    axolotl = {"base_model": "NousResearch/Meta-Llama-3-8B", "datasets": [{"path": "tatsu-lab/alpaca",
               "type": "alpaca"}], "sequence_len": 4096, "micro_batch_size": 2, "gradient_accumulation_steps": 4,
               "bf16": "auto", "deepspeed": "deepspeed_configs/zero3_bf16.json"}
    (tmp_path / "fft.yml").write_text(yaml.safe_dump(axolotl, sort_keys=False))
    code, out, err = _run(capsys, ["validate", str(tmp_path / "fft.yml")])
    assert code == 1 and "axolotl YAML" in out + err and "DS001" not in out + err
    assert "dstk validate deepspeed_configs/zero3_bf16.json --hf" in out + err
    (tmp_path / "acc.yaml").write_text("distributed_type: DEEPSPEED\nnum_processes: 8\ndeepspeed_config:\n"
                                       "  deepspeed_config_file: ds_z3.json\n  zero3_init_flag: true\n")
    code, out, err = _run(capsys, ["validate", str(tmp_path / "acc.yaml")])
    assert "accelerate config" in out + err and "dstk validate ds_z3.json --hf" in out + err
    # a DeepSpeed config, even one written in YAML-like hjson or with a Trainer-looking key, is checked as before
    (tmp_path / "ds.json").write_text(json.dumps({"gradient_accumulation_steps": 4, "bf16": {"enabled": True},
                                                  "learning_rate": 1e-4}))
    code, out, err = _run(capsys, ["validate", str(tmp_path / "ds.json")])
    assert "DS202" in out + err and "not a DeepSpeed config" not in out + err


MEGATRON_SCRIPT = """#!/bin/bash
# Runs the "175B" parameter model
export CUDA_DEVICE_MAX_CONNECTIONS=1

GPUS_PER_NODE=8
# Change for multinode config
MASTER_ADDR=localhost
NUM_NODES=16
CHECKPOINT_PATH=$1 #<Specify path>

DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NUM_NODES
    --master_addr $MASTER_ADDR
)

GPT_MODEL_ARGS=(
    --num-layers 96
    --hidden-size 12288
    --num-attention-heads 96
    --seq-length 2048
    --attention-backend auto # Can use (flash/fused/unfused/local)
)

TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 1536
    --train-iters 500000
    --fp16
    --lr 6.0e-5
    --min-lr 6.0e-6
)

MODEL_PARALLEL_ARGS=(
\t--tensor-model-parallel-size 8
\t--pipeline-model-parallel-size 16
)

torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py \\
    ${GPT_MODEL_ARGS[@]} \\
    ${TRAINING_ARGS[@]} \\
    ${MODEL_PARALLEL_ARGS[@]} \\
    --save $CHECKPOINT_PATH
"""


def test_megatron_launch_script_with_shell_arrays(tmp_path, capsys):
    """Megatron-LM's examples/gpt3/train_gpt3_175b_distributed.sh keeps its flags in bash arrays and the GPU
    count in variables. The import stopped at `--nproc_per_node is '$GPUS_PER_NODE': expected a number`
    (and would have read every array flag as a launcher setting, before pretrain_gpt.py); the fix it then
    gave, --vocab-size N on the command line, failed too ("a model needs a name ... missing num_layers")."""
    (tmp_path / "train.sh").write_text(MEGATRON_SCRIPT)
    result = import_file(tmp_path / "train.sh", overrides={"model": {"vocab_size": 50257}})
    i = result.intent
    assert (i.model.num_layers, i.model.hidden_size, i.model.num_heads, i.model.vocab_size) == (96, 12288, 96, 50257)
    assert (i.cluster.num_nodes, i.cluster.gpus_per_node) == (16, 8)
    assert (i.constraints.tp, i.constraints.pp, i.constraints.micro_batch) == (8, 16, 1)
    assert (i.training.global_batch, i.training.precision, i.training.seq_len) == (1536, "fp16", 2048)
    lines = _lines(result)
    assert lines["--num-layers"].where.endswith("train.sh:18")
    assert lines["--save"].action == "dropped"  # an unset $1 stays a word, not an error
    code, out, err = _run(capsys, ["plan", "--from", str(tmp_path / "train.sh"), "--vocab-size", "50257",
                                   "--gpu", "a100-80gb", "--top", "1"])
    assert code == 0, err
    assert "tp=8" in out and "pp=16" in out
    # a flag for the GPUs wins over the script's, and the script's are named as dropped
    result = import_file(tmp_path / "train.sh", overrides={"model": {"vocab_size": 50257},
                                                           "cluster": {"num_nodes": 32, "gpus_per_node": 8}})
    assert _lines(result)["--nnodes"].action == "dropped"
    # an environment prefix on the command line is not an assignment line: the command stays
    (tmp_path / "run.sh").write_text("GPUS=4\nCUDA_VISIBLE_DEVICES=0,1,2,3 torchrun --nproc_per_node $GPUS run_clm.py \\\n"
                                     "  --model_name_or_path gpt2 --per_device_train_batch_size 8 --block_size 512\n")
    i = import_file(tmp_path / "run.sh").intent
    assert (i.cluster.gpus_per_node, i.constraints.micro_batch, i.training.seq_len) == (4, 8, 512)


def test_accelerate_template_auto_scheduler_values_are_reported_once(tmp_path):
    """accelerate's examples/deepspeed_config_templates/zero_stage3_offload_config.json (WarmupDecayLR with
    every parameter "auto"), named by config_yaml_templates/deepspeed.yaml as ../deepspeed_config_templates/...:
    warmup_num_steps and total_num_steps were each reported as dropped twice."""
    (tmp_path / "templates").mkdir()
    (tmp_path / "yaml").mkdir()
    (tmp_path / "templates" / "z3_offload.json").write_text(json.dumps({
        "fp16": {"enabled": True, "loss_scale": 0},
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}},
        "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                          "warmup_num_steps": "auto", "total_num_steps": "auto"}},
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                              "offload_param": {"device": "cpu", "pin_memory": True}},
        "gradient_accumulation_steps": 1, "gradient_clipping": "auto", "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto"}, indent=4))
    (tmp_path / "yaml" / "deepspeed.yaml").write_text(
        "distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: ../templates/z3_offload.json\n"
        "  zero3_init_flag: false # true\nnum_processes: 2\n")
    result = import_file(tmp_path / "yaml" / "deepspeed.yaml", overrides={"model": {"name": "llama-3.2-1b"}})
    keys = [line.key for line in result.lines]
    assert keys.count("scheduler.params.warmup_num_steps") == 1
    assert keys.count("scheduler.params.total_num_steps") == 1
    c = result.intent.constraints
    assert (c.zero_stage, c.offload_optimizer, c.offload_params) == (3, "cpu", "cpu")
    assert result.intent.training.precision == "fp16"
