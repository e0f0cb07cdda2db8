"""Phi-3 (``Phi3ForCausalLM``): Llama-shaped but with fused projections, ``qkv_proj``
(``hidden -> (heads + 2 kv_heads) * head_dim``) and ``gate_up_proj`` (``hidden -> 2 ffn``), no
biases. Source: Abdin et al. 2024; tensor list as in ``transformers/models/phi3/modeling_phi3.py``.

Sliding window: ``Phi3Config.sliding_window`` (default None) on every layer (``Phi3Model`` builds
``create_sliding_window_causal_mask`` when it is set; ``Phi3Attention`` passes it to the kernel).
The published 4k configs (``microsoft/Phi-3-mini-4k-instruct``, ``Phi-3-medium-4k-instruct``)
say ``"sliding_window": 2047``, so the presets do: from 2047 tokens on SDPA gets a mask."""

from __future__ import annotations

from dstk.models.spec import EagerLayer, ModelSpec, first, linear, norm, rotary_factor

FAMILY = "phi3"
HF_ARCHITECTURE = "Phi3ForCausalLM"
MODULES = {
    "embed": "model.embed_tokens",
    "layers": "model.layers",
    "final_norm": "model.norm",
    "lm_head": "lm_head",
    "attention": ("self_attn.qkv_proj", "self_attn.o_proj"),
    "mlp": ("mlp.gate_up_proj", "mlp.down_proj"),
    "norms": ("input_layernorm", "post_attention_layernorm"),
}


def _phi3(h, layers, heads, kv, ffn, positions=4096, window=2047):
    return {"model_type": FAMILY, "hidden_size": h, "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": kv, "intermediate_size": ffn, "vocab_size": 32064,
            "max_position_embeddings": positions, "tie_word_embeddings": False, "sliding_window": window}


PRESETS = {
    "phi-3-mini": _phi3(3072, 32, 32, 32, 8192),
    "phi-3-medium": _phi3(5120, 40, 40, 10, 17920),
}


def read(cfg: dict, *, name: str) -> ModelSpec:
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    kv = first(cfg, "num_key_value_heads", default=heads)
    head_dim = first(cfg, "head_dim", default=h // heads)
    ffn, vocab = cfg["intermediate_size"], cfg["vocab_size"]
    tied = bool(cfg.get("tie_word_embeddings", False))
    layer = (norm(h, bias=False) + linear(h, (heads + 2 * kv) * head_dim, False) + linear(heads * head_dim, h, False)
             + norm(h, bias=False) + linear(h, 2 * ffn, False) + linear(ffn, h, False))
    return ModelSpec(
        name=name, family=FAMILY, num_layers=cfg["num_hidden_layers"], hidden_size=h, num_heads=heads,
        num_kv_heads=kv, head_dim=head_dim, vocab_size=vocab, ffn_hidden_size=ffn,
        seq_len=cfg.get("max_position_embeddings"), tied_embeddings=tied, gated_mlp=True, norm="rmsnorm",
        activation=cfg.get("hidden_act", "silu"), dropout=float(cfg.get("attention_dropout", 0.0) or 0.0),
        embedding_tensors=(vocab * h,), layer_tensors=layer, final_tensors=norm(h, bias=False),
        lm_head_tensors=() if tied else linear(h, vocab, False), hf_config=dict(cfg),
        sliding_window=cfg.get("sliding_window"),
        # Phi3Attention slices q/k/v out of qkv_proj; Phi3MLP chunks gate_up_proj; rotary runs on
        # q[..., :rotary_dim] and concatenates the rest back (even when nothing is left).
        eager=EagerLayer(qkv_split="slice", fused_gate_up=True, rotary_cat=True,
                         rotary_fraction=float(rotary_factor(cfg, default=1.0))),
    )


def hf_config(spec: ModelSpec) -> dict:
    return dict(spec.hf_config)
