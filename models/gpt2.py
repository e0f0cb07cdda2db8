"""GPT-2 (``GPT2LMHeadModel``): learned positions, pre-LayerNorm, fused ``c_attn`` (Conv1D
``h -> 3h``), GELU MLP ``h -> 4h -> h``, biases everywhere, lm_head tied to ``wte``. Source:
Radford et al. 2019; tensor list as in ``transformers/models/gpt2/modeling_gpt2.py``."""

from __future__ import annotations

from dstk.models.spec import ModelSpec, first, linear, norm

FAMILY = "gpt2"
HF_ARCHITECTURE = "GPT2LMHeadModel"
MODULES = {
    "embed": ("transformer.wte", "transformer.wpe"),
    "layers": "transformer.h",
    "final_norm": "transformer.ln_f",
    "lm_head": "lm_head",
    "attention": ("attn.c_attn", "attn.c_proj"),
    "mlp": ("mlp.c_fc", "mlp.c_proj"),
    "norms": ("ln_1", "ln_2"),
}


def _gpt2(h, layers, heads):
    return {"model_type": FAMILY, "n_embd": h, "n_layer": layers, "n_head": heads, "vocab_size": 50257,
            "n_positions": 1024, "tie_word_embeddings": True}


PRESETS = {
    "gpt2": _gpt2(768, 12, 12),
    "gpt2-medium": _gpt2(1024, 24, 16),
    "gpt2-large": _gpt2(1280, 36, 20),
    "gpt2-xl": _gpt2(1600, 48, 25),
}


def read(cfg: dict, *, name: str) -> ModelSpec:
    h = first(cfg, "n_embd", "hidden_size")
    heads = first(cfg, "n_head", "num_attention_heads")
    inner = first(cfg, "n_inner", default=4 * h)
    vocab, positions = cfg.get("vocab_size", 50257), first(cfg, "n_positions", "max_position_embeddings", default=1024)
    tied = bool(cfg.get("tie_word_embeddings", True))
    layer = (norm(h, bias=True) + linear(h, 3 * h, True) + linear(h, h, True)
             + norm(h, bias=True) + linear(h, inner, True) + linear(inner, h, True))
    return ModelSpec(
        name=name, family=FAMILY, num_layers=first(cfg, "n_layer", "num_hidden_layers"), hidden_size=h,
        num_heads=heads, num_kv_heads=heads, head_dim=h // heads, vocab_size=vocab, ffn_hidden_size=inner,
        seq_len=positions, tied_embeddings=tied, gated_mlp=False, norm="layernorm", rotary=False,
        activation=cfg.get("activation_function", "gelu_new"), dropout=float(cfg.get("attn_pdrop", 0.1)),
        embedding_tensors=(vocab * h, positions * h), layer_tensors=layer, final_tensors=norm(h, bias=True),
        lm_head_tensors=() if tied else linear(h, vocab, False), hf_config=dict(cfg),
    )


def hf_config(spec: ModelSpec) -> dict:
    return dict(spec.hf_config)


# --- Pipeline adapter (issue 5, dstk.pipeline) ------------------------------------------------
# Where the HF model keeps what dstk.pipeline cuts into stages (docs/pipeline.md). No torch here.
from dstk.pipeline.adapter import PipelineAdapter  # noqa: E402

# Learned positions added to the token embedding, then dropout; tied head (TiedLayerSpec).
PIPELINE_ADAPTER = PipelineAdapter(
    family=FAMILY,
    embed_parts=(("tokens", "transformer.wte"), ("positions", "transformer.wpe"), ("dropout", "transformer.drop")),
    layers=MODULES["layers"],
    final_parts=(("norm", MODULES["final_norm"]),),
    head=MODULES["lm_head"],
)
