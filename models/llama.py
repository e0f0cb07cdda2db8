"""Llama 2 and Llama 3.x (``LlamaForCausalLM``), and the Llama-shaped layer other families reuse.

One layer: RMSNorm, q/k/v/o projections (grouped-query when ``num_key_value_heads`` <
``num_attention_heads``), RMSNorm, SwiGLU MLP (gate, up, down). Sources: Touvron et al. 2023
(Llama 2), Grattafiori et al. 2024 (Llama 3); tensor list as in
``transformers/models/llama/modeling_llama.py``.
"""

from __future__ import annotations

from dstk.models.spec import ModelSpec, first, linear, norm

FAMILY = "llama"
HF_ARCHITECTURE = "LlamaForCausalLM"
MODULES = {
    "embed": "model.embed_tokens",
    "layers": "model.layers",
    "final_norm": "model.norm",
    "lm_head": "lm_head",
    "attention": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"),
    "mlp": ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"),
    "norms": ("input_layernorm", "post_attention_layernorm"),
}


def _llama(h, layers, heads, kv, ffn, vocab, positions, *, tied=False, theta=10000.0, head_dim=None):
    cfg = {"model_type": FAMILY, "hidden_size": h, "num_hidden_layers": layers, "num_attention_heads": heads,
           "num_key_value_heads": kv, "intermediate_size": ffn, "vocab_size": vocab,
           "max_position_embeddings": positions, "tie_word_embeddings": tied, "rope_theta": theta,
           "rms_norm_eps": 1e-5}
    if head_dim is not None:
        cfg["head_dim"] = head_dim
    return cfg


PRESETS = {
    "llama-2-7b": _llama(4096, 32, 32, 32, 11008, 32000, 4096),
    "llama-2-13b": _llama(5120, 40, 40, 40, 13824, 32000, 4096),
    "llama-2-70b": _llama(8192, 80, 64, 8, 28672, 32000, 4096),
    "llama-3-8b": _llama(4096, 32, 32, 8, 14336, 128256, 8192, theta=500000.0),
    "llama-3-70b": _llama(8192, 80, 64, 8, 28672, 128256, 8192, theta=500000.0),
    "llama-3.1-8b": _llama(4096, 32, 32, 8, 14336, 128256, 131072, theta=500000.0),
    "llama-3.1-70b": _llama(8192, 80, 64, 8, 28672, 128256, 131072, theta=500000.0),
    "llama-3.1-405b": _llama(16384, 126, 128, 8, 53248, 128256, 131072, theta=500000.0),
    "llama-3.2-1b": _llama(2048, 16, 32, 8, 8192, 128256, 131072, tied=True, theta=500000.0, head_dim=64),
    "llama-3.2-3b": _llama(3072, 28, 24, 8, 8192, 128256, 131072, tied=True, theta=500000.0, head_dim=128),
}


def llama_like(cfg: dict, *, name: str, family: str, qkv_bias: bool, o_bias: bool, mlp_bias: bool = False,
               qk_norm: bool = False, tied_default: bool = False, num_experts: int = 1,
               experts_per_token: int = 1) -> ModelSpec:
    """A spec for any Llama-shaped decoder; the family decides the biases, QK-norm, tying and MoE.

    MoE (Mixtral): the MLP becomes a router ``hidden x experts`` plus per-expert SwiGLU weights,
    stored fused by transformers 5 as ``gate_up_proj [E, 2f, h]`` and ``down_proj [E, h, f]``.
    """
    h = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    kv = first(cfg, "num_key_value_heads", default=heads)
    head_dim = first(cfg, "head_dim", default=h // heads)
    ffn = cfg["intermediate_size"]
    vocab = cfg["vocab_size"]
    tied = bool(cfg.get("tie_word_embeddings", tied_default))
    q, k = heads * head_dim, kv * head_dim
    attn = linear(h, q, qkv_bias) + linear(h, k, qkv_bias) + linear(h, k, qkv_bias) + linear(q, h, o_bias)
    if qk_norm:
        attn += norm(head_dim, bias=False) * 2
    if num_experts > 1:
        expert = (2 * ffn * h, h * ffn)
        mlp = linear(h, num_experts, False) + (num_experts * expert[0], num_experts * expert[1])
    else:
        expert = ()
        mlp = linear(h, ffn, mlp_bias) * 2 + linear(ffn, h, mlp_bias)
    layer = norm(h, bias=False) + attn + norm(h, bias=False) + mlp
    return ModelSpec(
        name=name, family=family, num_layers=cfg["num_hidden_layers"], hidden_size=h, num_heads=heads,
        num_kv_heads=kv, head_dim=head_dim, vocab_size=vocab, ffn_hidden_size=ffn,
        seq_len=cfg.get("max_position_embeddings"), tied_embeddings=tied, gated_mlp=True, norm="rmsnorm",
        num_experts=num_experts, experts_per_token=experts_per_token,
        activation=cfg.get("hidden_act", "silu"), dropout=float(cfg.get("attention_dropout", 0.0) or 0.0),
        embedding_tensors=(vocab * h,), layer_tensors=layer, expert_tensors=expert,
        final_tensors=norm(h, bias=False), lm_head_tensors=() if tied else linear(h, vocab, False),
        hf_config=dict(cfg),
    )


def read(cfg: dict, *, name: str) -> ModelSpec:
    """A spec from a Llama ``config.json`` (``attention_bias`` and ``mlp_bias`` default to False)."""
    bias = bool(cfg.get("attention_bias", False))
    return llama_like(cfg, name=name, family=FAMILY, qkv_bias=bias, o_bias=bias,
                      mlp_bias=bool(cfg.get("mlp_bias", False)))


def hf_config(spec: ModelSpec) -> dict:
    """The keys that build the real ``LlamaForCausalLM`` (``AutoConfig.for_model(**keys)``)."""
    return dict(spec.hf_config)


# --- Pipeline adapter (issue 5, dstk.pipeline) ------------------------------------------------
# Where the HF model keeps what dstk.pipeline cuts into stages (docs/pipeline.md). No torch here.
from dstk.pipeline.adapter import PipelineAdapter  # noqa: E402

PIPELINE_ADAPTER = PipelineAdapter(
    family=FAMILY,
    embed_parts=(("tokens", MODULES["embed"]),),
    layers=MODULES["layers"],
    final_parts=(("norm", MODULES["final_norm"]),),
    head=MODULES["lm_head"],
    rotary="model.rotary_emb",
)
