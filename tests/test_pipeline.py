"""Unit tier for dstk.pipeline: partitioning (pure functions), family discovery and its errors,
and the export command's refusals. The engine checks are in test_pipeline_dist.py."""

from __future__ import annotations

import itertools
import random
import subprocess
import sys

import pytest

from dstk.errors import DstkError, UsageError
from dstk.pipeline.partition import layer_costs, plan_stages, split, weights_for


def _brute_force(weights, k):
    n = len(weights)
    best = None
    for cuts in itertools.combinations(range(1, n), k - 1):
        b = [0, *cuts, n]
        worst = max(sum(weights[lo:hi]) for lo, hi in zip(b, b[1:]))
        best = worst if best is None else min(best, worst)
    return best


def test_split_is_optimal_and_contiguous():
    rng = random.Random(7)
    for _ in range(60):
        n = rng.randint(1, 9)
        k = rng.randint(1, n)
        w = [rng.choice([0.0, 1.0, 2.5, 7.0, rng.random()]) for _ in range(n)]
        b = split(w, k)
        assert b[0] == 0 and b[-1] == n and len(b) == k + 1
        assert all(lo < hi for lo, hi in zip(b, b[1:])), b
        assert max(sum(w[lo:hi]) for lo, hi in zip(b, b[1:])) == pytest.approx(_brute_force(w, k))


def _costs(num_layers=4, vocab=32000, hidden=256, tied=False):
    layer = 12 * hidden * hidden
    names = ["embed", *(f"layer.{i}" for i in range(num_layers)), "norm", "head"]
    params = [vocab * hidden, *([layer] * num_layers), hidden, vocab * hidden]
    return layer_costs(num_params=params, names=names, hidden_size=hidden, num_heads=4, vocab_size=vocab,
                       seq_len=512, tied_head=tied)


def test_more_stages_than_layers_is_refused():
    with pytest.raises(DstkError, match="5 pipeline stages for a model with 4 decoder layers") as exc:
        plan_stages(_costs(4), num_stages=5, method="balanced", seq_len=512)
    assert "at most 4" in exc.value.hint


def test_uniform_spreads_decoder_layers_and_reports_each_stage():
    bounds, stages = plan_stages(_costs(6), num_stages=4, method="uniform", seq_len=512)
    per_stage = [sum(n.startswith("layer.") for n in s.layer_names) for s in stages]
    assert per_stage == [2, 2, 1, 1]
    assert stages[0].layer_names[0] == "embed" and stages[-1].layer_names[-2:] == ("norm", "head")
    assert sum(s.num_params for s in stages) == sum(c.num_params for c in _costs(6))
    assert sum(s.load for s in stages) == pytest.approx(1.0)


def test_balanced_counts_embedding_and_head():
    """A large vocabulary makes the first and last stage heavy: balanced gives them fewer layers
    than uniform does, and its heaviest stage is lighter."""
    costs = _costs(num_layers=8, vocab=64000, hidden=128)
    _, uniform = plan_stages(costs, num_stages=4, method="uniform", seq_len=512)
    _, balanced = plan_stages(costs, num_stages=4, method="balanced", seq_len=512)
    layers = [sum(n.startswith("layer.") for n in s.layer_names) for s in balanced]
    assert layers[0] < 2 or layers[-1] < 2, layers
    assert max(s.load for s in balanced) < max(s.load for s in uniform)
    assert all(n >= 1 for n in layers)
    # the stages in between, which do not set the maximum, still share the layers evenly
    assert abs(layers[1] - layers[2]) <= 1, layers


def test_tied_head_owns_no_parameters():
    costs = _costs(tied=True)
    assert costs[-1].num_params == 0 and costs[-1].flops_per_token > 0
    assert weights_for(costs, method="parameters", seq_len=512)[-1] == 0.0


def test_unknown_method_is_refused():
    with pytest.raises(DstkError, match="unknown partition"):
        weights_for(_costs(), method="profile", seq_len=512)


# --- families: discovery and partition on real (tiny, meta-device) HF models -----------------

def _meta_model(name, **kw):
    import torch
    import transformers as tf

    cfg = getattr(tf, f"{name}Config")(**kw)
    with torch.device("meta"):
        return tf.AutoModelForCausalLM.from_config(cfg)


SMALL = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2)
MODELS = {
    "llama": ("Llama", SMALL), "mistral": ("Mistral", SMALL), "qwen2": ("Qwen2", SMALL),
    "qwen3": ("Qwen3", {**SMALL, "head_dim": 8}), "gemma": ("Gemma", {**SMALL, "head_dim": 8}),
    "gpt2": ("GPT2", dict(vocab_size=128, n_embd=32, n_layer=3, n_head=4)),
    "gpt_neox": ("GPTNeoX", dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                 num_attention_heads=4)),
    "opt": ("OPT", dict(vocab_size=128, hidden_size=32, ffn_dim=64, num_hidden_layers=3, num_attention_heads=4)),
}


@pytest.mark.parametrize("family", sorted(MODELS))
def test_every_family_is_found_and_partitioned(family):
    from dstk.pipeline.adapter import adapter_for
    from dstk.pipeline.build import plan_for

    name, kw = MODELS[family]
    model = _meta_model(name, **kw)
    adapter = adapter_for(model)
    assert adapter.family == family
    import importlib

    own = importlib.import_module(f"dstk.models.{family}").PIPELINE_ADAPTER  # the family file's section
    assert adapter.embed_fn is own.embed_fn and adapter.layers == own.layers and adapter.rotary == own.rotary
    assert len(model.get_submodule(adapter.layers)) == 3
    bounds, stages, costs = plan_for(model, num_stages=3, partition="balanced")
    assert [sum(n.startswith("layer.") for n in s.layer_names) for s in stages] == [1, 1, 1]
    counted = sum(s.num_params for s in stages)
    assert counted == sum(p.numel() for p in model.parameters())  # tied matrices once
    with pytest.raises(DstkError, match="4 pipeline stages"):
        plan_for(model, num_stages=4)


def test_model_it_cannot_wrap_names_what_is_missing():
    from dstk.pipeline.adapter import adapter_for

    model = _meta_model("Bloom", vocab_size=128, hidden_size=32, n_layer=2, n_head=4)
    with pytest.raises(DstkError) as exc:
        adapter_for(model)
    assert "rotary" in exc.value.message and "BloomForCausalLM" in exc.value.message
    assert "word_embeddings_layernorm" in exc.value.message
    assert "PIPELINE_ADAPTER" in exc.value.hint


# --- export: refusals ------------------------------------------------------------------------

def test_export_refuses_missing_checkpoint_and_nonempty_output(tmp_path, capsys):
    from dstk.cli import main

    assert main(["export", str(tmp_path / "nope"), "--output", str(tmp_path / "out")]) == 2
    assert "does not exist" in capsys.readouterr().err
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["export", str(ckpt), "--output", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert (out / "keep.txt").read_text() == "mine"


def test_export_without_config_says_how_to_fix(tmp_path):
    from dstk.pipeline.export import export_hf

    (tmp_path / "ckpt" / "global_step1").mkdir(parents=True)
    (tmp_path / "ckpt" / "latest").write_text("global_step1")
    with pytest.raises(UsageError) as exc:
        export_hf(tmp_path / "ckpt", tmp_path / "out")
    assert "--config" in exc.value.hint
    assert not (tmp_path / "out").exists()
