"""HF causal LMs as DeepSpeed pipeline modules: wrap, partition, load per stage, export back.

Importing this package imports no torch; the functions import it when called.
"""

from __future__ import annotations

__all__ = ["to_pipeline", "pipeline_from_pretrained", "export_hf", "plan_for", "PipelineAdapter"]


def __getattr__(name: str):
    if name in ("to_pipeline", "pipeline_from_pretrained", "plan_for"):
        from dstk.pipeline import build

        return getattr(build, name)
    if name == "export_hf":
        from dstk.pipeline.export import export_hf

        return export_hf
    if name == "PipelineAdapter":
        from dstk.pipeline.adapter import PipelineAdapter

        return PipelineAdapter
    raise AttributeError(f"module 'dstk.pipeline' has no attribute {name!r}")
