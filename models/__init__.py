"""Model families known to dstk: one file per family (dimensions, parameter count, HF module
names, pipeline adapter).

    get_model("llama-3-8b")          # a preset slug (``list_models()``, ``dstk models``)
    get_model("path/to/config.json") # or an HF config.json, or a directory holding one
    ModelSpec.generic(num_layers=..., hidden_size=..., num_heads=..., vocab_size=...)

No torch here: a spec is pure arithmetic over the family's tensor list.
"""

from __future__ import annotations

import functools
import importlib
import os

from dstk.models.spec import ModelSpec

__all__ = ["FAMILIES", "ModelSpec", "family_module", "get_model", "list_models", "presets", "read_hf_config"]

FAMILIES: tuple[str, ...] = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "phi3", "gpt2",
                             "gpt_neox", "opt", "falcon", "bloom")
"""Family modules, named by HF ``model_type``."""


def family_module(model_type: str):
    """``dstk.models.<model_type>``; a DstkError naming the known families otherwise."""
    if model_type not in FAMILIES and model_type != "generic":
        from dstk.errors import DstkError

        raise DstkError(f"model family {model_type!r} is not in dstk's catalog",
                        hint=f"known families: {', '.join(FAMILIES)}; or give the dimensions "
                             "(--num-layers --hidden-size --num-heads --vocab-size)")
    return importlib.import_module(f"dstk.models.{model_type}")


@functools.cache
def presets() -> dict[str, ModelSpec]:
    """Every preset, slug -> spec, in catalog order (built once)."""
    out = {}
    for family in FAMILIES:
        module = family_module(family)
        for slug, cfg in module.PRESETS.items():
            out[slug] = module.read(cfg, name=slug)
    return out


def list_models() -> list[ModelSpec]:
    """The presets, family by family, smallest first."""
    return list(presets().values())


def read_hf_config(path: str | os.PathLike) -> dict:
    """An HF ``config.json`` (the file, or a directory holding it), read locally."""
    from dstk.errors import DstkError
    from dstk.intent import parse_user_text

    file = os.path.join(path, "config.json") if os.path.isdir(path) else os.fspath(path)
    try:
        with open(file, "rb") as fh:
            raw = fh.read(64 << 20)
    except FileNotFoundError:
        raise DstkError(f"{file}: no such file", hint="give a preset (dstk models) or an HF config.json") from None
    except OSError as exc:
        raise DstkError(f"{file}: cannot read it as JSON: {exc}", location=file) from None
    if not raw.lstrip().startswith(b"{"):
        raise DstkError(f"{file}: cannot read it as JSON: it does not start with {{", location=file,
                        hint="give a preset (dstk models) or an HF config.json")
    # strict, as the intent: a key given twice (json keeps the last silently) is refused with file:line
    cfg, _lines = parse_user_text(raw, source=file, what="HF config", example="the model's config.json")
    if not isinstance(cfg, dict) or "model_type" not in cfg:
        raise DstkError(f"{file}: no model_type key; this does not look like an HF config.json", location=file)
    return cfg


def get_model(name_or_path: str) -> ModelSpec:
    """A spec from a preset slug (case-insensitive) or an HF config path."""
    from dstk.errors import DstkError

    catalog = presets()
    slug = name_or_path.strip().lower()
    if slug in catalog:
        return catalog[slug]
    if os.path.exists(name_or_path):
        cfg = read_hf_config(name_or_path)
        module = family_module(cfg["model_type"])
        try:
            return module.read(cfg, name=os.fspath(name_or_path))
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
            raise DstkError(f"{name_or_path}: incomplete {cfg['model_type']} config ({exc!r})",
                            location=os.fspath(name_or_path)) from None
    import difflib

    near = difflib.get_close_matches(slug, list(catalog), n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(near)}? " if near else ""
    raise DstkError(f"unknown model {name_or_path!r}: neither a preset nor an existing path",
                    hint=hint + "`dstk models` lists the presets")

# Pipeline API (issue 5), re-exported lazily: importing dstk.models must not import torch.
_PIPELINE_NAMES = ("to_pipeline", "pipeline_from_pretrained", "export_hf", "plan_for")


def __getattr__(name: str):
    if name in _PIPELINE_NAMES:
        import dstk.pipeline

        return getattr(dstk.pipeline, name)
    raise AttributeError(f"module 'dstk.models' has no attribute {name!r}")
