"""Falcon (``FalconForCausalLM``): parallel attention + MLP; Falcon-7B uses multi-query attention
and one LayerNorm per layer, Falcon-40B/180B the "new decoder architecture" with grouped KV heads
and two LayerNorms (``ln_attn``, ``ln_mlp``); no biases, tied lm_head. Source: Almazrouei et al.
2023; tensor list as in ``transformers/models/falcon/modeling_falcon.py``."""

from __future__ import annotations

from dstk.models.spec import EagerLayer, ModelSpec, first, linear, norm

FAMILY = "falcon"
HF_ARCHITECTURE = "FalconForCausalLM"
MODULES = {
    "embed": "transformer.word_embeddings",
    "layers": "transformer.h",
    "final_norm": "transformer.ln_f",
    "lm_head": "lm_head",
    "attention": ("self_attention.query_key_value", "self_attention.dense"),
    "mlp": ("mlp.dense_h_to_4h", "mlp.dense_4h_to_h"),
    "norms": ("input_layernorm", "ln_attn", "ln_mlp", "post_attention_layernorm"),
}

PRESETS = {
    "falcon-7b": {"model_type": FAMILY, "hidden_size": 4544, "num_hidden_layers": 32, "num_attention_heads": 71,
                  "multi_query": True, "parallel_attn": True, "new_decoder_architecture": False,
                  "vocab_size": 65024, "bias": False, "alibi": False, "tie_word_embeddings": True},
    "falcon-40b": {"model_type": FAMILY, "hidden_size": 8192, "num_hidden_layers": 60, "num_attention_heads": 128,
                   "num_kv_heads": 8, "new_decoder_architecture": True, "parallel_attn": True,
                   "vocab_size": 65024, "bias": False, "alibi": False, "tie_word_embeddings": True},
    "falcon-180b": {"model_type": FAMILY, "hidden_size": 14848, "num_hidden_layers": 80, "num_attention_heads": 232,
                    "num_kv_heads": 8, "new_decoder_architecture": True, "parallel_attn": True,
                    "vocab_size": 65024, "bias": False, "alibi": False, "tie_word_embeddings": True},
}


def read(cfg: dict, *, name: str) -> ModelSpec:
    h = first(cfg, "hidden_size", "n_embed", default=4544)
    heads = first(cfg, "num_attention_heads", "n_head", default=71)
    head_dim = h // heads
    new_arch = bool(cfg.get("new_decoder_architecture", False))
    multi_query = bool(cfg.get("multi_query", True))
    if new_arch:
        kv = first(cfg, "num_kv_heads", default=heads)
    else:
        kv = 1 if multi_query else heads
    ffn = first(cfg, "ffn_hidden_size", default=4 * h)
    vocab, bias = cfg.get("vocab_size", 65024), bool(cfg.get("bias", False))
    parallel = bool(cfg.get("parallel_attn", True))
    num_ln = first(cfg, "num_ln_in_parallel_attn", default=2 if new_arch else None)
    norms = 2 if (not parallel or num_ln == 2) else 1
    tied = bool(cfg.get("tie_word_embeddings", True))
    layer = (norm(h, bias=True) * norms + linear(h, (heads + 2 * kv) * head_dim, bias) + linear(h, h, bias)
             + linear(h, ffn, bias) + linear(ffn, h, bias))
    return ModelSpec(
        name=name, family=FAMILY, num_layers=first(cfg, "num_hidden_layers", "n_layer", default=32), hidden_size=h,
        num_heads=heads, num_kv_heads=kv, head_dim=head_dim, vocab_size=vocab, ffn_hidden_size=ffn,
        seq_len=cfg.get("max_position_embeddings", 2048), tied_embeddings=tied, gated_mlp=False, norm="layernorm",
        activation="gelu",
        rotary=not cfg.get("alibi", False), dropout=float(cfg.get("attention_dropout", 0.0) or 0.0),
        embedding_tensors=(vocab * h,), layer_tensors=layer, final_tensors=norm(h, bias=True),
        lm_head_tensors=() if tied else linear(h, vocab, False), hf_config=dict(cfg),
        # FalconAttention.forward as transformers 5.25 rewrote it: the new decoder slices q out of a
        # per-KV-group view and selects k/v; multi-query splits the heads; classic Falcon unbinds
        # per-head (q, k, v) triples. FalconModel always builds the causal mask, so SDPA gets one
        # and k/v are repeated to the query heads (repeat_kv) wherever there are fewer of them.
        # kv_repeated also marks "SDPA is handed a mask" for the estimator (steptime.sdpa_gets_mask:
        # the masked kernel's rate on every score block; memory: the mask saved per layer).
        eager=EagerLayer(qkv_split="group_select" if new_arch else ("split" if multi_query else "unbind"),
                         num_norms=norms, kv_repeated=True),
    )


def hf_config(spec: ModelSpec) -> dict:
    return dict(spec.hf_config)
