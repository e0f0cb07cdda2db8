"""A generic decoder from its dimensions alone (``--num-layers --hidden-size ...``): the Llama
architecture, built by ``ModelSpec.generic`` (``dstk.models.spec``), which this module names as
a family so that ``family_module("generic")`` answers."""

from __future__ import annotations

from dstk.models.spec import ModelSpec, default_ffn

FAMILY = "generic"
build = ModelSpec.generic

__all__ = ["FAMILY", "build", "default_ffn", "hf_config"]


def hf_config(spec: ModelSpec) -> dict:
    return dict(spec.hf_config)
