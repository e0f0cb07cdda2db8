"""The catalog's parameter counts against the real transformers models, built on the meta device
from the same config (no weights, no downloads)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from dstk.errors import DstkError
from dstk.models import FAMILIES, ModelSpec, family_module, get_model, list_models, presets

LAYER_KEYS = ("num_hidden_layers", "n_layer")


def real_model_params(cfg: dict) -> tuple[int, int]:
    """(unique parameters, parameter tensors) of the HF causal LM built from ``cfg`` on meta."""
    import torch
    import transformers

    keys = dict(cfg)
    config = transformers.AutoConfig.for_model(keys.pop("model_type"), **keys)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    params = list(model.parameters())  # shared (tied) tensors are yielded once
    return sum(p.numel() for p in params), len(params)


def two_layers(cfg: dict) -> dict:
    """The preset at full width but with 2 layers: the count is linear in the layers, so this
    checks every tensor of the real model while keeping the test fast."""
    key = next(k for k in LAYER_KEYS if k in cfg)
    return {**cfg, key: 2}


PRESET_CASES = [(slug, spec.family) for slug, spec in presets().items()]


@pytest.mark.parametrize("slug,family", PRESET_CASES, ids=[s for s, _ in PRESET_CASES])
def test_preset_param_count_equals_transformers(slug, family):
    module = family_module(family)
    cfg = two_layers(module.PRESETS[slug])
    spec = module.read(cfg, name=slug)
    numel, tensors = real_model_params(module.hf_config(spec))
    assert spec.num_params == numel
    assert spec.num_tensors == tensors


def test_every_family_has_presets_and_module_names():
    assert {s.family for s in list_models()} == set(FAMILIES)
    for family in FAMILIES:
        module = family_module(family)
        assert module.PRESETS, family
        assert {"embed", "layers", "final_norm", "lm_head", "attention", "mlp"} <= set(module.MODULES)
        assert module.HF_ARCHITECTURE.endswith(("ForCausalLM", "LMHeadModel"))


@pytest.mark.parametrize("dims", [
    dict(num_layers=3, hidden_size=64, num_heads=4, vocab_size=1000),
    dict(num_layers=2, hidden_size=96, num_heads=6, vocab_size=512, num_kv_heads=2, ffn_hidden_size=200, seq_len=128),
])
def test_generic_decoder_param_count_equals_llama(dims):
    spec = ModelSpec.generic(**dims)
    numel, _ = real_model_params(spec.hf_config)
    assert spec.num_params == numel
    assert spec.family == "generic" and spec.seq_len == dims.get("seq_len")


def test_published_sizes():
    """Figures from the model cards (parameter counts of the released checkpoints)."""
    assert get_model("llama-3-8b").num_params == 8_030_261_248
    assert get_model("llama-2-7b").num_params == 6_738_415_616
    assert get_model("gpt2").num_params == 124_439_808
    mixtral = get_model("mixtral-8x7b")
    assert mixtral.num_params == 46_702_792_704
    assert 12.8e9 < mixtral.num_active_params < 12.9e9


def test_moe_active_params_follow_routing():
    cfg = family_module("mixtral").PRESETS["mixtral-8x7b"]
    one = family_module("mixtral").read({**cfg, "num_experts_per_tok": 1}, name="x")
    two = family_module("mixtral").read(cfg, name="x")
    per_expert_mlp = 3 * cfg["hidden_size"] * cfg["intermediate_size"]
    assert two.num_active_params - one.num_active_params == cfg["num_hidden_layers"] * per_expert_mlp
    assert one.num_params == two.num_params


def test_hf_config_file_and_directory(tmp_path):
    cfg = two_layers(family_module("qwen2").PRESETS["qwen2.5-0.5b"])
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    by_dir, by_file = get_model(str(tmp_path)), get_model(str(tmp_path / "config.json"))
    assert by_dir.num_params == by_file.num_params == real_model_params(cfg)[0]
    assert by_dir.family == "qwen2" and by_dir.num_layers == 2


def test_user_errors(tmp_path):
    with pytest.raises(DstkError) as err:
        get_model("llama-3-8")
    assert "llama-3-8b" in err.value.hint  # the hint names the nearest presets
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "t5"}))
    with pytest.raises(DstkError, match="not in dstk's catalog"):
        get_model(str(tmp_path))
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(DstkError, match="JSON"):
        get_model(str(tmp_path / "bad.json"))


def test_spec_is_frozen_and_checked():
    spec = get_model("gpt2")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.num_layers = 3
    with pytest.raises(ValueError, match="num_kv_heads"):
        dataclasses.replace(spec, num_kv_heads=5)


@pytest.mark.parametrize("family", FAMILIES)
def test_module_names_are_the_real_models(family):
    """MODULES (LoRA targets, pipeline cuts) names what the transformers model has, and every
    weight-holding module of a layer is named (Qwen3's q_norm/k_norm included)."""
    import torch
    import transformers

    module = family_module(family)
    keys = two_layers(next(iter(module.PRESETS.values())))
    model_type = keys.pop("model_type")
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(model_type, **keys))
    names = {n for n, _ in model.named_modules()} | {n for n, _ in model.named_parameters()}
    mods = module.MODULES

    def paths(value):
        return (value,) if isinstance(value, str) else tuple(value)

    top = [p for key in ("embed", "layers", "final_norm", "lm_head") for p in paths(mods[key])]
    optional = {"model.decoder.project_in", "model.decoder.project_out", "model.decoder.final_layer_norm",
                "transformer.word_embeddings_layernorm", "transformer.wpe"}  # present in some configs only
    assert [p for p in top if p not in names and p not in optional] == []
    layer = f"{paths(mods['layers'])[0]}.0."
    inner = [p for key in ("attention", "mlp", "norms") for p in paths(mods[key])]
    listed = {p for p in inner if layer + p in names}
    assert listed, inner
    params = [n.removeprefix(layer) for n, _ in model.named_parameters() if n.startswith(layer)]
    assert [p for p in params if p not in inner and p.rsplit(".", 1)[0] not in inner] == []


def test_model_modules_import_no_circle():
    """spec <- llama_shaped <- the families: no module of dstk.models imports one that imports it
    back, at any level (function-level imports count: they hide a circle, they do not break it)."""
    import ast
    from pathlib import Path

    folder = Path(__file__).resolve().parent.parent / "models"
    graph = {}
    for path in folder.glob("*.py"):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dstk.models"):
                mod = node.module.removeprefix("dstk.models").lstrip(".")
                names |= {mod} if mod else {a.name for a in node.names}
            elif isinstance(node, ast.Import):
                names |= {a.name.removeprefix("dstk.models.") for a in node.names if a.name.startswith("dstk.models.")}
        graph[path.stem] = {n.split(".")[0] for n in names if (folder / f"{n.split('.')[0]}.py").exists()}
    assert len(graph) >= 14 and graph["spec"] == set()

    def reach(start, node, seen):
        for nxt in graph.get(node, ()):
            if nxt == start:
                return True
            if nxt not in seen:
                seen.add(nxt)
                if reach(start, nxt, seen):
                    return True
        return False

    assert [m for m in graph if m != "__init__" and reach(m, m, set())] == []
