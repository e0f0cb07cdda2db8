"""The model to fine-tune: a preset built from a config (random weights), the plan's own model
config, or a local HF checkpoint directory."""

from __future__ import annotations

import json
import os
from pathlib import Path

from dstk.errors import DstkError, UsageError

PRESETS = {
    # A 2-layer Llama with grouped-query attention: the README demo and the tests (~140k params).
    "tiny-llama": {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512},
    # 4 layers, wider: still seconds per step on a CPU.
    "small-llama": {"model_type": "llama", "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
                    "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 2048},
}


def resolve_config(model: str | None, *, plan: dict, seq_len: int) -> tuple[dict, str | None]:
    """(HF config dict, local checkpoint dir or None). ``model=None`` takes the plan's model."""
    if model is None:
        hf = plan.get("model", {}).get("hf_config")
        if not hf:
            raise UsageError("the plan names no HF model config", hint="pass --model PRESET or --model HF_DIR")
        cfg = dict(hf)
    elif model in PRESETS:
        cfg = dict(PRESETS[model])
    else:
        path = Path(model)
        if not path.exists():
            raise UsageError(f"--model {model}: not a preset ({', '.join(PRESETS)}) nor a local directory",
                             hint="give a preset name or an HF checkpoint directory")
        if not (path / "config.json").is_file():
            raise DstkError(f"--model {model}: no config.json in the directory",
                            hint="point --model at a directory written by save_pretrained")
        try:
            cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
        except ValueError as exc:
            raise DstkError(f"{path / 'config.json'}: not JSON: {exc}", hint="re-save the model") from None
        return cfg, str(path.resolve())
    # Random-init models: the rotary/position table only needs the training length.
    cfg.setdefault("max_position_embeddings", seq_len)
    cfg["max_position_embeddings"] = max(int(cfg["max_position_embeddings"]), seq_len) if model else seq_len
    return cfg, None


def has_weights(path: str | os.PathLike) -> bool:
    p = Path(path)
    return any(p.glob("*.safetensors")) or any(p.glob("pytorch_model*.bin")) or (p / "model.safetensors.index.json").is_file()


def has_tokenizer(path: str | os.PathLike) -> bool:
    p = Path(path)
    return (p / "tokenizer.json").is_file() or (p / "tokenizer.model").is_file() or (p / "vocab.json").is_file()


def write_config(cfg: dict, output_dir: str | os.PathLike) -> None:
    """Write ``cfg`` as an HF config directory (through transformers, so it is a valid one)."""
    from transformers import AutoConfig

    model_type = cfg["model_type"]
    config = AutoConfig.for_model(model_type, **{k: v for k, v in cfg.items() if k != "model_type"})
    config.save_pretrained(str(output_dir))
