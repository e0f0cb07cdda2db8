from __future__ import annotations

from pathlib import Path

import pytest

from dstk.errors import DstkError, UsageError
from dstk.intent import Intent, field_doc, intent_from_dict, load_intent, with_overrides

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples" / "intents").rglob("*.yaml"))
TINY = {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "vocab_size": 512}


def test_every_example_loads():
    assert len(EXAMPLES) == 4
    for path in EXAMPLES:
        intent = load_intent(path)
        assert isinstance(intent, Intent)
        assert path.read_text().startswith("#"), f"{path.name} needs a header comment"


def test_tiny_cpu_example_is_what_the_demo_needs():
    intent = load_intent(ROOT / "examples" / "intents" / "tiny-llama-cpu.yaml")
    assert intent.cluster.gpu == "cpu" and intent.cluster.world_size == 2
    assert intent.training.to_training().global_batch == 8


def test_global_batch_from_tokens_and_default():
    t = intent_from_dict({"model": TINY, "training": {"seq_len": 4096, "global_batch_tokens": 4096 * 96}}).training
    assert t.sequences_per_step == 96
    assert intent_from_dict({"model": TINY, "training": {"seq_len": 4096}}).training.sequences_per_step == 256
    steps = intent_from_dict({"model": TINY, "training": {"seq_len": 1000, "global_batch": 10, "num_tokens": 25_001}})
    assert steps.training.steps == 3  # ceil(25001 / 10000)


@pytest.mark.parametrize(
    "data, message, hint",
    [
        ({"model": TINY, "trainig": {}}, "trainig: unknown section", "did you mean 'training'"),
        ({"model": TINY, "training": {"seq_lenn": 4}}, "training.seq_lenn: unknown key", "did you mean 'seq_len'"),
        ({"model": TINY, "training": {"seq_len": True}}, "training.seq_len: expected an integer", "Tokens per"),
        ({"model": TINY, "training": {"seq_len": 0}}, "training.seq_len: expected a positive", "Tokens per"),
        ({"model": TINY, "training": {"precision": "fp8"}}, "training.precision: expected one of", "bf16"),
        ({"model": TINY, "training": {"lr": "fast"}}, "training.lr: expected a number", "learning rate"),
        ({"model": TINY, "training": {"seq_len": 100, "global_batch_tokens": 250}}, "not a multiple", "nearest: 200"),
        ({"model": {"num_layers": 2}}, "model.hidden_size: a model needs", "Model width"),
        ({"model": {"name": "x", "num_layers": 2}}, "model.name: give a name or dimensions", ""),
        ({"model": dict(TINY, num_heads=3)}, "model.num_heads: hidden_size 64 is not divisible", ""),
        ({"model": TINY, "constraints": {"tp": 3}}, "constraints.tp: tp=3 does not divide the world size 8",
         "1, 2, 4, 8"),
        ({"model": TINY, "constraints": {"tp": 16}, "cluster": {"num_nodes": 2}}, "larger than a node",
         "tp_across_nodes"),
        ({"model": TINY, "constraints": {"engine": "megatron", "zero_stage": 3}}, "constraints.zero_stage", ""),
        ({"model": TINY, "constraints": {"offload": False, "offload_optimizer": "cpu"}}, "offload is pinned", ""),
        ({"model": TINY, "constraints": {"offload_params": "nvme"}}, "constraints.nvme_path", ""),
        ({"model": TINY, "constraints": {"memory_headroom": 0.95}}, "constraints.memory_headroom", ""),
        ({"model": TINY, "cluster": {"gpu": "cpu"}, "training": {"precision": "fp16"}}, "no fp16", ""),
        ({"training": {}}, "model: missing", "llama-3-8b"),
        ([1, 2], "an intent is a mapping", "examples/intents"),
        ({"model": TINY, "training": [1]}, "training: expected a mapping", ""),
    ],
)
def test_bad_intents_name_the_field_and_a_fix(data, message, hint):
    with pytest.raises(DstkError) as exc:
        intent_from_dict(data, source="intent.yaml")
    assert message in exc.value.message
    assert exc.value.location == "intent.yaml"
    assert exc.value.hint, "every error says how to fix it"
    assert hint in exc.value.hint


def test_yaml_errors_point_at_the_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("model:\n  name: [unclosed\n")
    with pytest.raises(DstkError) as exc:
        load_intent(path)
    assert exc.value.location.startswith(f"{path}:")
    with pytest.raises(UsageError):
        load_intent(tmp_path / "missing.yaml")


def test_yaml_number_forms_are_read_as_meant(tmp_path):
    path = tmp_path / "i.yaml"
    path.write_text("model: {name: llama-3-8b}\ntraining: {lr: 3e-4, num_tokens: 1e12, betas: [0.9, 0.95]}\n")
    t = load_intent(path).training
    assert t.lr == 3e-4 and t.num_tokens == 10**12 and isinstance(t.num_tokens, int) and t.betas == (0.9, 0.95)


def test_flags_win_over_the_file():
    base = intent_from_dict({"model": TINY, "training": {"seq_len": 128, "global_batch_tokens": 1280}})
    new = with_overrides(base, {"training": {"seq_len": 256, "global_batch": 4}, "cluster": {"gpus_per_node": 2}})
    assert new.training.seq_len == 256 and new.training.sequences_per_step == 4
    assert new.training.global_batch_tokens is None
    assert new.cluster.gpus_per_node == 2
    assert new.model == base.model
    named = with_overrides(base, {"model": {"name": "llama-3-8b"}})
    assert named.model.name == "llama-3-8b" and named.model.num_layers is None
    assert with_overrides(base, {"training": {"seq_len": None}}) == base  # unset flags change nothing


def test_flags_alone_and_no_model():
    assert with_overrides(None, {"model": {"name": "gpt2"}}).model.name == "gpt2"
    with pytest.raises(UsageError, match="no model"):
        with_overrides(None, {"training": {"seq_len": 8}})


def test_intent_is_frozen_and_round_trips():
    intent = intent_from_dict({"model": TINY, "training": {"betas": [0.8, 0.9]}})
    with pytest.raises(AttributeError):
        intent.training.seq_len = 4  # type: ignore[misc]
    assert intent_from_dict(intent.to_dict()) == intent


def test_field_docs_are_the_help_text():
    assert field_doc("constraints", "memory_headroom").startswith("Fraction of each GPU")
    assert field_doc("cluster", "gpu").startswith("GPU type by slug")


def test_precision_is_unset_until_the_gpu_is_known_and_host_memory_is_checked():
    intent = intent_from_dict({"model": TINY})
    assert intent.training.precision is None  # dstk.plan.resolve picks bf16 or fp16 from the GPU
    assert intent.training.to_training().precision == "bf16"
    assert intent_from_dict({"model": TINY, "cluster": {"host_memory_gib": 512}}).cluster.host_memory_gib == 512.0
    with pytest.raises(DstkError, match="cluster.host_memory_gib"):
        intent_from_dict({"model": TINY, "cluster": {"host_memory_gib": 0}})
    assert "offload" in field_doc("cluster", "host_memory_gib")
