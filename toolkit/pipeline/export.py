"""``export_hf``: a DeepSpeed checkpoint (pipeline or ZeRO) back to an HF directory.

Pipeline checkpoints hold one ``layer_XX-model_states.pt`` per saved layer, with the keys of
dstk's stage modules (``tokens.weight``, ``layer.self_attn.q_proj.weight``, ...); the family's
adapter maps them back to HF module paths. ZeRO checkpoints of the unwrapped HF model already use
HF names; DeepSpeed's own ``zero_to_fp32`` gathers their fp32 partitions. Either way the state
goes into an HF model built from the config and is written by ``save_pretrained``, so
transformers' own key conventions (GPT-NeoX saves ``lm_head`` as ``embed_out``; tied heads are
not saved) apply.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dstk.errors import DstkError, UsageError

_LAYER_FILE = re.compile(r"^layer_(\d+)-(?:model_(\d+)-)?model_states\.pt$")
DTYPES = ("fp32", "bf16", "fp16")


@dataclass(kw_only=True, frozen=True, slots=True)
class ExportResult:
    """What ``export_hf`` wrote."""

    output_dir: Path
    kind: str
    """``pipeline`` or ``zero``."""
    tag_dir: Path
    num_tensors: int
    num_params: int


def _tag_dir(checkpoint_dir: Path, tag: str | None) -> Path:
    if tag is not None:
        path = checkpoint_dir / tag
    elif (checkpoint_dir / "latest").is_file():
        path = checkpoint_dir / (checkpoint_dir / "latest").read_text().strip()
    else:
        path = checkpoint_dir
    if not path.is_dir():
        raise UsageError(f"checkpoint tag directory {path} does not exist",
                         hint="pass --tag with one of the subdirectories DeepSpeed wrote (global_stepN)")
    return path


def _load_config(config: Any, places: list[Path]):
    from transformers import AutoConfig, PretrainedConfig

    if isinstance(config, PretrainedConfig):
        return config
    candidates = [Path(config)] if config is not None else places
    for place in candidates:
        file = place / "config.json" if place.is_dir() else place
        if file.is_file():
            return AutoConfig.from_pretrained(file.parent if file.name == "config.json" else file)
    raise UsageError(
        "no HF config.json found for the checkpoint (looked in " + ", ".join(str(p) for p in candidates) + ")",
        hint="pass --config with the HF directory the training started from",
    )


def _pipeline_state(tag_dir: Path, model: Any) -> dict[str, Any]:
    import torch

    from dstk.pipeline.adapter import adapter_for

    adapter = adapter_for(model)
    num_layers = len(model.get_submodule(adapter.layers))
    files: dict[int, Path] = {}
    for path in sorted(tag_dir.iterdir()):
        m = _LAYER_FILE.match(path.name)
        if not m:
            continue
        if m.group(2) not in (None, "00"):
            raise DstkError(f"{path.name}: tensor-parallel pipeline checkpoints are not supported",
                            hint="export a checkpoint trained with tensor parallel size 1")
        files[int(m.group(1))] = path
    roles_at = {0: dict(adapter.embed_parts), num_layers + 1: dict(adapter.final_parts),
                num_layers + 2: {"head": adapter.head}}
    state: dict[str, Any] = {}
    for idx, path in files.items():
        layer_state = torch.load(path, map_location="cpu", weights_only=True)
        for key, tensor in layer_state.items():
            role, _, rest = key.partition(".")
            if 1 <= idx <= num_layers:
                if role != "layer":
                    raise DstkError(f"{path.name}: unexpected key {key!r} for decoder layer {idx - 1}")
                state[f"{adapter.layers}.{idx - 1}.{rest}"] = tensor
            elif idx in roles_at and role in roles_at[idx]:
                state[f"{roles_at[idx][role]}.{rest}"] = tensor
            else:
                raise DstkError(f"{path.name}: key {key!r} does not belong to layer {idx} of a "
                                f"{type(model).__name__} pipeline",
                                hint="pass --config with the model the pipeline was built from")
    return state


def _zero_state(checkpoint_dir: Path, tag_dir: Path) -> dict[str, Any]:
    import torch

    # ZeRO-3 writes zero_pp_rank_0_mp_rank_00_model_states.pt, the others mp_rank_00_model_states.pt
    found = sorted(tag_dir.glob("*mp_rank_00_model_states.pt"))
    states = found[0] if found else tag_dir / "mp_rank_00_model_states.pt"
    if not states.is_file():
        raise DstkError(f"{tag_dir} holds neither layer_XX-model_states.pt files (pipeline) "
                        "nor mp_rank_00_model_states.pt (ZeRO)", hint="point at the directory save_checkpoint wrote")
    saved = torch.load(states, map_location="cpu", weights_only=False)
    if any(tag_dir.glob("*optim_states.pt")) and saved.get("ds_config", {}).get("zero_optimization", {}).get("stage", 0):
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        return dict(get_fp32_state_dict_from_zero_checkpoint(str(tag_dir.parent), tag=tag_dir.name))
    module = saved.get("module")
    if not module:
        raise DstkError(f"{states} has no module weights", hint="was it written by a pipeline engine? "
                        "then the layer_XX files are missing")
    return dict(module)


def _check_replaceable(output_dir: Path, checkpoint_dir: Path) -> None:
    """What ``--force`` may replace whole: an HF model directory (a ``config.json``, no
    subdirectories: what ``save_pretrained`` writes) that does not hold the checkpoint being read;
    a project or home directory given by mistake is refused, nothing is deleted."""
    out, ckpt = os.path.realpath(output_dir), os.path.realpath(checkpoint_dir)
    if ckpt == out or ckpt.startswith(out + os.sep):
        raise UsageError(f"--output {output_dir} holds the checkpoint {checkpoint_dir}: --force would delete it",
                         hint="export to a directory outside the checkpoint")
    dirs = sorted(p.name for p in output_dir.iterdir() if p.is_dir() and not p.is_symlink())
    if not (output_dir / "config.json").is_file() or dirs:
        what = f"holds directories ({', '.join(dirs[:3])})" if dirs else "has no config.json"
        raise UsageError(f"--output {output_dir} {what}: not an earlier export, so --force does not replace it",
                         hint="choose a new --output directory, or remove that one yourself")


def export_hf(checkpoint_dir: str | os.PathLike, output_dir: str | os.PathLike, *, config: Any = None,
              tag: str | None = None, dtype: str | None = None, force: bool = False) -> ExportResult:
    """Write the weights of a DeepSpeed checkpoint as an HF directory (config, safetensors).

    ``config``: an HF config, or a directory/``config.json`` (default: the one in the checkpoint
    directory or its tag directory). ``dtype``: fp32/bf16/fp16 (default: as saved). Refuses to
    write into a directory that exists and is not empty unless ``force``, which replaces an earlier
    export whole (``_check_replaceable``: an HF directory, not one holding the checkpoint); writes
    all of it or nothing (``dstk.render.write_files``: a temporary sibling renamed into place, or
    swapped with the old directory in one step, nothing of it carried over).
    """
    import torch
    from transformers import AutoModelForCausalLM

    from dstk.render import check_output_dir, write_files

    checkpoint_dir, output_dir = Path(checkpoint_dir), Path(output_dir)
    if torch.distributed.is_available() and torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:
        # transformers' save_pretrained silently writes nothing on a rank other than 0
        raise DstkError(f"export_hf called on rank {torch.distributed.get_rank()}",
                        hint="call it on rank 0 only, after a barrier that follows save_checkpoint")
    if not checkpoint_dir.is_dir():
        raise UsageError(f"checkpoint directory {checkpoint_dir} does not exist")
    if output_dir.is_dir() and any(output_dir.iterdir()):
        if not force:
            raise UsageError(f"{output_dir} exists and is not empty",
                             hint="choose a new --output directory, or pass --force to replace an earlier export")
        _check_replaceable(output_dir, checkpoint_dir)
    check_output_dir(output_dir)  # before the model is loaded: below a file, a dangling link, unwritable
    if dtype is not None and dtype not in DTYPES:
        raise UsageError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    tag_dir = _tag_dir(checkpoint_dir, tag)
    # finetune keeps the model config in OUTPUT/model (the export) and OUTPUT/prepared/model_config,
    # next to OUTPUT/checkpoints.
    hf_config = _load_config(config, [checkpoint_dir, tag_dir, checkpoint_dir.parent,
                                      checkpoint_dir.parent / "model", checkpoint_dir.parent / "prepared" / "model_config"])
    model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    is_pipeline = any(_LAYER_FILE.match(p.name) for p in tag_dir.iterdir())
    state = _pipeline_state(tag_dir, model) if is_pipeline else _zero_state(checkpoint_dir, tag_dir)

    tied = {k for k, v in (getattr(model, "_tied_weights_keys", None) or {}).items()} if hf_config.tie_word_embeddings else set()
    expected = set(model.state_dict())
    missing = sorted(expected - set(state) - tied)
    unexpected = sorted(set(state) - expected)
    if missing or unexpected:
        raise DstkError(
            f"the checkpoint does not match {type(model).__name__}: "
            f"missing {missing[:5]}{' ...' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}",
            hint="pass --config with the model the checkpoint was trained from",
        )
    saved_dtype = next(iter(state.values())).dtype
    model.load_state_dict(state, strict=False)
    model.tie_weights()
    target = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}.get(dtype, saved_dtype)
    model.to(target)

    def fill(tmp: Path) -> None:
        model.save_pretrained(tmp)
        if not (tmp / "config.json").is_file():
            raise DstkError(f"save_pretrained wrote nothing into {tmp}")

    # generate's writer: a hidden locked sibling, fsynced, renamed into place; a kill at any moment
    # leaves no --output or the old one (empty, or with --force the earlier export, whole), and the
    # next export removes the orphaned sibling.
    write_files(output_dir, {}, force=force, fill=fill, keep_others=False)
    return ExportResult(output_dir=output_dir, kind="pipeline" if is_pipeline else "zero", tag_dir=tag_dir,
                        num_tensors=len(state), num_params=sum(p.numel() for p in model.parameters()))
