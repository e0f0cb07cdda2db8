"""Sliding windows read the same everywhere: the spec, the estimate, the Megatron arguments.

- Per family whose transformers 5.25 class can slide (Mistral, Phi-3, Mixtral, Qwen2, Qwen3): a real
  tiny model built from a config with a window hands SDPA a mask (and K/V repeated) in exactly the
  layers and from exactly the length dstk says, and hands the attention kernel the window
  (``sliding_window=``, what FlashAttention-2 gets as ``window_size``) in exactly those layers.
- The spec reads the window (and, for Qwen2/3, which layers slide) from a config.json as
  transformers writes it and as older hubs hold it (no ``layer_types``); presets state the published
  window (Phi-3 4k: 2047; Mixtral: null; Qwen: ``use_sliding_window`` false).
- Only some layers sliding: the step is the count-weighted mean of a windowed and a full layer, and
  each pipeline stage keeps the masks of its own sliding layers only.
- LoRA without q/k/v adapters: the frozen first layer saves nothing, masked or not (measured).
- ``megatron.args`` carry ``--window-size W-1,0`` (and the per-layer pattern), which megatron-core's
  ``TransformerConfig`` and ``is_layer_window_attention`` read as the same layers.
- ``dstk.estimate.estimate()`` refuses a kernel the model's HF class lacks, as plan does.
"""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from dstk import hardware
from dstk.errors import DstkError
from dstk.estimate import _model_facts, estimate, saved_activation_bytes
from dstk.estimate import lora as lora_est
from dstk.estimate import steptime as st
from dstk.layout import Layout, Lora, Training
from dstk.models import get_model, presets

A100 = hardware.get_gpu("a100-80gb")
WINDOW = 8
TINY = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64, vocab_size=64)


def _cluster(gpus: int = 8):
    return hardware.Cluster(num_nodes=1, gpus_per_node=gpus, gpu=A100,
                            interconnect=hardware.get_interconnect(hardware.default_interconnect(A100.slug)))


def _config(family: str, **keys):
    """A real transformers config of ``family`` with ``keys``: what a user's config.json holds."""
    import transformers

    cls = {"mistral": transformers.MistralConfig, "phi3": transformers.Phi3Config,
           "mixtral": transformers.MixtralConfig, "qwen2": transformers.Qwen2Config,
           "qwen3": transformers.Qwen3Config}[family]
    extra = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2} if family == "phi3" else {}
    if family == "mixtral":
        extra.update(num_local_experts=4, num_experts_per_tok=2)
    return cls(**TINY, **extra, **keys)


# (family, config keys, the layers transformers slides): every family whose class can slide
CASES = {
    "mistral": ("mistral", dict(num_hidden_layers=2, sliding_window=WINDOW), {0, 1}),
    "phi3": ("phi3", dict(num_hidden_layers=2, sliding_window=WINDOW), {0, 1}),
    "mixtral": ("mixtral", dict(num_hidden_layers=2, sliding_window=WINDOW), {0, 1}),
    "qwen2-some-layers": ("qwen2", dict(num_hidden_layers=3, use_sliding_window=True, sliding_window=WINDOW,
                                        max_window_layers=1), {1, 2}),
    "qwen2-all-layers": ("qwen2", dict(num_hidden_layers=2, use_sliding_window=True, sliding_window=WINDOW,
                                       max_window_layers=0), {0, 1}),
    "qwen3-some-layers": ("qwen3", dict(num_hidden_layers=3, use_sliding_window=True, sliding_window=WINDOW,
                                        max_window_layers=2), {2}),
}


def _spec_of(config, tmp_path):
    """The spec dstk reads from the config.json transformers writes for ``config``."""
    config.save_pretrained(tmp_path)
    return get_model(str(tmp_path))


def _slides(spec, layer: int) -> bool:
    return spec.sliding_window is not None and (spec.sliding_layers is None or layer in spec.sliding_layers)


@pytest.mark.parametrize("case", list(CASES))
def test_real_model_masks_and_windows_the_layers_dstk_says(case, tmp_path, monkeypatch):
    """Per layer of a real tiny model (sdpa): what transformers hands the attention function
    (``sliding_window=``, the window FlashAttention-2 would get) and whether SDPA gets a mask and
    K/V repeated to the query heads, at lengths around the window, against the spec and
    ``steptime.sdpa_gets_mask``."""
    import torch
    import torch.nn.functional as F
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.modeling_utils import AttentionInterface

    family, keys, sliding = CASES[case]
    config = _config(family, **keys)
    spec = _spec_of(config, tmp_path)
    assert spec.family == family and spec.sliding_window == WINDOW
    assert {i for i in range(spec.num_layers) if _slides(spec, i)} == sliding
    facts = _model_facts(spec)

    calls: list[list] = []
    real_sdpa = F.scaled_dot_product_attention

    def spy_sdpa(q, k, v, attn_mask=None, **kw):
        calls[-1] += [attn_mask is not None, k.shape[1] == q.shape[1]]
        return real_sdpa(q, k, v, attn_mask=attn_mask, **kw)

    def spy_attention(module, q, k, v, attention_mask, **kw):
        calls.append([kw.get("sliding_window")])
        return sdpa_attention_forward(module, q, k, v, attention_mask, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy_sdpa)
    monkeypatch.setitem(AttentionInterface._global_mapping, "sdpa", spy_attention)
    model = _model_class(family)._from_config(config, attn_implementation="sdpa")
    for seq_len in (WINDOW - 2, WINDOW - 1, WINDOW, WINDOW + 1, WINDOW + 4):
        calls.clear()
        with torch.no_grad():
            model(torch.randint(0, 64, (1, seq_len)))
        assert len(calls) == spec.num_layers
        for layer, (window, masked, repeated) in enumerate(calls):
            slides = layer in sliding
            assert window == (WINDOW if slides else None), (case, seq_len, layer)
            assert masked == repeated == (slides and st.sdpa_gets_mask(facts, seq_len=seq_len)), (case, seq_len, layer)


def _model_class(family: str):
    import transformers

    return {"mistral": transformers.MistralForCausalLM, "phi3": transformers.Phi3ForCausalLM,
            "mixtral": transformers.MixtralForCausalLM, "qwen2": transformers.Qwen2ForCausalLM,
            "qwen3": transformers.Qwen3ForCausalLM}[family]


@pytest.mark.parametrize("family,keys,window,layers", [
    ("phi3", {"sliding_window": 2047}, 2047, None),
    ("phi3", {}, None, None),  # Phi3Config's default: none
    ("mixtral", {"sliding_window": None}, None, None),
    ("mixtral", {"sliding_window": 4096}, 4096, None),
    ("qwen2", {"use_sliding_window": False, "sliding_window": 131072, "max_window_layers": 28}, None, None),
    ("qwen2", {"use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 2}, 4096, (2, 3)),
    ("qwen2", {"use_sliding_window": True}, None, None),  # the default max_window_layers (28) > 4 layers
    ("qwen2", {"use_sliding_window": True, "sliding_window": 64,
               "layer_types": ["sliding_attention", "full_attention"] * 2}, 64, (0, 2)),
    ("qwen3", {"use_sliding_window": True, "sliding_window": 512, "max_window_layers": 0}, 512, None),
    ("qwen3", {"use_sliding_window": False, "sliding_window": None}, None, None),
])
def test_spec_reads_the_window_from_a_hand_written_config_json(family, keys, window, layers, tmp_path):
    """A config.json as the hubs hold it (no ``layer_types`` unless given) gives the window and
    layers transformers' own config class derives from it."""
    import transformers

    cfg = {"model_type": family, "num_hidden_layers": 4, **TINY, **keys}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec = get_model(str(tmp_path))
    assert (spec.sliding_window, spec.sliding_layers) == (window, layers)
    hf = transformers.AutoConfig.from_pretrained(tmp_path)
    types = getattr(hf, "layer_types", None) or ["sliding_attention" if hf.sliding_window else "full_attention"] * 4
    hf_layers = [i for i, t in enumerate(types) if t == "sliding_attention" and hf.sliding_window is not None]
    assert [i for i in range(4) if _slides(spec, i)] == hf_layers


def test_presets_state_the_published_window():
    """Phi-3 4k configs publish ``"sliding_window": 2047``; Mixtral's ``null``; every Qwen2/2.5/3
    ``"use_sliding_window": false``; Gemma 1's config has no window; the rendered HF config gives
    transformers the same."""
    from transformers import AutoConfig

    from dstk.models import family_module

    windows = {name: spec.sliding_window for name, spec in presets().items()
               if spec.family in ("phi3", "mixtral", "qwen2", "qwen3", "gemma")}
    assert {n: w for n, w in windows.items() if w is not None} == {"phi-3-mini": 2047, "phi-3-medium": 2047}
    assert len(windows) >= 20
    for name in windows:
        spec = get_model(name)
        cfg = dict(family_module(spec.family).hf_config(spec))
        hf = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
        assert getattr(hf, "sliding_window", None) == spec.sliding_window, name
        assert spec.sliding_layers is None


def test_some_layers_sliding_price_the_weighted_mean():
    """A quarter of Qwen2.5-7B's layers (the last 7 of 28) with a 4096 window at 8192 (sdpa, A100):
    the layer time is the count-weighted mean of a windowed and a full layer; the saved activations
    add a quarter of the masks."""
    base = get_model("qwen2.5-7b")
    half = dataclasses.replace(base, sliding_window=4096, sliding_layers=tuple(range(21, 28)))
    every = dataclasses.replace(base, sliding_window=4096)
    kw = dict(tokens=8192, seq_len=8192, tp=1, sp=1, act_bytes=2, attention="sdpa", gpu=A100,
              peak_flops=A100.peak_flops("bf16"), fused=False)
    t_none, t_half, t_all = (st.layer_seconds(facts=_model_facts(m), **kw) for m in (base, half, every))
    assert t_all.forward > 1.2 * t_none.forward  # the masked kernel computes every block
    assert t_half.forward == pytest.approx(0.75 * t_none.forward + 0.25 * t_all.forward)
    assert t_half.backward == pytest.approx(0.75 * t_none.backward + 0.25 * t_all.backward)
    saved = [saved_activation_bytes(model=m, micro_batch=1, seq_len=8192) for m in (base, half, every)]
    assert saved[2] - saved[0] >= 28 * 2 * 8192 * 8192  # each sliding layer keeps its own bf16 mask
    assert saved[1] - saved[0] == pytest.approx((saved[2] - saved[0]) / 4)
    # below the window nothing changes
    assert saved_activation_bytes(model=half, micro_batch=1, seq_len=4095) == \
        saved_activation_bytes(model=base, micro_batch=1, seq_len=4095)


def test_megatron_prices_the_window_its_fused_kernel_skips():
    """Mistral-7B-v0.1 (window 4096) at 16384 tokens on A100: Megatron's kernels (``fused``) get the window
    (``--window-size 4095,0``) and skip the blocks left of it, so their attention is the full causal one
    times ``window_share``, under sdpa or flash alike; HF's SDPA gets a mask and computes every block."""
    base = get_model("mistral-7b")
    assert base.sliding_window == 4096
    full = dataclasses.replace(base, sliding_window=None)
    kw = dict(tokens=16384, seq_len=16384, tp=1, sp=1, act_bytes=2, gpu=A100, peak_flops=A100.peak_flops("bf16"))
    share = st.window_share(seq_len=16384, window=4096)
    assert 0.4 < share < 0.5
    for attention in ("sdpa", "flash"):
        windowed = st.layer_seconds(facts=_model_facts(base), attention=attention, fused=True, **kw)
        causal = st.layer_seconds(facts=_model_facts(full), attention=attention, fused=True, **kw)
        assert windowed.attention == pytest.approx(share * causal.attention), attention
        assert windowed.gemm == causal.gemm
    hf_sdpa = st.layer_seconds(facts=_model_facts(base), attention="sdpa", fused=False, **kw)
    hf_causal = st.layer_seconds(facts=_model_facts(full), attention="sdpa", fused=False, **kw)
    assert hf_sdpa.attention > hf_causal.attention  # the masked kernel: every block, at its lower rate


def test_each_pipeline_stage_keeps_the_masks_of_its_own_sliding_layers():
    base = get_model("qwen2.5-7b")
    late = dataclasses.replace(base, sliding_window=4096, sliding_layers=tuple(range(20, 28)))
    every = dataclasses.replace(base, sliding_window=4096)
    layout = Layout(dp=4, tp=1, pp=2, zero_stage=1, micro_batch=1, grad_accum=8)
    training = Training(seq_len=8192, global_batch=32, precision="bf16", optimizer="adamw", attention="sdpa")
    none_, part, all_ = (estimate(model=m, layout=layout, training=training, cluster=_cluster()).memory.per_stage
                         for m in (base, late, every))
    assert part[0].num_layers <= 20  # the first stage holds no sliding layer: as without a window
    assert part[0].activations_bytes == none_[0].activations_bytes < all_[0].activations_bytes
    # the second stage holds layers first..27, of which 20..27 slide: their share of the masks
    first = part[0].num_layers
    extra = all_[1].activations_bytes - none_[1].activations_bytes
    assert extra > 0
    assert part[1].activations_bytes - none_[1].activations_bytes == pytest.approx(extra * 8 / (28 - first))


def test_lora_frozen_first_layer_saves_no_mask_as_peft_measures():
    """Mistral with a window shorter than the sequence, adapters on o and down only: the first
    layer's attention needs no gradient, so it keeps neither K/V repeated nor the mask; the rest do.
    ``saved_tensors_hooks`` over the peft-wrapped bf16 model against the estimator, to the byte (the
    4-byte loss scalar)."""
    from test_estimate_lora import peft_saved_bytes

    from dstk.models import family_module

    lora, micro, seq = Lora(rank=4, alpha=8, targets="o,down"), 2, 64
    keys = dict(model_type="mistral", hidden_size=256, num_hidden_layers=3, num_attention_heads=8,
                num_key_value_heads=4, intermediate_size=512, vocab_size=512, max_position_embeddings=256,
                sliding_window=32, tie_word_embeddings=False)
    spec = family_module("mistral").read(dict(keys), name="tiny-mistral")
    measured = peft_saved_bytes(keys, lora=lora, family="mistral", micro=micro, seq_len=seq)

    from dstk.estimate import _shape_at

    f = _model_facts(spec)
    shape = _shape_at(f, seq_len=seq)
    assert shape.sdpa_mask
    full = saved_activation_bytes(model=spec, micro_batch=micro, seq_len=seq, cpu=True)
    lf = lora_est.lora_facts(model=spec, lora=lora)
    layer, once = lora_est.activation_delta_bytes(lf=lf, lora=lora, tokens=micro * seq, shape=shape, act_bytes=2,
                                                  seq_len=seq, attention="sdpa")
    predicted = full + spec.num_layers * layer + once
    assert abs(predicted - measured) <= 8, (predicted, measured)
    with pytest.raises(ValueError, match="seq_len"):
        lora_est.activation_delta_bytes(lf=lf, lora=lora, tokens=micro * seq, shape=shape, act_bytes=2)
    cpu2 = hardware.Cluster(num_nodes=1, gpus_per_node=2, gpu=hardware.get_gpu("cpu"),
                            interconnect=hardware.get_interconnect(hardware.default_interconnect("cpu")))
    est = estimate(model=spec, layout=Layout(dp=2, micro_batch=micro), cluster=cpu2,
                   training=Training(seq_len=seq, global_batch=2 * micro, precision="bf16", optimizer="adamw",
                                     attention="sdpa", lora=lora))
    assert est.memory.per_gpu.activations_bytes == int(predicted)


def _eval_megatron_pattern(text: str):
    """Megatron-LM's ``_eval_pattern`` (``megatron/training/arguments.py``): digits, ``,[]()+*`` only."""
    assert not re.search(r"[^,\d\[\]\(\)\+\*]", text), text
    return eval(text)  # noqa: S307 - the same restricted alphabet Megatron-LM evaluates


@pytest.mark.parametrize("name,window,layers", [
    ("mistral-7b", 4096, None), ("phi-3-mini", 2047, None), ("mistral-7b-v0.3", None, None),
    ("qwen2.5-7b", 4096, tuple(range(20, 28))), ("qwen3-8b", 1024, (0, 1, 2, 30, 31, 32, 33, 34, 35)),
])
def test_megatron_args_carry_the_window_megatron_core_reads_as_the_same_layers(name, window, layers):
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.utils import is_layer_window_attention

    from dstk.intent import TrainingIntent
    from dstk.plan import model_dims, model_facts
    from dstk.render import megatron_args, read_megatron_args

    spec = get_model(name)
    if window is not None and spec.sliding_window != window:
        spec = dataclasses.replace(spec, sliding_window=window, sliding_layers=layers)
    args = megatron_args(layout=Layout(dp=8, zero_stage=1, micro_batch=1, grad_accum=1), training=TrainingIntent(),
                         model=model_dims(model_facts(spec), spec))
    opts = dict(item.partition(" ")[::2] for item in args)
    # the file as `$(cat megatron.args)` splits it: every value one word, nothing to quote
    assert read_megatron_args("\n".join(args)) == "\n".join(args).split()
    if window is None:
        assert "--window-size" not in opts and "--window-attn-skip-freq" not in opts
        return
    left_right = tuple(int(i) for i in opts["--window-size"].strip("()").split(","))  # Megatron-LM's tuple_type
    assert left_right == (window - 1, 0)  # W keys, the query's own included
    skip = _eval_megatron_pattern(opts["--window-attn-skip-freq"]) if "--window-attn-skip-freq" in opts else None
    assert (skip is None) == (layers is None)
    config = TransformerConfig(num_layers=spec.num_layers, hidden_size=64, num_attention_heads=4,
                               window_size=left_right, window_attn_skip_freq=skip)
    slides = [is_layer_window_attention(config.window_size, config.window_attn_skip_freq, i + 1)
              for i in range(spec.num_layers)]
    assert slides == [_slides(spec, i) for i in range(spec.num_layers)]


def test_estimate_refuses_a_kernel_the_hf_class_lacks():
    """The library API refuses as plan and the CLI do: BLOOM has no SDPA/flash in transformers 5.25."""
    bloom = get_model("bloom-560m")
    layout = Layout(dp=8, zero_stage=1, micro_batch=1, grad_accum=1)
    for kernel in ("sdpa", "flash"):
        training = Training(seq_len=2048, global_batch=8, precision="bf16", optimizer="adamw", attention=kernel)
        with pytest.raises(DstkError, match=f"training.attention: {kernel}") as err:
            estimate(model=bloom, layout=layout, training=training, cluster=_cluster())
        assert "--attention eager" in err.value.hint
        # Megatron runs its own attention: the HF class does not limit it
        estimate(model=bloom, layout=layout, training=training, cluster=_cluster(), engine="megatron")
    estimate(model=bloom, layout=layout, cluster=_cluster(),
             training=Training(seq_len=2048, global_batch=8, precision="bf16", optimizer="adamw", attention="eager"))


def test_lora_first_layer_masked_only_where_it_slides():
    """LoRA on o/down (no q/k/v adapter): the frozen first layer saves nothing. A Qwen2.5-7B whose
    last 8 layers slide keeps 8 layers' masks; one whose every layer slides keeps 27 (not layer 0's)."""
    base = get_model("qwen2.5-7b")
    late = dataclasses.replace(base, sliding_window=4096, sliding_layers=tuple(range(20, 28)))
    every = dataclasses.replace(base, sliding_window=4096)
    per_layer = (saved_activation_bytes(model=every, micro_batch=1, seq_len=8192)
                 - saved_activation_bytes(model=base, micro_batch=1, seq_len=8192)) / 28
    layout = Layout(dp=8, zero_stage=1, micro_batch=1, grad_accum=1)
    training = Training(seq_len=8192, global_batch=8, precision="bf16", optimizer="adamw", attention="sdpa",
                        lora=Lora(rank=8, alpha=16, targets="o,down"))
    act = [estimate(model=m, layout=layout, training=training, cluster=_cluster()).memory.per_gpu.activations_bytes
           for m in (base, late, every)]
    assert act[1] - act[0] == pytest.approx(8 * per_layer, abs=2)
    assert act[2] - act[0] == pytest.approx(27 * per_layer, abs=2)
