"""Attention as transformers runs it, not as dstk would like it to run.

- ``ModelSpec.attention_kernels`` against the class attributes transformers 5.25 declares
  (``_supports_sdpa``, ``_supports_flash_attn``) for every catalog family, and a real tiny
  ``BloomForCausalLM``: sdpa and flash_attention_2 raise, the default loads eager.
- ``dstk plan``/``estimate``: BLOOM unset -> eager with a why line; explicit sdpa/flash -> DstkError.
- Mistral's sliding window: explicit in the presets and the HF config they render; SDPA handed a
  mask (and K/V repeated) from ``seq_len >= sliding_window`` on, checked on a real tiny model.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from pathlib import Path

import pytest

from dstk import hardware
from dstk.errors import DstkError
from dstk.estimate import _model_facts, estimate, saved_activation_bytes
from dstk.estimate import steptime as st
from dstk.layout import Layout, Training
from dstk.models import family_module, get_model, presets
from dstk.plan import check_attention, choose_attention

A100 = hardware.get_gpu("a100-80gb")
KERNEL_FLAG = {"sdpa": "_supports_sdpa", "flash": "_supports_flash_attn"}


def _hf_class(family: str):
    module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    return getattr(module, family_module(family).HF_ARCHITECTURE)


def test_every_family_declares_what_transformers_declares():
    families = sorted({spec.family for spec in presets().values()})
    assert len(families) >= 12  # gpt2 opt gpt_neox phi3 falcon gemma qwen2 qwen3 mixtral llama mistral bloom
    for family in families:
        cls = _hf_class(family)
        kernels = {spec.attention_kernels for spec in presets().values() if spec.family == family}
        assert kernels == {("eager",) + tuple(k for k in ("sdpa", "flash") if getattr(cls, KERNEL_FLAG[k]))}, family
    assert get_model("bloom-7b1").attention_kernels == ("eager",)


def test_real_bloom_loads_eager_only():
    from transformers import AutoModelForCausalLM, BloomConfig, BloomForCausalLM

    cfg = BloomConfig(hidden_size=32, n_layer=1, n_head=4, vocab_size=64)
    # what dstk's fine-tune worker does (no attn_implementation): transformers falls back to eager
    assert AutoModelForCausalLM.from_config(cfg).config._attn_implementation == "eager"
    for impl in ("sdpa", "flash_attention_2"):
        with pytest.raises(ValueError, match="does not support"):
            BloomForCausalLM._from_config(cfg, attn_implementation=impl)


def test_bloom_default_is_eager_with_a_why_line_and_explicit_kernels_are_refused():
    bloom = get_model("bloom-7b1")
    attention, note = choose_attention(requested=None, spec=bloom, precision="bf16", gpu=A100)
    assert attention == "eager" and "BloomForCausalLM" in note and "_supports_sdpa" in note
    assert choose_attention(requested=None, spec=get_model("llama-3-8b"), precision="bf16", gpu=A100) == ("sdpa", None)
    for kernel in ("sdpa", "flash"):
        with pytest.raises(DstkError) as err:
            check_attention(attention=kernel, precision="bf16", gpu=A100, spec=bloom)
        assert "--attention eager" in err.value.hint
    check_attention(attention="eager", precision="bf16", gpu=A100, spec=bloom)
    # Megatron runs its own attention: the HF class does not limit it
    assert choose_attention(requested=None, spec=bloom, precision="bf16", gpu=A100, engine="megatron")[0] == "sdpa"


def _cli(capsys, *argv):
    from dstk.cli import main

    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out + out.err


def _without_note(data):
    if isinstance(data, dict):
        return {k: _without_note(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_without_note(v) for v in data if not (isinstance(v, str) and "default sdpa is not there" in v)]
    return data


@pytest.mark.parametrize("command", ["plan", "estimate"])
def test_cli_prices_bloom_as_eager_and_refuses_sdpa(capsys, command):
    base = [command, "--model", "bloom-560m", "--gpus", "8", "--gpu", "a100-80gb", "--seq-len", "2048"]
    code, text = _cli(capsys, *base, "--format", "json")
    assert code == 0, text
    assert "BloomForCausalLM has no SDPA" in text
    code, eager = _cli(capsys, *base, "--format", "json", "--attention", "eager")
    assert code == 0, eager
    # the default prices exactly what --attention eager prices; only the why line differs
    assert _without_note(json.loads(text)) == _without_note(json.loads(eager))
    code, text = _cli(capsys, *base, "--attention", "sdpa")
    assert code != 0 and "no SDPA attention" in text and "--attention eager" in text


def test_intent_attention_unset_until_resolved():
    from dstk.intent import TrainingIntent

    t = TrainingIntent()
    assert t.attention is None and t.to_training().attention == "sdpa"
    with pytest.raises(ValueError, match="training.attention"):
        TrainingIntent(attention="xformers")


def test_mistral_presets_say_their_window():
    windows = {name: spec.sliding_window for name, spec in presets().items() if spec.family == "mistral"}
    assert windows == {"mistral-7b": 4096, "mistral-7b-v0.3": None, "mistral-nemo-12b": None}
    from transformers import AutoConfig

    for name, window in windows.items():
        cfg = dict(family_module("mistral").hf_config(get_model(name)))
        assert "sliding_window" in cfg  # written, else MistralConfig's 4096 applies
        assert AutoConfig.for_model(cfg.pop("model_type"), **cfg).sliding_window == window
    # an HF config.json without the key gets MistralConfig's default, as transformers reads it
    cfg = dict(get_model("mistral-7b-v0.3").hf_config)
    del cfg["sliding_window"]
    assert family_module("mistral").read(cfg, name="x").sliding_window == 4096


def test_real_mistral_masks_sdpa_from_the_window_on(monkeypatch):
    """transformers 5.25 passes SDPA a mask and repeated K/V exactly when seq_len >= sliding_window."""
    import torch
    import torch.nn.functional as F
    from transformers import MistralConfig, MistralForCausalLM

    seen = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):
        seen.append((attn_mask is not None, k.shape[1] == q.shape[1]))
        return real(q, k, v, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    cfg = MistralConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                        intermediate_size=64, vocab_size=64, sliding_window=8)
    model = MistralForCausalLM._from_config(cfg, attn_implementation="sdpa")
    facts = _model_facts(dataclasses.replace(get_model("mistral-7b"), sliding_window=8))
    for seq_len in (6, 7, 8, 9, 12):
        seen.clear()
        model(torch.randint(0, 64, (1, seq_len)))
        assert seen[0] == (st.sdpa_gets_mask(facts, seq_len=seq_len),) * 2, seq_len
    assert st.sdpa_gets_mask(facts, seq_len=8) and not st.sdpa_gets_mask(facts, seq_len=7)


def _est(model, attention, seq_len=8192):
    cl = hardware.Cluster(num_nodes=1, gpus_per_node=8, gpu=A100,
                          interconnect=hardware.get_interconnect(hardware.default_interconnect(A100.slug)))
    return estimate(model=model, layout=Layout(dp=8, tp=1, pp=1, zero_stage=3, micro_batch=1, grad_accum=16),
                    training=Training(seq_len=seq_len, global_batch=128, precision="bf16", optimizer="adamw",
                                      attention=attention), cluster=cl)


def test_mistral_window_prices_the_masked_path_only_past_it():
    v01, v03 = get_model("mistral-7b"), get_model("mistral-7b-v0.3")
    unwindowed = dataclasses.replace(v01, sliding_window=None)
    # 8192 >= 4096: the masked kernel on every block, K/V repeated, the mask saved per layer
    assert _est(v01, "sdpa").time.step_seconds > 1.3 * _est(unwindowed, "sdpa").time.step_seconds
    mask_bytes = 2 * 8192 * 8192 * v01.num_layers
    assert (saved_activation_bytes(model=v01, micro_batch=1, seq_len=8192)
            - saved_activation_bytes(model=unwindowed, micro_batch=1, seq_len=8192)) >= mask_bytes
    # below the window: no mask, the same as no window
    assert _est(v01, "sdpa", seq_len=4095).time.step_seconds == _est(unwindowed, "sdpa", seq_len=4095).time.step_seconds
    # v0.3 has no window: the causal fused kernel at any length
    assert not st.sdpa_gets_mask(_model_facts(v03), seq_len=32768)
    # FlashAttention-2 skips the blocks left of the window: less attention time than without one
    assert _est(v01, "flash").time.step_seconds < _est(unwindowed, "flash").time.step_seconds
    assert st.window_share(seq_len=8192, window=4096) == pytest.approx((8192 * 4096 - 4096 * 4095 / 2)
                                                                       / (8192 * 8193 / 2))
    assert st.window_share(seq_len=4096, window=4096) == 1.0


def test_estimate_from_an_intent_or_a_config_prices_and_checks_the_model(tmp_path, capsys):
    intent = tmp_path / "bloom.yaml"
    intent.write_text("model:\n  name: bloom-560m\ncluster:\n  num_nodes: 1\n  gpus_per_node: 8\n  gpu: a100-80gb\n"
                      "training:\n  seq_len: 2048\n  global_batch: 64\n")
    code, text = _cli(capsys, "estimate", "--intent", str(intent), "--zero", "2", "--format", "json")
    assert code == 0, text
    assert json.loads(text)["training"]["attention"] == "eager"
    code, text = _cli(capsys, "estimate", "--intent", str(intent), "--zero", "2", "--attention", "flash")
    assert code != 0 and "no FlashAttention-2 attention" in text
    run = tmp_path / "run"
    code, text = _cli(capsys, "generate", str(intent), "--output", str(run))
    assert code == 0, text
    # a DeepSpeed config: the model as --model says, its kernel what transformers runs for it
    config = ["estimate", "--config", str(run / "ds_config.json"), "--model", "bloom-560m", "--gpus", "8",
              "--gpu", "a100-80gb", "--seq-len", "2048", "--format", "json"]
    code, text = _cli(capsys, *config)
    assert code == 0, text
    assert json.loads(text)["training"]["attention"] == "eager"
    code, text = _cli(capsys, *config, "--attention", "sdpa")
    assert code != 0 and "no SDPA attention" in text


def test_estimate_from_another_tools_file_keeps_its_kernel(capsys):
    """``--from`` an axolotl file with ``flash_attention: true``: the file's kernel unless --attention is given
    (the flag's default is now unset, not sdpa)."""
    axolotl = str(Path(__file__).parent / "data" / "import" / "axolotl_full.yml")
    code, text = _cli(capsys, "estimate", "--from", axolotl, "--format", "json")
    assert code == 0, text
    assert json.loads(text)["training"]["attention"] == "flash"
    code, text = _cli(capsys, "estimate", "--from", axolotl, "--attention", "eager", "--format", "json")
    assert code == 0, text
    assert json.loads(text)["training"]["attention"] == "eager"
