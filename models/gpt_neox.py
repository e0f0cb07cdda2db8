"""GPT-NeoX-20B and Pythia (``GPTNeoXForCausalLM``): parallel attention + MLP residual, partial
rotary, LayerNorm, fused ``query_key_value``, biases, an untied output layer. Source: Black et al.
2022, Biderman et al. 2023; tensor list as in ``transformers/models/gpt_neox/modeling_gpt_neox.py``."""

from __future__ import annotations

from dstk.models.spec import EagerLayer, ModelSpec, linear, norm, rotary_factor

FAMILY = "gpt_neox"
HF_ARCHITECTURE = "GPTNeoXForCausalLM"
MODULES = {
    "embed": "gpt_neox.embed_in",
    "layers": "gpt_neox.layers",
    "final_norm": "gpt_neox.final_layer_norm",
    "lm_head": "lm_head",
    "attention": ("attention.query_key_value", "attention.dense"),
    "mlp": ("mlp.dense_h_to_4h", "mlp.dense_4h_to_h"),
    "norms": ("input_layernorm", "post_attention_layernorm"),
}


def _neox(h, layers, heads, vocab=50304):
    return {"model_type": FAMILY, "hidden_size": h, "num_hidden_layers": layers, "num_attention_heads": heads,
            "intermediate_size": 4 * h, "vocab_size": vocab, "max_position_embeddings": 2048,
            "tie_word_embeddings": False, "use_parallel_residual": True}


PRESETS = {
    "pythia-70m": _neox(512, 6, 8),
    "pythia-160m": _neox(768, 12, 12),
    "pythia-410m": _neox(1024, 24, 16),
    "pythia-1b": _neox(2048, 16, 8),
    "pythia-1.4b": _neox(2048, 24, 16),
    "pythia-2.8b": _neox(2560, 32, 32, vocab=50304),
    "pythia-6.9b": _neox(4096, 32, 32, vocab=50432),
    "pythia-12b": _neox(5120, 36, 40, vocab=50688),
    "gpt-neox-20b": _neox(6144, 44, 64, vocab=50432),
}


def read(cfg: dict, *, name: str) -> ModelSpec:
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    ffn, vocab = cfg.get("intermediate_size", 4 * h), cfg["vocab_size"]
    bias = bool(cfg.get("attention_bias", True))
    tied = bool(cfg.get("tie_word_embeddings", False))
    layer = (norm(h, bias=True) + norm(h, bias=True) + linear(h, 3 * h, bias) + linear(h, h, bias)
             + linear(h, ffn, True) + linear(ffn, h, True))
    return ModelSpec(
        name=name, family=FAMILY, num_layers=cfg["num_hidden_layers"], hidden_size=h, num_heads=heads,
        num_kv_heads=heads, head_dim=h // heads, vocab_size=vocab, ffn_hidden_size=ffn,
        seq_len=cfg.get("max_position_embeddings"), tied_embeddings=tied, gated_mlp=False, norm="layernorm",
        activation=cfg.get("hidden_act", "gelu"), dropout=float(cfg.get("attention_dropout", 0.0) or 0.0),
        embedding_tensors=(vocab * h,), layer_tensors=layer, final_tensors=norm(h, bias=True),
        lm_head_tensors=() if tied else linear(h, vocab, False), hf_config=dict(cfg),
        # GPTNeoXAttention views query_key_value per head and chunks it; rotary on the first
        # rotary_pct of each head, the rest concatenated back.
        eager=EagerLayer(qkv_split="view", rotary_cat=True, rotary_fraction=float(rotary_factor(cfg, default=0.25))),
    )


def hf_config(spec: ModelSpec) -> dict:
    return dict(spec.hf_config)


# --- Pipeline adapter (issue 5, dstk.pipeline) ------------------------------------------------
# Where the HF model keeps what dstk.pipeline cuts into stages (docs/pipeline.md). No torch here.
from dstk.pipeline.adapter import PipelineAdapter  # noqa: E402

# Rotary on part of each head; HF keeps the head as lm_head but saves it as embed_out.
PIPELINE_ADAPTER = PipelineAdapter(
    family=FAMILY,
    embed_parts=(("tokens", MODULES["embed"]), ("dropout", "gpt_neox.emb_dropout")),
    layers=MODULES["layers"],
    final_parts=(("norm", MODULES["final_norm"]),),
    head=MODULES["lm_head"],
    rotary="gpt_neox.rotary_emb",
    saved_prefixes=(("lm_head.", "embed_out."),),
)
