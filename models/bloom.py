"""BLOOM (``BloomForCausalLM``): ALiBi (no position embeddings), a LayerNorm right after the
word embedding, fused ``query_key_value`` with biases, GELU MLP ``h -> 4h -> h``, tied lm_head,
a 250,880-token vocabulary. Source: BigScience 2022; tensor list as in
``transformers/models/bloom/modeling_bloom.py``."""

from __future__ import annotations

from dstk.models.spec import EagerLayer, ModelSpec, first, linear, norm

FAMILY = "bloom"
HF_ARCHITECTURE = "BloomForCausalLM"
MODULES = {
    "embed": ("transformer.word_embeddings", "transformer.word_embeddings_layernorm"),
    "layers": "transformer.h",
    "final_norm": "transformer.ln_f",
    "lm_head": "lm_head",
    "attention": ("self_attention.query_key_value", "self_attention.dense"),
    "mlp": ("mlp.dense_h_to_4h", "mlp.dense_4h_to_h"),
    "norms": ("input_layernorm", "post_attention_layernorm"),
}


def _bloom(h, layers, heads):
    return {"model_type": FAMILY, "hidden_size": h, "n_layer": layers, "n_head": heads, "vocab_size": 250880,
            "tie_word_embeddings": True}


PRESETS = {
    "bloom-560m": _bloom(1024, 24, 16),
    "bloom-1b1": _bloom(1536, 24, 16),
    "bloom-1b7": _bloom(2048, 24, 16),
    "bloom-3b": _bloom(2560, 30, 32),
    "bloom-7b1": _bloom(4096, 30, 32),
    "bloom-176b": _bloom(14336, 70, 112),
}


def read(cfg: dict, *, name: str) -> ModelSpec:
    h = first(cfg, "hidden_size", "n_embed", default=64)
    heads = first(cfg, "n_head", "num_attention_heads", default=8)
    vocab = cfg.get("vocab_size", 250880)
    tied = bool(cfg.get("tie_word_embeddings", True))
    layer = (norm(h, bias=True) + linear(h, 3 * h, True) + linear(h, h, True)
             + norm(h, bias=True) + linear(h, 4 * h, True) + linear(4 * h, h, True))
    return ModelSpec(
        name=name, family=FAMILY, num_layers=first(cfg, "n_layer", "num_hidden_layers", default=2), hidden_size=h,
        num_heads=heads, num_kv_heads=heads, head_dim=h // heads, vocab_size=vocab, ffn_hidden_size=4 * h,
        seq_len=cfg.get("seq_length"), tied_embeddings=tied, gated_mlp=False, norm="layernorm", activation="bloom_gelu",
        rotary=False, dropout=float(cfg.get("attention_dropout", 0.0) or 0.0),
        embedding_tensors=(vocab * h,) + norm(h, bias=True), layer_tensors=layer, final_tensors=norm(h, bias=True),
        lm_head_tensors=() if tied else linear(h, vocab, False), hf_config=dict(cfg),
        # BloomAttention: q/k/v selected out of a per-head view, reshaped for baddbmm (copies).
        eager=EagerLayer(qkv_split="select", heads_reshaped=True),
        # BloomForCausalLM declares neither _supports_sdpa nor _supports_flash_attn (transformers
        # 5.25): attn_implementation="sdpa" or "flash_attention_2" raises, the default runs eager.
        attention_kernels=("eager",),
    )


def hf_config(spec: ModelSpec) -> dict:
    return dict(spec.hf_config)
