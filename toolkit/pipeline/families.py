"""Pipeline adapters for families that are not Llama-like, used until (or unless) the family's
file in ``models/`` defines its own ``PIPELINE_ADAPTER`` (which wins)."""

from __future__ import annotations

from typing import Any

from dstk.pipeline.adapter import PipelineAdapter


def _opt_embed(parts: dict[str, Any], input_ids, position_ids, attention_mask):
    """OPT adds learned positions after ``project_in`` and numbers them over real tokens only
    (``OPTDecoder.forward``); ``embed_positions`` adds its offset of 2 itself."""
    hidden = parts["tokens"](input_ids)
    if "project_in" in parts:
        hidden = parts["project_in"](hidden)
    return hidden + parts["positions"](attention_mask, 0, position_ids=position_ids)


GPT2 = PipelineAdapter(
    family="gpt2",
    embed_parts=(("tokens", "transformer.wte"), ("positions", "transformer.wpe"), ("dropout", "transformer.drop")),
    layers="transformer.h",
    final_parts=(("norm", "transformer.ln_f"),),
)

GPT_NEOX = PipelineAdapter(
    family="gpt_neox",
    embed_parts=(("tokens", "gpt_neox.embed_in"), ("dropout", "gpt_neox.emb_dropout")),
    layers="gpt_neox.layers",
    final_parts=(("norm", "gpt_neox.final_layer_norm"),),
    rotary="gpt_neox.rotary_emb",
    saved_prefixes=(("lm_head.", "embed_out."),),
)

OPT = PipelineAdapter(
    family="opt",
    embed_parts=(("tokens", "model.decoder.embed_tokens"), ("positions", "model.decoder.embed_positions"),
                 ("project_in", "model.decoder.project_in")),
    layers="model.decoder.layers",
    final_parts=(("norm", "model.decoder.final_layer_norm"), ("project_out", "model.decoder.project_out")),
    positions="cumsum",
    mask_uses_position_ids=False,
    embed_fn=_opt_embed,
)

BUILTIN = {a.family: a for a in (GPT2, GPT_NEOX, OPT)}
