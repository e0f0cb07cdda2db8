"""OPT (``OPTForCausalLM``): learned positions with an offset of 2 rows, separate q/k/v/out
projections with biases, ReLU MLP, tied lm_head; OPT-350m projects a 512-wide embedding in and
out and puts LayerNorm after the block. Source: Zhang et al. 2022; tensor list as in
``transformers/models/opt/modeling_opt.py``."""

from __future__ import annotations

from dstk.models.spec import EagerLayer, ModelSpec, linear, norm

FAMILY = "opt"
HF_ARCHITECTURE = "OPTForCausalLM"
MODULES = {
    "embed": ("model.decoder.embed_tokens", "model.decoder.embed_positions", "model.decoder.project_in"),
    "layers": "model.decoder.layers",
    "final_norm": ("model.decoder.final_layer_norm", "model.decoder.project_out"),
    "lm_head": "lm_head",
    "attention": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj"),
    "mlp": ("fc1", "fc2"),
    "norms": ("self_attn_layer_norm", "final_layer_norm"),
}


def _opt(h, layers, heads, **extra):
    return {"model_type": FAMILY, "hidden_size": h, "num_hidden_layers": layers, "num_attention_heads": heads,
            "ffn_dim": 4 * h, "vocab_size": 50272, "max_position_embeddings": 2048, "word_embed_proj_dim": h,
            "do_layer_norm_before": True, "tie_word_embeddings": True, **extra}


PRESETS = {
    "opt-125m": _opt(768, 12, 12),
    "opt-350m": _opt(1024, 24, 16, word_embed_proj_dim=512, do_layer_norm_before=False),
    "opt-1.3b": _opt(2048, 24, 32),
    "opt-2.7b": _opt(2560, 32, 32),
    "opt-6.7b": _opt(4096, 32, 32),
    "opt-13b": _opt(5120, 40, 40),
    "opt-30b": _opt(7168, 48, 56),
    "opt-66b": _opt(9216, 64, 72),
}


def read(cfg: dict, *, name: str) -> ModelSpec:
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    ffn, vocab = cfg.get("ffn_dim", 4 * h), cfg["vocab_size"]
    proj = cfg.get("word_embed_proj_dim") or h
    positions = cfg.get("max_position_embeddings", 2048)
    bias = bool(cfg.get("enable_bias", True))
    affine = bool(cfg.get("layer_norm_elementwise_affine", True))
    ln = norm(h, bias=True) if affine else ()
    tied = bool(cfg.get("tie_word_embeddings", True))
    layer = linear(h, h, bias) * 4 + ln + linear(h, ffn, bias) + linear(ffn, h, bias) + ln
    embed = (vocab * proj, (positions + 2) * h) + (linear(proj, h, False) if proj != h else ())
    final = ln if cfg.get("do_layer_norm_before", True) and not cfg.get("_remove_final_layer_norm", False) else ()
    final += linear(h, proj, False) if proj != h else ()
    return ModelSpec(
        name=name, family=FAMILY, num_layers=cfg["num_hidden_layers"], hidden_size=h, num_heads=heads,
        num_kv_heads=heads, head_dim=h // heads, vocab_size=vocab, ffn_hidden_size=ffn, seq_len=positions,
        tied_embeddings=tied, gated_mlp=False, norm="layernorm", rotary=False,
        activation=cfg.get("activation_function", "relu"), dropout=float(cfg.get("dropout", 0.1)),
        embedding_tensors=embed, layer_tensors=layer, final_tensors=final,
        lm_head_tensors=() if tied else linear(proj, vocab, False), hf_config=dict(cfg),
        eager=EagerLayer(q_scale=True),  # OPTAttention: q_proj(x) * scaling
    )


def hf_config(spec: ModelSpec) -> dict:
    return dict(spec.hf_config)


# --- Pipeline adapter (issue 5, dstk.pipeline) ------------------------------------------------
# Where the HF model keeps what dstk.pipeline cuts into stages (docs/pipeline.md). No torch here.
from dstk.pipeline.adapter import PipelineAdapter  # noqa: E402


def _pipeline_embed(parts, input_ids, position_ids, attention_mask):
    """OPT adds learned positions after ``project_in`` and numbers them over real tokens only
    (``OPTDecoder.forward``); ``embed_positions`` adds its offset of 2 itself."""
    hidden = parts["tokens"](input_ids)
    if "project_in" in parts:
        hidden = parts["project_in"](hidden)
    return hidden + parts["positions"](attention_mask, 0, position_ids=position_ids)


# project_in/out and the final norm are optional in OPT configs: absent ones are dropped.
PIPELINE_ADAPTER = PipelineAdapter(
    family=FAMILY,
    embed_parts=(("tokens", "model.decoder.embed_tokens"), ("positions", "model.decoder.embed_positions"),
                 ("project_in", "model.decoder.project_in")),
    layers=MODULES["layers"],
    final_parts=(("norm", "model.decoder.final_layer_norm"), ("project_out", "model.decoder.project_out")),
    head=MODULES["lm_head"],
    positions="cumsum",
    mask_uses_position_ids=False,
    embed_fn=_pipeline_embed,
)
