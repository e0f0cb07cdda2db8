"""``to_pipeline`` and ``pipeline_from_pretrained``: an HF causal LM as a DeepSpeed
``PipelineModule`` whose ranks each build only their own stage.

Layer order (the index DeepSpeed uses in checkpoint file names ``layer_XX-model_states.pt``):
``0`` embed, ``1..L`` decoder layers, ``L+1`` final norm, ``L+2`` head. A tied head is a
``TiedLayerSpec`` of the embedding with a ``forward_fn`` and is not saved on its own.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from dstk.errors import DstkError
from dstk.pipeline.adapter import PipelineAdapter, adapter_for
from dstk.pipeline.partition import METHODS, LayerCost, StagePlan, format_stages, layer_costs, plan_stages

log = logging.getLogger("dstk.pipeline")

TIED_KEY = "embed"


def layer_names(num_layers: int) -> list[str]:
    """Names of the pipeline layers in order; ``head`` stays even when tied (a spec, not saved)."""
    return ["embed", *(f"layer.{i}" for i in range(num_layers)), "norm", "head"]


def is_tied(model: Any) -> bool:
    """Whether the head's matrix is the input embedding's (HF ties them at post_init)."""
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    return head is not None and embed is not None and head.weight is embed.weight


class _LiveSource:
    """Modules taken from a model already in memory.

    Every ``LayerSpec`` holds its source as an argument and ``PipelineModule`` keeps its specs
    (``_layer_specs``) for the life of the engine, so a source that still pointed at the model
    would keep every other stage's parameters alive on this rank: ``release`` drops the model
    once this rank's layers are built.
    """

    def __init__(self, model: Any):
        self._model = model

    def module(self, path: str):
        assert self._model is not None, "source released: the pipeline's layers are already built"
        return self._model.get_submodule(path)

    def release(self) -> None:
        self._model = None


class _CheckpointSource:
    """Modules materialised from a meta-device model, filled from the safetensors files of an
    HF directory: a rank reads only the tensors of the modules it asks for."""

    def __init__(self, hf_dir: Path, meta_model: Any, adapter: PipelineAdapter, dtype: Any):
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping
        from transformers.core_model_loading import WeightRenaming

        model_type = meta_model.config.model_type
        transforms = [*(get_checkpoint_conversion_mapping(type(meta_model).__name__) or ()),
                      *(get_checkpoint_conversion_mapping(model_type) or ())]
        # Renamings are covered by the adapter's saved_prefixes; tensor conversions are not.
        if any(not isinstance(t, WeightRenaming) for t in transforms):
            raise DstkError(
                f"cannot read {model_type} checkpoints stage by stage: transformers converts their tensors "
                "while loading (e.g. per-expert weights fused into one tensor)",
                hint="load the whole model with AutoModelForCausalLM.from_pretrained and wrap it with to_pipeline",
            )
        self._dir = hf_dir
        self._model = meta_model
        self._adapter = adapter
        self._dtype = dtype
        index = hf_dir / "model.safetensors.index.json"
        if index.exists():
            self._weight_map = json.loads(index.read_text())["weight_map"]
        elif (hf_dir / "model.safetensors").exists():
            from safetensors import safe_open

            with safe_open(hf_dir / "model.safetensors", framework="pt") as f:
                self._weight_map = {k: "model.safetensors" for k in f.keys()}
        else:
            raise DstkError(f"no model.safetensors or model.safetensors.index.json in {hf_dir}",
                            hint="save the model with save_pretrained(..., safe_serialization=True)")
        self.files_read: set[str] = set()
        self.tensors_read: list[str] = []

    def _saved_name(self, key: str) -> str:
        if key in self._weight_map:
            return key
        for live, saved in self._adapter.saved_prefixes:
            if key.startswith(live) and saved + key[len(live):] in self._weight_map:
                return saved + key[len(live):]
        raise DstkError(f"tensor {key!r} is not in {self._dir}",
                        hint="the directory must hold the same architecture as its config.json")

    def module(self, path: str):
        import torch
        from safetensors import safe_open

        module = self._model.get_submodule(path)
        if not any(t.is_meta for t in [*module.parameters(), *module.buffers()]):
            return module  # already materialised (a rotary shared by several layers)
        module.to_empty(device="cpu")
        if self._dtype is not None:
            module.to(self._dtype)
        with torch.no_grad():
            for sub in module.modules():  # non-persistent buffers: rotary inv_freq, Gemma's embed scale
                self._model._init_weights(sub)
            by_file: dict[str, list[tuple[str, torch.Tensor]]] = {}
            for name, tensor in module.state_dict(keep_vars=True).items():
                saved = self._saved_name(f"{path}.{name}")
                by_file.setdefault(self._weight_map[saved], []).append((saved, tensor))
            for file, pairs in by_file.items():
                self.files_read.add(file)
                with safe_open(self._dir / file, framework="pt") as f:
                    for saved, tensor in pairs:
                        tensor.copy_(f.get_tensor(saved))
                        self.tensors_read.append(saved)
        return module

    def release(self) -> None:
        """Drop the meta model (see ``_LiveSource.release``)."""
        self._model = None


def _param_counts(model: Any, adapter: PipelineAdapter, num_layers: int, tied: bool) -> list[int]:
    def count(path: str) -> int:
        return sum(p.numel() for p in model.get_submodule(path).parameters())

    head = 0 if tied else count(adapter.head)
    return [sum(count(p) for _, p in adapter.embed_parts),
            *(count(f"{adapter.layers}.{i}") for i in range(num_layers)),
            sum(count(p) for _, p in adapter.final_parts), head]


def plan_for(model: Any, *, num_stages: int, partition: str = "balanced", seq_len: int | None = None,
             adapter: PipelineAdapter | None = None) -> tuple[list[int], list[StagePlan], list[LayerCost]]:
    """Stage boundaries, per-stage report and per-layer costs for ``model`` (meta tensors are
    fine: only shapes are read)."""
    if partition not in METHODS:
        raise DstkError(f"unknown partition {partition!r}", hint=f"use one of {', '.join(METHODS)}")
    adapter = adapter or adapter_for(model)
    config = model.config
    num_layers = len(model.get_submodule(adapter.layers))
    tied = is_tied(model)
    seq_len = seq_len or min(getattr(config, "max_position_embeddings", 2048) or 2048, 4096)
    costs = layer_costs(
        num_params=_param_counts(model, adapter, num_layers, tied),
        names=layer_names(num_layers),
        hidden_size=config.hidden_size,
        num_heads=config.num_attention_heads,
        vocab_size=config.vocab_size,
        seq_len=seq_len,
        tied_head=tied,
    )
    bounds, stages = plan_stages(costs, num_stages=num_stages, method=partition, seq_len=seq_len)
    return bounds, stages, costs


def _pipeline_class():
    from deepspeed.pipe import PipelineModule

    class HFPipelineModule(PipelineModule):
        """A ``PipelineModule`` cut at boundaries dstk computed (DeepSpeed's own 'parameters'
        method builds every layer on every rank just to count them)."""

        def _partition_layers(self, method):
            bounds = list(method)
            self.parts = bounds
            stage = self._topo.get_coord(self.global_rank).pipe
            self._set_bounds(start=bounds[stage], stop=bounds[stage + 1])

    return HFPipelineModule


def _build(model: Any, source: Any, *, num_stages: int, partition: str, activation_checkpoint_interval: int,
           loss_fn: Any, seq_len: int | None, dynamic_shape: bool):
    from deepspeed.pipe import LayerSpec, TiedLayerSpec

    from dstk.pipeline.stages import DecoderPipe, EmbedPipe, FinalPipe, HeadPipe, TiedHead, causal_lm_loss

    if activation_checkpoint_interval < 0:
        raise DstkError(f"activation_checkpoint_interval must be >= 0, got {activation_checkpoint_interval}")
    adapter = adapter_for(model)
    config = model.config
    num_layers = len(model.get_submodule(adapter.layers))
    tied = is_tied(model)
    bounds, stages, _ = plan_for(model, num_stages=num_stages, partition=partition, seq_len=seq_len, adapter=adapter)
    if tied:
        specs = [TiedLayerSpec(TIED_KEY, EmbedPipe, source, adapter=adapter, tied_weight_attr="tokens.weight")]
    else:
        specs = [LayerSpec(EmbedPipe, source, adapter=adapter)]
    specs += [LayerSpec(DecoderPipe, source, layer_idx=i, config=config, adapter=adapter) for i in range(num_layers)]
    specs.append(LayerSpec(FinalPipe, source, adapter=adapter))
    if tied:
        # The last stage needs only the token matrix of the embedding, not positions or dropout.
        specs.append(TiedLayerSpec(TIED_KEY, EmbedPipe, source, adapter=adapter, roles=("tokens",),
                                   forward_fn=TiedHead(config=config), tied_weight_attr="tokens.weight"))
    else:
        specs.append(LayerSpec(HeadPipe, source, adapter=adapter, config=config))
    pipe = _pipeline_class()(
        layers=specs,
        num_stages=num_stages,
        loss_fn=loss_fn if loss_fn is not None else causal_lm_loss,
        partition_method=bounds,
        activation_checkpoint_interval=activation_checkpoint_interval,
        # Only decoder layers: the embedding's int input cannot go through reentrant checkpointing.
        checkpointable_layers=["DecoderPipe"],
        dynamic_shape=dynamic_shape,
    )
    # The specs stay in pipe._layer_specs; only this rank's modules may stay reachable from them.
    source.release()
    pipe.dstk_stages = stages
    if pipe.global_rank == 0:
        log.info("%s in %d stages (partition=%s):\n%s", type(model).__name__, num_stages, partition,
                 format_stages(stages))
    pipe.dstk_adapter = adapter
    pipe.hf_config = config
    return pipe


def to_pipeline(model: Any, *, num_stages: int, partition: str = "balanced", activation_checkpoint_interval: int = 0,
                loss_fn: Any = None, seq_len: int | None = None, dynamic_shape: bool = False):
    """Wrap an HF ``*ForCausalLM`` into a ``deepspeed.pipe.PipelineModule`` of ``num_stages``.

    Needs ``deepspeed.init_distributed()`` first (world size a multiple of ``num_stages``).
    Batches are ``(inputs, labels)`` with inputs ``input_ids`` or ``(input_ids, attention_mask)``;
    the loss is HF's ``model(..., labels=labels).loss``. The pipeline shares this rank's stage
    modules with ``model`` (no copy: DeepSpeed then trains them in place) and keeps no reference
    to the rest of it, so ``del model`` after wrapping leaves only this stage alive on the rank.
    ``pipe.dstk_stages`` reports per-stage parameters and estimated load.
    Set ``dynamic_shape`` when micro-batches differ in shape.
    """
    return _build(model, _LiveSource(model), num_stages=num_stages, partition=partition,
                  activation_checkpoint_interval=activation_checkpoint_interval, loss_fn=loss_fn,
                  seq_len=seq_len, dynamic_shape=dynamic_shape)


def pipeline_from_pretrained(hf_dir: str | os.PathLike, *, num_stages: int, partition: str = "balanced",
                             activation_checkpoint_interval: int = 0, loss_fn: Any = None, dtype: Any = None,
                             attn_implementation: str | None = None, seq_len: int | None = None,
                             dynamic_shape: bool = False):
    """Like ``to_pipeline`` for a local HF directory (``config.json`` + safetensors, single or
    sharded): the model is laid out on the meta device and each rank reads only the tensors of
    its own stage. ``pipe.dstk_tensors_read`` lists what this rank read."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_dir = Path(hf_dir)
    if not (hf_dir / "config.json").exists():
        raise DstkError(f"{hf_dir} has no config.json", hint="point at a directory written by save_pretrained")
    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    config = AutoConfig.from_pretrained(hf_dir, **kwargs)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype or torch.float32)
    source = _CheckpointSource(hf_dir, model, adapter_for(model), dtype)
    pipe = _build(model, source, num_stages=num_stages, partition=partition,
                  activation_checkpoint_interval=activation_checkpoint_interval, loss_fn=loss_fn,
                  seq_len=seq_len, dynamic_shape=dynamic_shape)
    pipe.dstk_tensors_read = list(source.tensors_read)
    pipe.dstk_files_read = sorted(source.files_read)
    return pipe


