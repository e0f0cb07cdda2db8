"""The renderer on its own: DeepSpeed JSON accepted by DeepSpeed at the layout's data-parallel
size, Megatron arguments accepted by megatron-core, uneven stages, atomic writes."""

from __future__ import annotations

import json

import pytest
from test_generate_oracles import ds_parse, megatron_config  # noqa: F401  (ds_parse is a fixture)

from dstk import render
from dstk.errors import DstkError, UsageError
from dstk.intent import TrainingIntent
from dstk.layout import Layout

DIMS = render.ModelDims(num_layers=30, hidden_size=256, num_heads=8, num_kv_heads=2, ffn_hidden_size=688,
                        vocab_size=1000)
LAYOUTS = [
    Layout(dp=8, zero_stage=0, micro_batch=4, grad_accum=2),
    Layout(dp=8, zero_stage=1, micro_batch=2, grad_accum=4),
    Layout(dp=4, tp=2, zero_stage=2, micro_batch=2, grad_accum=8, recompute="selective"),
    Layout(dp=8, zero_stage=3, offload_optimizer="cpu", offload_params="cpu", micro_batch=1, grad_accum=8,
           recompute="full"),
    Layout(dp=2, tp=2, pp=4, zero_stage=1, micro_batch=1, grad_accum=32, recompute="full"),
    Layout(dp=1, tp=4, pp=3, zero_stage=0, micro_batch=1, grad_accum=64, sequence_parallel=True),
    Layout(dp=2, tp=2, pp=2, zero_stage=1, micro_batch=2, grad_accum=16, virtual_stages=3,
           sequence_parallel=True, recompute="selective"),
]


@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda l: f"dp{l.dp}tp{l.tp}pp{l.pp}z{l.zero_stage}")
def test_ds_config_is_accepted_by_deepspeed_at_the_plan_dp(layout, precision, ds_parse):
    training = TrainingIntent(precision=precision, train_steps=50, warmup_steps=100)
    config = render.ds_config(layout=layout, training=training)
    parsed = ds_parse(config, dp=layout.dp)
    assert parsed.train_batch_size == layout.global_batch
    assert parsed.train_micro_batch_size_per_gpu == layout.micro_batch
    assert parsed.gradient_accumulation_steps == layout.grad_accum
    assert parsed.zero_optimization_stage == layout.zero_stage
    assert parsed.bfloat16_config.enabled == (precision == "bf16")
    assert parsed.float16_config.enabled == (precision == "fp16")
    assert parsed.zero_config.offload_optimizer is None or parsed.zero_config.offload_optimizer.device == "cpu"
    assert config["scheduler"]["params"]["warmup_num_steps"] == 50  # clipped to the run's length
    assert ("pipeline" in config) == (layout.pp > 1)
    assert config.get("tensor_parallel", {}).get("autotp_size", 1) == layout.tp


def test_a_wrong_dp_is_caught_by_deepspeed(ds_parse):
    config = render.ds_config(layout=LAYOUTS[1], training=TrainingIntent())
    with pytest.raises(AssertionError):
        ds_parse(config, dp=4)


@pytest.mark.parametrize("optimizer", ["adamw", "adam", "sgd", "lion", "adafactor"])
def test_optimizer_blocks(optimizer, ds_parse):
    training = TrainingIntent(optimizer=optimizer, schedule="linear")
    config = render.ds_config(layout=Layout(dp=2, zero_stage=2), training=training, torch_adam=True)
    ds_parse(config, dp=2)
    opt = config["optimizer"]
    assert opt["type"] == {"adamw": "AdamW", "adam": "Adam", "sgd": "SGD", "lion": "Lion",
                           "adafactor": "Adafactor"}[optimizer]
    assert (opt["params"].get("adam_w_mode") is False) == (optimizer == "adam")
    assert config.get("zero_allow_untested_optimizer", False) == (optimizer in ("sgd", "adafactor"))
    assert config["scheduler"]["type"] == "WarmupDecayLR"


def test_hf_config_has_auto_exactly_where_hf_fills():
    config = render.ds_config(layout=Layout(dp=2, zero_stage=3), training=TrainingIntent(), hf=True)
    assert "optimizer" not in config and "scheduler" not in config  # the Trainer's optim / lr_scheduler_type rule
    autos = sorted(_pointers(config, "auto"))
    assert autos == sorted([
        "/bf16/enabled", "/gradient_accumulation_steps", "/gradient_clipping", "/train_batch_size",
        "/train_micro_batch_size_per_gpu", "/zero_optimization/reduce_bucket_size",
        "/zero_optimization/stage3_param_persistence_threshold", "/zero_optimization/stage3_prefetch_bucket_size",
    ])


def _pointers(node, value, prefix=""):
    if node == value:
        yield prefix
    elif isinstance(node, dict):
        for k, v in node.items():
            yield from _pointers(v, value, f"{prefix}/{k}")


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda l: f"dp{l.dp}tp{l.tp}pp{l.pp}v{l.virtual_stages}")
def test_megatron_args_are_accepted_by_megatron_core(layout):
    training = TrainingIntent(seq_len=1024)
    args = render.megatron_args(layout=layout, training=training, model=DIMS)
    config, opts = megatron_config(args)
    assert config.tensor_model_parallel_size == layout.tp
    assert config.pipeline_model_parallel_size == layout.pp
    assert config.num_query_groups == 2 and config.gated_linear_unit and config.normalization == "RMSNorm"
    assert config.sequence_parallel == layout.sequence_parallel
    assert int(opts["--global-batch-size"]) == layout.global_batch
    assert int(opts["--micro-batch-size"]) == layout.micro_batch
    assert ("--use-distributed-optimizer" in opts) == (layout.zero_stage >= 1)
    if layout.virtual_stages > 1:
        assert config.virtual_pipeline_model_parallel_size == layout.virtual_stages
    if layout.pp > 1:  # uneven: 30 layers on 4 stages -> 7, 8, 8, 7 (first/last lighter)
        first = config.num_layers_in_first_pipeline_stage or 30 // layout.pp
        assert first == render.stage_layers(30, layout.pp)[0]


def test_megatron_core_rejects_what_the_renderer_must_not_write():
    """The oracle can fail: a TP degree that does not divide the heads is refused."""
    args = render.megatron_args(layout=Layout(dp=1, tp=3), training=TrainingIntent(), model=DIMS)
    with pytest.raises(Exception):
        megatron_config(args)


def test_megatron_args_round_trip_through_the_file():
    args = render.megatron_args(layout=LAYOUTS[4], training=TrainingIntent(), model=DIMS)
    text = "\n".join(args) + "\n"
    items = render.read_megatron_args(text)
    assert items[:4] == ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "4"]


@pytest.mark.parametrize("layers, stages", [(32, 4), (30, 4), (5, 2), (81, 8), (7, 7), (10, 3), (13, 5)])
def test_stage_layers_cover_every_layer_with_even_middles(layers, stages):
    split = render.stage_layers(layers, stages)
    assert sum(split) == layers and len(split) == stages and min(split) >= 1
    assert len(set(split[1:-1])) <= 1
    assert max(split) - min(split) <= max(1, -(-layers // stages))


def test_stage_layers_refuses_more_stages_than_layers():
    with pytest.raises(ValueError, match="num_stages"):
        render.stage_layers(3, 4)


def test_write_files_is_atomic_and_refuses_to_overwrite(tmp_path):
    out = tmp_path / "run"
    render.write_files(out, {"a.json": "{}\n", "b.txt": "x\n"}, force=False)
    assert sorted(p.name for p in out.iterdir()) == ["a.json", "b.txt"]
    with pytest.raises(UsageError, match="not empty") as exc:
        render.write_files(out, {"a.json": "[]\n"}, force=False)
    assert "--force" in exc.value.hint
    assert json.loads((out / "a.json").read_text()) == {}
    render.write_files(out, {"a.json": "[]\n"}, force=True)
    assert (out / "a.json").read_text() == "[]\n"
    assert not list(out.glob(".*")), "no temp files left behind"
    (tmp_path / "file").write_text("")
    with pytest.raises(DstkError, match="not a directory"):  # a path problem: exit 1, not a usage error
        render.write_files(tmp_path / "file", {}, force=True)
