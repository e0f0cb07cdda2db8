"""``dstk estimate --config``: a DeepSpeed config read as DeepSpeed reads it, and generated configs
that carry explicit bucket sizes whose estimate is the plan's own figure.

Oracles: DeepSpeed's own ``DeepSpeedZeroConfig`` for every ZeRO knob and its defaults,
transformers' ``HfTrainerDeepSpeedConfig`` for the "auto" fill, ``DeepSpeedConfig`` for the batch
triad, and the planner's figure for the generated files.
"""

from __future__ import annotations

import json

import pytest
from test_generate_oracles import ds_parse  # noqa: F401  (a fixture: DeepSpeedConfig at a chosen dp)

from dstk.cli import main
from dstk.estimate import ZeroBuffers, estimate, rank_params
from dstk.estimate.buckets import MEMORY_FRACTION, choose_buffers, latency_bandwidth_elements
from dstk.estimate.dsconfig import read_settings, to_layout
from dstk.layout import Layout, Training

TINY = ("model:\n  num_layers: 2\n  hidden_size: 64\n  num_heads: 4\n  num_kv_heads: 2\n  ffn_hidden_size: 128\n"
        "  vocab_size: 512\ncluster: {num_nodes: 1, gpus_per_node: 2, gpu: cpu}\n"
        "training: {seq_len: 64, global_batch: 8, precision: bf16}\n")

FIELDS = ("reduce_bucket_size", "allgather_bucket_size", "overlap_comm", "contiguous_gradients",
          "prefetch_bucket_size", "param_persistence_threshold", "max_live_parameters", "max_reuse_distance",
          "reduce_scatter", "use_multi_rank_bucket_allreduce")

USER_CONFIGS = [  # as users write them: stage, precision, optimizer, micro-batch; DeepSpeed's defaults for the rest
    {"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True}, "zero_optimization": {"stage": stage},
     "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}} for stage in (0, 1, 2, 3)
] + [
    {"train_batch_size": 32, "gradient_accumulation_steps": 2, "fp16": {"enabled": True},
     "zero_optimization": {"stage": 2, "overlap_comm": False, "contiguous_gradients": False,
                           "reduce_bucket_size": 2e8, "allgather_bucket_size": 3e8}},
    {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {
        "stage": 3, "overlap_comm": False, "reduce_bucket_size": 1.5e7, "stage3_prefetch_bucket_size": 7e6,
        "stage3_param_persistence_threshold": 4e4, "stage3_max_live_parameters": 3e8, "stage3_max_reuse_distance": 2e8,
        "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "nvme", "nvme_path": "/x"}}},
    {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {
        "stage": 2, "use_multi_rank_bucket_allreduce": False}},
    {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 1, "reduce_scatter": False}},
    {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {  # the unprefixed aliases
        "stage": 3, "prefetch_bucket_size": 11, "param_persistence_threshold": 12, "max_live_parameters": 13,
        "max_reuse_distance": 14}},
]


@pytest.fixture(scope="module")
def deepspeed_zero():
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    return DeepSpeedZeroConfig


def _buffers_as_deepspeed_reads(zero_config_cls, zero: dict) -> dict:
    parsed = zero_config_cls(**zero)
    return {f: getattr(parsed, f) for f in FIELDS}


@pytest.mark.parametrize("config", USER_CONFIGS, ids=lambda c: json.dumps(c["zero_optimization"])[:60])
def test_every_zero_knob_and_default_is_what_deepspeed_reads(config, deepspeed_zero):
    settings = read_settings(config)
    ds = _buffers_as_deepspeed_reads(deepspeed_zero, config["zero_optimization"])
    ours = {f: getattr(settings.buffers, f) for f in FIELDS}
    ours["overlap_comm"] = settings.buffers.overlaps(settings.zero_stage)
    assert ours == ds
    parsed = deepspeed_zero(**config["zero_optimization"])
    assert settings.zero_stage == int(parsed.stage)
    assert settings.offload_optimizer == _device(parsed.offload_optimizer)
    assert settings.offload_params == _device(parsed.offload_param)


def _device(block) -> str:
    if block is None:
        return "none"
    return getattr(block.device, "value", block.device)


def test_deprecated_cpu_offload_and_old_bf16_key(deepspeed_zero):
    config = {"train_micro_batch_size_per_gpu": 1, "bfloat16": {"enabled": True},
              "zero_optimization": {"stage": 2, "cpu_offload": True}}
    s = read_settings(config)
    assert s.offload_optimizer == _device(deepspeed_zero(**config["zero_optimization"]).offload_optimizer) == "cpu"
    assert s.precision == "bf16"
    assert any("deprecated" in n for n in s.notes)


@pytest.mark.parametrize("block, expected", [
    (None, None), ({"type": "AdamW"}, "adamw"), ({"type": "adam"}, "adamw"),
    ({"type": "Adam", "params": {"adam_w_mode": False}}, "adam"), ({"type": "Lion"}, "lion"), ({"type": "SGD"}, "sgd"),
    ({"type": "Adafactor"}, "adafactor"), ({"type": "Lamb"}, "adamw"), ({"type": "Adagrad"}, "sgd"),
])
def test_optimizer_and_precision(block, expected):
    config = {"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": True}}
    if block:
        config["optimizer"] = block
    s = read_settings(config)
    assert s.optimizer == expected and s.precision == "fp16"
    assert read_settings({"train_micro_batch_size_per_gpu": 1}).precision == "fp32"


def test_auto_is_filled_as_transformers_fills_it(tmp_path):
    from types import SimpleNamespace

    from transformers import TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=2, gradient_accumulation_steps=3,
                             bf16=True, use_cpu=True, report_to=[])
    model = SimpleNamespace(config=SimpleNamespace(hidden_size=96))
    for stage in (1, 2, 3):
        config = {"train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto",
                  "gradient_accumulation_steps": "auto", "bf16": {"enabled": "auto"},
                  "zero_optimization": {"stage": stage, "reduce_bucket_size": "auto",
                                        "stage3_prefetch_bucket_size": "auto",
                                        "stage3_param_persistence_threshold": "auto"}}
        hf = HfTrainerDeepSpeedConfig(json.loads(json.dumps(config)))
        hf.trainer_config_process(args)
        hf.trainer_config_finalize(args, model, 10)
        ours = read_settings(config, hidden_size=96)
        filled = hf.config["zero_optimization"]
        if stage < 3:  # transformers leaves the stage-3 keys "auto"; DeepSpeed then drops them
            filled = {k: v for k, v in filled.items() if v != "auto"}
        assert ours.buffers == read_settings({**hf.config, "zero_optimization": filled}).buffers
        assert ours.buffers.reduce_bucket_size == 96 * 96
        assert ours.precision is None and ours.micro_batch is None and ours.train_batch is None
        layout, precision, _, notes = to_layout(ours, world_size=1, flags={"micro_batch": 2, "precision": "bf16"},
                                                fallback={"global_batch": 6})
        assert (layout.micro_batch, layout.grad_accum, precision) == (2, 3, "bf16")
        assert any("transformers" in n for n in notes)


@pytest.mark.parametrize("keys, dp", [
    ({"train_batch_size": 48, "train_micro_batch_size_per_gpu": 3}, 4),
    ({"train_batch_size": 48, "gradient_accumulation_steps": 2}, 4),
    ({"train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 2}, 4),
    ({"train_batch_size": 48}, 8),
    ({"train_micro_batch_size_per_gpu": 5}, 2),
    ({"train_batch_size": 24, "train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 2}, 4),
])
def test_batch_triad_is_derived_as_deepspeed_derives_it(keys, dp, ds_parse):
    parsed = ds_parse(dict(keys), dp=dp)
    layout, *_ = to_layout(read_settings(keys), world_size=dp, flags={})
    assert (layout.micro_batch, layout.grad_accum, layout.global_batch) == (
        parsed.train_micro_batch_size_per_gpu, parsed.gradient_accumulation_steps, parsed.train_batch_size)


# --- errors: clear, located, with a fix, exit 1, no traceback ----------------------------------


def _run(tmp_path, capsys, text: str, *flags: str) -> tuple[int, str, str]:
    path = tmp_path / "ds.json"
    path.write_text(text)
    intent = tmp_path / "intent.yaml"
    intent.write_text(TINY)
    code = main(["estimate", "--config", str(path), "--intent", str(intent), *flags])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


BASE = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4, "bf16": {"enabled": True},
        "zero_optimization": {"stage": 3}}


@pytest.mark.parametrize("flags, named", [
    (["--zero", "2"], ["--zero 2", "3", "/zero_optimization/stage"]),
    (["--precision", "fp16"], ["--precision fp16", "bf16", "/bf16/enabled"]),
    (["--micro-batch", "2"], ["--micro-batch 2", "1", "/train_micro_batch_size_per_gpu"]),
    (["--offload-optimizer", "cpu"], ["--offload-optimizer cpu", "none"]),
    (["--tp", "2"], ["--tp 2", "no AutoTP"]),
])
def test_a_flag_that_contradicts_the_file_is_an_error_naming_both(tmp_path, capsys, flags, named):
    code, _, err = _run(tmp_path, capsys, json.dumps(BASE), *flags)
    assert code == 1
    assert all(n in err for n in named), err
    assert "fix:" in err


def test_agreeing_flags_are_fine_and_the_intent_fills_only_what_the_file_leaves(tmp_path, capsys):
    code, out, _ = _run(tmp_path, capsys, json.dumps(BASE), "--zero", "3", "--micro-batch", "1", "--format", "json")
    assert code == 0
    d = json.loads(out)
    assert d["layout"]["zero_stage"] == 3 and d["layout"]["grad_accum"] == 4 and d["training"]["precision"] == "bf16"
    fp32 = {k: v for k, v in BASE.items() if k != "bf16"}
    code, out, _ = _run(tmp_path, capsys, json.dumps(fp32), "--format", "json")
    d = json.loads(out)
    assert code == 0 and d["training"]["precision"] == "fp32"  # what DeepSpeed runs, not the intent's bf16
    assert any("intent says precision bf16" in n for n in d["config"]["notes"])


@pytest.mark.parametrize("text, words", [
    ('{"train_batch_size": 12, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4}',
     ["12 != 1 x 4 x 2", "train_batch_size 8"]),
    ('{"train_batch_size": 7, "train_micro_batch_size_per_gpu": 2}', ["not a multiple", "2 x 2"]),
    ('{"gradient_accumulation_steps": 4, "zero_optimization": {"stage": 1}}', ["no batch size"]),
    ('{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 5}}', ["stage is 5", ":1:"]),
    ('{"train_micro_batch_size_per_gpu": 1,\n "zero_optimization": {"stage": 2, "reduce_bucket_size": "big"}}',
     ["reduce_bucket_size is 'big'", ":2:", "whole number"]),
    ('{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"reduce_bucket_size": 0}}', ["at least 1"]),
    ('{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"overlap_comm": "yes"}}', ["true or false"]),
    ('{"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "sgd"}}', ['"type": "SGD"']),
    ('{"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "Adamm"}}', ["Adamm", "fail at initialize"]),
    ('{"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true}, "fp16": {"enabled": true}}', ["both"]),
    ('{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, "offload_param": {"device": "gpu"}}}',
     ["offload_param.device is 'gpu'"]),
    ('{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 1, "offload_param": {"device": "cpu"}}}',
     ["offload_params: needs ZeRO stage 3"]),
    ('{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": "auto"}}', ["no --zero"]),
    ('{"train_micro_batch_size_per_gpu": 1, "tensor_parallel": {"autotp_size": 3}}', ["autotp_size 3"]),
    ('{"train_micro_batch_size_per_gpu": 1, "zero_optimization": [1]}', ["not an object"]),
    ('{"train_micro_batch_size_per_gpu": 1, "train_micro_batch_size_per_gpu": 2}', ["duplicate key"]),
    ('{"train_micro_batch_size_per_gpu": 1,', ["cannot parse"]),
    ("[1, 2]", ["top level"]),
])
def test_bad_input_is_a_clear_located_error(tmp_path, capsys, text, words):
    code, _, err = _run(tmp_path, capsys, text)
    assert code == 1, err
    assert all(w in err for w in words), err
    assert "fix:" in err and "ds.json" in err


def test_auto_bucket_without_a_hidden_size_is_an_error(tmp_path, capsys):
    path = tmp_path / "ds.json"
    path.write_text('{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2, '
                    '"reduce_bucket_size": "auto"}}')
    assert main(["estimate", "--config", str(path), "--params", "1e9", "--gpus", "8"]) == 1
    err = capsys.readouterr().err
    assert "hidden_size" in err and "/zero_optimization/reduce_bucket_size" in err


def test_a_missing_file_is_a_usage_error(tmp_path, capsys):
    assert main(["estimate", "--config", str(tmp_path / "nope.json"), "--model", "gpt2", "--gpus", "2"]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_hjson_and_typos_are_reported_not_ignored(tmp_path, capsys):
    text = ('{\n  // a comment, as DeepSpeed allows\n  "train_micro_batch_size_per_gpu": 1,\n'
            '  "zero_optimisation": {"stage": 2},\n}')
    code, out, _ = _run(tmp_path, capsys, text, "--format", "json")
    assert code == 0
    d = json.loads(out)
    notes = " ".join(d["config"]["notes"])
    assert "hjson" in notes and "zero_optimisation" in notes and d["layout"]["zero_stage"] == 0


# --- the buffers by name ---------------------------------------------------------------------


def test_the_output_names_the_reduce_bucket(tmp_path, capsys):
    config = {"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True},
              "zero_optimization": {"stage": 2, "overlap_comm": True}}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config))
    assert main(["estimate", "--config", str(path), "--model", "llama-3-8b", "--gpus", "8"]) == 0
    out = capsys.readouterr().out
    assert "reduce bucket" in out and "1.86 GiB" in out and "overlap_comm" in out


def test_the_config_buffers_reach_the_estimate(tmp_path, capsys):
    """A bigger bucket in the file is a bigger figure: the parsed buffers are what is priced (on the
    tiny model the bucket is the peak's largest term)."""
    intent = tmp_path / "intent.yaml"
    intent.write_text(TINY)
    totals = []
    for size in (1e6, 2e8):
        config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4, "bf16": {"enabled": True},
                  "zero_optimization": {"stage": 2, "overlap_comm": True, "reduce_bucket_size": size}}
        path = tmp_path / "ds.json"
        path.write_text(json.dumps(config))
        assert main(["estimate", "--config", str(path), "--intent", str(intent), "--format", "json"]) == 0
        d = json.loads(capsys.readouterr().out)
        assert d["config"]["buffers"]["reduce_bucket_size"] == size
        totals.append(d["memory"]["per_gpu"]["total_bytes"])
    assert totals[1] - totals[0] >= 2 * 2 * (2e8 - 1e6) * 0.99


# --- generated configs: explicit buckets, and the plan's figure is the file's estimate ----------


GENERATED = {  # name -> (dstk generate flags, what dstk estimate needs besides the file: the stages)
    "zero0": (["--zero", "0"], []), "zero1": (["--zero", "1"], []), "zero2": (["--zero", "2"], []),
    "zero3": (["--zero", "3"], []), "zero2-offload": (["--zero", "2", "--offload-optimizer", "cpu"], []),
    "zero3-offload": (["--zero", "3", "--offload-optimizer", "cpu", "--offload-params", "cpu"], []),
    "autotp2": (["--tp", "2", "--zero", "1"], []), "pp2": (["--pp", "2", "--zero", "1"], ["--pp", "2"]),
}


@pytest.mark.parametrize("name", GENERATED)
def test_estimate_of_the_generated_config_is_the_plans_figure(tmp_path, capsys, name, ds_parse):
    flags, needs = GENERATED[name]
    zero = int(flags[flags.index("--zero") + 1])
    intent = tmp_path / "intent.yaml"
    intent.write_text(TINY)
    out_dir = tmp_path / "run"
    assert main(["generate", str(intent), *flags, "-o", str(out_dir)]) == 0
    capsys.readouterr()
    plan = json.loads((out_dir / "plan.json").read_text())
    ds = json.loads((out_dir / "ds_config.json").read_text())
    hf = json.loads((out_dir / "ds_config.hf.json").read_text())
    if zero:
        zero_block = ds["zero_optimization"]
        assert {"reduce_bucket_size", "allgather_bucket_size", "overlap_comm"} <= set(zero_block)
        assert zero_block["reduce_bucket_size"] <= 2e5  # the tiny model has ~1.4e5 parameters per GPU
        assert all(hf["zero_optimization"][k] == v for k, v in zero_block.items())  # no "auto" buckets
        if plan["layout"]["tp"] == 1:
            ds_parse(ds, dp=plan["layout"]["dp"])
    hf_flags = ["--micro-batch", str(plan["layout"]["micro_batch"])]  # "auto" there: TrainingArguments decides
    for file, extra in (("ds_config.json", []), ("ds_config.hf.json", hf_flags)):
        assert main(["estimate", "--config", str(out_dir / file), "--intent", str(intent), *needs, *extra,
                     "--format", "json"]) == 0
        d = json.loads(capsys.readouterr().out)
        assert d["layout"] == plan["layout"], file
        assert d["memory"] == {k: plan["memory"][k] for k in d["memory"]}, file  # the plan adds host checks
    if zero:
        assert any("reduce_bucket_size" in line for line in plan["why"])


def test_a_user_config_with_defaults_costs_more_than_the_generated_one(tmp_path, capsys):
    """The default 5e8 bucket, doubled by overlap_comm, is what the generated config avoids."""
    intent = tmp_path / "intent.yaml"
    intent.write_text(TINY)
    user = tmp_path / "user.json"
    user.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4,
                                "bf16": {"enabled": True}, "zero_optimization": {"stage": 2, "overlap_comm": True},
                                "optimizer": {"type": "AdamW"}}))
    assert main(["estimate", "--config", str(user), "--intent", str(intent), "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["memory"]["per_gpu"]["buffers_bytes"] >= 2 * 5e8 * 2


# --- choose_buffers --------------------------------------------------------------------------


def _cluster(gpu: str, nodes: int, per_node: int = 8, net: str = "ib-ndr"):
    from dstk.hardware import Cluster, get_gpu, get_interconnect

    return Cluster(num_nodes=nodes, gpus_per_node=per_node, gpu=get_gpu(gpu), interconnect=get_interconnect(net))


@pytest.mark.parametrize("model_name, gpu, nodes, zero", [
    ("llama-3-8b", "h100-sxm", 8, 2), ("llama-3-8b", "h100-sxm", 1, 1), ("llama-3-70b", "h100-sxm", 16, 3),
    ("gpt2", "a100-40gb", 1, 2), ("llama-3-8b", "h100-sxm", 4, 3),
])
def test_chosen_buckets_are_bounded_by_the_model_and_the_gpu(model_name, gpu, nodes, zero):
    from dstk.estimate import _bandwidth
    from dstk.models import get_model

    model = get_model(model_name)
    cluster = _cluster(gpu, nodes)
    layout = Layout(dp=cluster.world_size, zero_stage=zero)
    training = Training(seq_len=2048, global_batch=cluster.world_size)
    buffers, why = choose_buffers(model=model, layout=layout, training=training, cluster=cluster)
    params = rank_params(model, layout)
    bw, lat = _bandwidth(group=layout.dp, stride=1, cluster=cluster)
    floor = latency_bandwidth_elements(ranks=layout.dp, latency_s=lat, bytes_per_s=bw, element_bytes=2)
    assert buffers.reduce_bucket_size <= params
    assert buffers.reduce_bucket_size * 2 <= MEMORY_FRACTION * cluster.gpu.memory_bytes
    assert buffers.reduce_bucket_size >= min(floor, 0.9 * params, 0.9 * MEMORY_FRACTION * cluster.gpu.memory_bytes / 2)
    assert buffers.allgather_bucket_size % 2 == 0 and buffers.overlaps(zero) == (zero >= 2)
    assert why and f"{buffers.reduce_bucket_size:.2g}".replace("e+0", "e").replace("e+", "e") in why[0]
    if zero == 3:
        assert buffers.param_persistence_threshold == 10 * model.hidden_size
        assert buffers.max_live_parameters <= max(params, 2) * 1.01 + 1
        assert buffers.max_live_parameters < ZeroBuffers().max_live_parameters or params > 1e9
        assert buffers.max_reuse_distance == buffers.max_live_parameters


def test_a_tiny_model_gets_a_bucket_no_larger_than_itself():
    from dstk.models.spec import ModelSpec

    model = ModelSpec.generic(num_layers=2, hidden_size=64, num_heads=4, vocab_size=512, ffn_hidden_size=128,
                              num_kv_heads=2)
    cluster = _cluster("h100-sxm", 4)  # a slow multi-node ring would want a large bucket
    layout = Layout(dp=32, zero_stage=2)
    buffers, why = choose_buffers(model=model, layout=layout, training=Training(seq_len=64, global_batch=32),
                                  cluster=cluster)
    params = rank_params(model, layout)
    assert params * 0.9 <= buffers.reduce_bucket_size <= params
    assert "capped by all" in why[0]
    est = estimate(model=model, layout=layout, training=Training(seq_len=64, global_batch=32), cluster=cluster,
                   buffers=buffers)
    default = estimate(model=model, layout=layout, training=Training(seq_len=64, global_batch=32), cluster=cluster)
    assert est.memory.per_gpu.buffers_bytes <= default.memory.per_gpu.buffers_bytes


def test_plan_generate_and_explain_name_the_buffers(tmp_path, capsys):
    """The estimate's named buffer terms (``MemoryBreakdown.buffers``, in plan.json as dicts) are
    printed by name wherever a plan is shown."""
    import io

    from rich.console import Console

    from dstk import explain
    from dstk.commands.estimate import buffer_terms

    term = {"name": "reduce bucket", "bytes": 2 * 5e8 * 2, "formula": "2 x 5e8 x 2 B", "device": "gpu",
            "phase": "backward"}
    assert buffer_terms({"buffers": [term]}) == ["  reduce bucket: 2 x 5e8 x 2 B = 1.86 GiB (gpu, backward)"]
    intent = tmp_path / "intent.yaml"
    intent.write_text(TINY)
    assert main(["generate", str(intent), "--zero", "2", "-o", str(tmp_path / "run")]) == 0
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    real = plan["memory"]["per_gpu"]["buffers"]
    assert real and f"  {real[0]['name']}: " in capsys.readouterr().out  # generate prints the estimate's terms
    assert main(["plan", str(intent), "--zero", "2", "--top", "1"]) == 0
    assert f"  {real[0]['name']}: " in capsys.readouterr().out
    plan["memory"]["per_gpu"]["buffers"] = [term]
    out = io.StringIO()
    explain.render_text(explain.report(plan), console=Console(file=out, width=200))
    assert "reduce bucket: 2 x 5e8 x 2 B = 1.86 GiB" in out.getvalue()
    assert any("reduce_bucket_size" in line for line in plan["why"])


def test_estimate_config_does_not_import_the_heavy_stack(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "ds.json"
    path.write_text(json.dumps(USER_CONFIGS[2]))
    code = (f"import sys; from dstk.cli import main; main(['estimate', '--config', {str(path)!r}, '--model', "
            "'llama-3-8b', '--gpus', '8']); print([m for m in ('torch', 'deepspeed', 'transformers') "
            "if m in sys.modules], file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "reduce bucket" in out.stdout
    assert out.stderr.strip().splitlines()[-1] == "[]"


def test_hardware_applies_over_an_intent(tmp_path, capsys):
    """`dstk estimate --intent FILE --hardware PROFILE` (a calibrated profile) uses the profile."""
    from pathlib import Path

    intent = Path(__file__).parent.parent / "examples" / "intents" / "tiny-llama-cpu.yaml"
    hw = tmp_path / "hw.yaml"
    hw.write_text("gpus:\n  cpu: {memory_gib: 1}\n")
    assert main(["estimate", "--intent", str(intent), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["cluster"]["gpu_memory_bytes"] == 8 * 2**30
    assert main(["estimate", "--intent", str(intent), "--hardware", str(hw), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["cluster"]["gpu_memory_bytes"] == 2**30


def test_a_file_written_for_the_trainer_is_read_in_hf_mode():
    """`estimate --config` and `upgrade` check a config in HF mode when any value is "auto"."""
    from dstk.validate.source import has_auto

    assert has_auto({"zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}})
    assert has_auto({"optimizer": {"params": {"betas": ["auto", 0.99]}}})
    assert not has_auto({"zero_optimization": {"stage": 2, "reduce_bucket_size": 5e8}, "note": "automatic"})
