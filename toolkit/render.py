"""Render a plan into the files a run needs: DeepSpeed JSON (plain and for HF's Trainer),
Megatron-LM arguments, ``plan.json`` and a short README.

This is the only module that knows DeepSpeed's and Megatron's key names; everything else speaks
of stages, degrees and bytes. Every function here is pure (data in, data out) except
``write_run_dir``, which writes all files atomically, and ``write_presets``.

    python -m dstk.render --write-presets     # regenerate templates/presets/ from this code
    python -m dstk.render --check-presets     # exit 1 if they are out of date
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shlex
import tempfile
from pathlib import Path

from dstk.intent import TrainingIntent
from dstk.layout import Layout

AUTO = "auto"


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class ModelDims:
    """What the Megatron renderer needs to know of a decoder (filled from ``dstk.models``)."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    ffn_hidden_size: int
    vocab_size: int
    max_position_embeddings: int | None = None
    gated_mlp: bool = True
    """Gated MLP (SwiGLU: Llama, Mistral, Qwen; GeGLU: Gemma); False for GPT-2-style GELU MLPs."""
    activation: str = "silu"
    """The MLP activation as HF names it (``hidden_act``): silu, gelu_pytorch_tanh (Gemma), gelu_new, relu, ..."""
    norm: str = "rmsnorm"
    """rmsnorm or layernorm."""
    rotary: bool = True
    """Rotary position embeddings (else learned absolute positions)."""
    tied_embeddings: bool = False
    bias: bool = False
    """Biases in every linear layer (q/k/v, o, both MLP matrices: GPT-2, BLOOM): no ``--disable-bias-linear``."""
    qkv_bias: bool = False
    """Biases on the q/k/v projections (Qwen2): ``--add-qkv-bias`` beside ``--disable-bias-linear``."""
    o_bias: bool = False
    """A bias on the attention output projection when not every linear has one (Llama with
    ``attention_bias: true``): Megatron-LM cannot say it (``megatron_notes``)."""
    mlp_bias: bool = False
    """Biases on the MLP matrices when not every linear has one (Llama's ``mlp_bias``): likewise."""
    qk_norm: bool = False
    """RMSNorm on q and k per head (Qwen3): ``--qk-layernorm``."""
    head_dim: int | None = None
    """Per-head width when it is not ``hidden / heads`` (Gemma-7B 256, Qwen3-0.6B 128): ``--kv-channels``."""
    rotary_base: float | None = None
    """RoPE theta (Llama-3 5e5, Qwen2 1e6); None: Megatron-LM's default 10,000."""
    num_experts: int = 1
    """Experts per MoE layer (Mixtral 8): ``--num-experts``; 1 for a dense model."""
    experts_per_token: int = 1
    """Experts each token is routed to (Mixtral 2): ``--moe-router-topk``."""
    sliding_window: int | None = None
    """Keys each query sees under sliding-window attention, itself included (HF ``sliding_window``:
    Mistral-7B-v0.1 4096, Phi-3-mini-4k 2047): ``--window-size W-1,0``; None: full causal attention."""
    sliding_layers: tuple[int, ...] | None = None
    """The layers (0-based) that slide when only some do (Qwen2's ``max_window_layers``):
    ``--window-attn-skip-freq``; None: every layer."""


# --- DeepSpeed --------------------------------------------------------------------------------

_DS_OPTIMIZER = {  # dstk name -> DeepSpeed/torch type name (case matters: torch names are looked up as is)
    "adamw": "AdamW",
    "adam": "Adam",
    "sgd": "SGD",
    "lion": "Lion",
    "adafactor": "Adafactor",
}
# Optimizers DeepSpeed's ZeRO wrapper knows; others need zero_allow_untested_optimizer.
_ZERO_TESTED = {"adamw", "adam", "lion"}


def _optimizer_block(training: TrainingIntent, *, hf: bool, torch_adam: bool) -> dict:
    name = training.optimizer
    lr = AUTO if hf else training.lr
    wd = AUTO if hf else training.weight_decay
    params: dict = {"lr": lr}
    if name in ("adamw", "adam"):
        params.update(
            betas=AUTO if hf else list(training.betas),
            eps=AUTO if hf else training.eps,
            weight_decay=wd,
        )
        if name == "adam":
            params["adam_w_mode"] = False  # DeepSpeed's "Adam" is AdamW unless told otherwise
        if torch_adam:
            params["torch_adam"] = True  # no fused_adam CUDA/C++ build (CPU ranks)
    elif name == "lion":
        params.update(betas=AUTO if hf else [training.betas[0], 0.99], weight_decay=wd)
    elif name == "sgd":
        params.update(momentum=0.9, weight_decay=wd)
    elif name == "adafactor":
        params.update(weight_decay=wd)
    return {"type": _DS_OPTIMIZER[name], "params": params}


def _scheduler_block(training: TrainingIntent, *, hf: bool) -> dict:
    """WarmupCosineLR / WarmupDecayLR / WarmupLR; DeepSpeed wants warmup_num_steps >= 1."""
    total = training.steps
    warmup = max(1, min(training.warmup_steps, total))
    if training.schedule == "cosine":
        params = {
            "total_num_steps": AUTO if hf else total,
            "warmup_num_steps": AUTO if hf else warmup,
            "warmup_min_ratio": 0.0,
            "cos_min_ratio": training.min_lr_ratio,
            "warmup_type": "linear",
        }
        return {"type": "WarmupCosineLR", "params": params}
    params = {
        "warmup_min_lr": AUTO if hf else 0.0,
        "warmup_max_lr": AUTO if hf else training.lr,
        "warmup_num_steps": AUTO if hf else warmup,
        "warmup_type": "linear",
    }
    if training.schedule == "linear":
        params["total_num_steps"] = AUTO if hf else total
        return {"type": "WarmupDecayLR", "params": params}
    return {"type": "WarmupLR", "params": params}


def _offload_block(device: str, *, nvme_path: str | None) -> dict:
    block: dict = {"device": device, "pin_memory": True}
    if device == "nvme":
        block["nvme_path"] = nvme_path
    return block


def _bucket_keys(layout: Layout, buffers) -> dict:
    """The ``zero_optimization`` keys of a ``dstk.estimate.ZeroBuffers``, written out in full so
    DeepSpeed's 5e8-element defaults never apply unseen (``dstk.estimate.buckets``)."""
    keys: dict = {
        "reduce_bucket_size": int(buffers.reduce_bucket_size),
        "allgather_bucket_size": int(buffers.allgather_bucket_size),
        "overlap_comm": buffers.overlaps(layout.zero_stage),
        "contiguous_gradients": bool(buffers.contiguous_gradients),
    }
    if layout.zero_stage == 3:
        keys.update(stage3_prefetch_bucket_size=int(buffers.prefetch_bucket_size),
                    stage3_param_persistence_threshold=int(buffers.param_persistence_threshold),
                    stage3_max_live_parameters=int(buffers.max_live_parameters),
                    stage3_max_reuse_distance=int(buffers.max_reuse_distance))
    return keys


def _zero_block(layout: Layout, *, hf: bool, nvme_path: str | None, buffers=None) -> dict:
    zero: dict = {"stage": layout.zero_stage}
    if buffers is not None and layout.zero_stage >= 1:
        # Explicit in both flavours: the HF file then runs with the very buffers the plan priced.
        zero.update(_bucket_keys(layout, buffers))
    elif layout.zero_stage >= 2:
        zero.update(overlap_comm=True, contiguous_gradients=True)
    if layout.zero_stage >= 1 and hf and buffers is None:
        zero["reduce_bucket_size"] = AUTO  # HF fills hidden_size**2
    if layout.offload_optimizer != "none":
        zero["offload_optimizer"] = _offload_block(layout.offload_optimizer, nvme_path=nvme_path)
    if layout.offload_params != "none":
        zero["offload_param"] = _offload_block(layout.offload_params, nvme_path=nvme_path)
    if layout.zero_stage == 3:
        # Save a consolidated 16-bit checkpoint, so the result loads into HF without zero_to_fp32.
        zero["stage3_gather_16bit_weights_on_model_save"] = True
        if hf and buffers is None:
            zero["stage3_prefetch_bucket_size"] = AUTO
            zero["stage3_param_persistence_threshold"] = AUTO
    return zero


def ds_config(
    *,
    layout: Layout,
    training: TrainingIntent,
    hf: bool = False,
    torch_adam: bool = False,
    nvme_path: str | None = None,
    world_independent: bool = False,
    buffers=None,
) -> dict:
    """The DeepSpeed config for ``layout``.

    ``buffers`` (a ``dstk.estimate.ZeroBuffers``, from ``dstk.estimate.buckets.choose_buffers``)
    are written out in full in both flavours, so the file runs with the buffers the plan priced;
    without them (the presets: no model) the HF flavour says "auto" for the bucket sizes.

    ``hf=True`` writes "auto" wherever transformers' Trainer fills the value from its
    ``TrainingArguments`` (batch triad, clipping, fp16/bf16, ZeRO bucket sizes), so the two cannot
    disagree, and has no ``optimizer`` / ``scheduler`` block: the Trainer builds its own from
    ``optim`` and ``lr_scheduler_type`` (``training_arguments``); a DeepSpeed block would silently
    replace them (intent.py has no field to ask for DeepSpeed's own). The one exception: with
    optimizer offload it keeps DeepSpeed's optimizer block ("auto" numbers; see the comment below). ``world_independent=True`` leaves out
    ``train_batch_size`` so DeepSpeed derives it as micro x accumulation x data-parallel size
    (the presets, and AutoTP, see below). Recomputation itself is switched on by the training script
    (``model.gradient_checkpointing_enable()``, or the pipeline's checkpoint interval).
    """
    if hf:
        config: dict = {
            "train_batch_size": AUTO,
            "train_micro_batch_size_per_gpu": AUTO,
            "gradient_accumulation_steps": AUTO,
            "gradient_clipping": AUTO,
        }
    else:
        config = {}
        # Under AutoTP, deepspeed.initialize checks the triad against *all* ranks (it passes no
        # mpu to DeepSpeedConfig), while the engine's data-parallel size is world / tp: any
        # train_batch_size counting real replicas fails. Leave it out and DeepSpeed derives it.
        if not world_independent and layout.tp == 1:
            config["train_batch_size"] = layout.global_batch
        config.update(
            train_micro_batch_size_per_gpu=layout.micro_batch,
            gradient_accumulation_steps=layout.grad_accum,
            gradient_clipping=training.grad_clip,
        )
    if (training.precision or "bf16") == "bf16":  # None: not resolved against a GPU (presets, tests)
        config["bf16"] = {"enabled": AUTO if hf else True}
    elif training.precision == "fp16":
        config["fp16"] = {
            "enabled": AUTO if hf else True,
            "loss_scale": 0,  # dynamic
            "initial_scale_power": 16,
            "loss_scale_window": 1000,
            "hysteresis": 2,
            "min_loss_scale": 1,
        }
    config["zero_optimization"] = _zero_block(layout, hf=hf, nvme_path=nvme_path, buffers=buffers)
    if layout.zero_stage >= 1 and training.optimizer not in _ZERO_TESTED:
        config["zero_allow_untested_optimizer"] = True
    # The HF flavour leaves both out: a DeepSpeed optimizer/scheduler block silently replaces the
    # Trainer's ``optim`` / ``lr_scheduler_type`` (transformers ``deepspeed_optim_sched``); the Trainer
    # builds them from training_args.json instead (``training_arguments`` below). Except the optimizer
    # under optimizer offload: DeepSpeed refuses a client optimizer other than DeepSpeedCPUAdam/Lion
    # there (deepspeed/runtime/engine.py:2342-2346), so accelerate swaps the Trainer's for
    # DeepSpeedCPUAdam keeping only lr and weight_decay (accelerate 1.16 utils/deepspeed.py:29-47,
    # map_pytorch_optim_to_deepspeed): betas and eps reset to defaults, SGD becomes Adam. The HF file
    # keeps DeepSpeed's block then, its numbers "auto" filled from the Trainer's (HF scheduler with it).
    if not hf or layout.offload_optimizer != "none":
        config["optimizer"] = _optimizer_block(training, hf=hf, torch_adam=torch_adam)
    if not hf:
        config["scheduler"] = _scheduler_block(training, hf=hf)
    if layout.recompute != "none":
        config["activation_checkpointing"] = {
            # Partitioning saved activations across the TP group only helps when there is one.
            "partition_activations": layout.tp > 1,
            "contiguous_memory_optimization": False,
            "cpu_checkpointing": False,
        }
    if layout.pp > 1:
        config["pipeline"] = {
            "pipe_partitioned": layout.tp > 1,
            "grad_partitioned": layout.tp > 1,
            # Read by DeepSpeed's PipelineEngine: recompute every layer's forward in backward.
            "activation_checkpoint_interval": 1 if layout.recompute == "full" else 0,
        }
        from dstk.estimate.memory import pipeline_grad_accum_dtype

        # Sum the micro-batches' gradients in fp32 (BF16_Optimizer), not bf16: priced by the estimate.
        accum = pipeline_grad_accum_dtype(pp=layout.pp, zero_stage=layout.zero_stage, precision=training.precision,
                                          grad_accum=layout.grad_accum, offload_optimizer=layout.offload_optimizer)
        if accum:
            config["data_types"] = {"grad_accum_dtype": accum}
    if layout.tp > 1:
        config["tensor_parallel"] = {"autotp_size": layout.tp}
    config["steps_per_print"] = 10
    config["wall_clock_breakdown"] = False
    return config


# --- Megatron-LM ------------------------------------------------------------------------------


def stage_layers(num_layers: int, num_stages: int) -> tuple[int, ...]:
    """Layers per pipeline stage, as Megatron can express it: the middle stages even, the
    remainder on the first and last (which also hold the embedding and the output layer, so
    they get the fewer layers when the split is uneven).

    >>> stage_layers(32, 4), stage_layers(30, 4), stage_layers(5, 2)
    ((8, 8, 8, 8), (7, 8, 8, 7), (2, 3))
    """
    from dstk.layout import megatron_stage_layers

    return megatron_stage_layers(num_layers=num_layers, pp=num_stages)


def pipeline_layout_text(split) -> str:
    """megatron-core's ``pipeline_model_parallel_layout`` for decoder layers ``split`` per stage
    (``PipelineParallelLayerLayout.parse_str_to_list``: ``E`` embedding, ``t`` one decoder layer,
    ``L`` loss and output layer, ``|`` between stages). Written out without ``*``, so that
    ``$(cat megatron.args)`` leaves nothing for the shell to glob.

    >>> pipeline_layout_text((2, 3, 1))
    'Ett|ttt|tL'
    """
    return "E" + "|".join("t" * n for n in split) + "L"


def _plan_split(plan: dict, layout: Layout) -> tuple[int, ...] | None:
    """Decoder layers per stage that the plan's estimate priced (``memory.per_stage[].num_layers``)."""
    stages = (plan.get("memory") or {}).get("per_stage")
    if not isinstance(stages, list) or len(stages) != layout.pp or layout.pp == 1:
        return None
    counts = [s.get("num_layers") if isinstance(s, dict) else None for s in stages]
    return tuple(counts) if all(isinstance(n, int) for n in counts) else None


def _number(x: float) -> int | float:
    """``x`` as a person writes it: 3e-05, not 2.9999999999999997e-05 (``lr x min_lr_ratio``); an
    integral value as an int (``--rotary-base 500000``)."""
    x = float(f"{x:.12g}")
    return int(x) if x.is_integer() and abs(x) >= 1 else x


_TANH_GELUS = ("gelu_pytorch_tanh", "gelu_new", "gelu_fast", "gelu_accurate", "bloom_gelu")
"""HF's tanh approximations of GELU (``transformers/activations.py``; BLOOM's own ``bloom_gelu``)."""


def _megatron_activation(model: ModelDims) -> tuple[str | None, str | None]:
    """(the Megatron-LM activation flag, a note when it is not the HF model's function).

    Megatron-LM's ``pretrain_gpt.py`` activations (``megatron/training/arguments.py`` and
    ``argument_utils.core_transformer_config_from_args``, NVIDIA/Megatron-LM d98e8a64): the default
    erf GELU, not gated; ``--swiglu`` (gated SiLU); ``--quick-geglu`` (gated ``x * sigmoid(1.702 x)``,
    ``megatron/core/fusions/fused_bias_geglu.py quick_gelu``); ``--squared-relu``. There is no flag
    for a gated GELU (Gemma's GeGLU, ``hidden_act: gelu_pytorch_tanh``) nor for a plain ReLU (OPT);
    ``--openai-gelu`` is parsed but no longer read. The tanh and erf GELUs differ by < 5e-4, so a
    plain tanh-GELU MLP (GPT-2) keeps the default without a note; quick-GELU differs from GELU
    by up to 0.021, so a GeGLU model gets ``--quick-geglu`` (the same matrices, memory and time)
    and a note saying so."""
    act = model.activation
    core = ("construct megatron-core's TransformerConfig in your own script with gated_linear_unit="
            f"{model.gated_mlp} and activation_func=")
    if model.gated_mlp:
        if act in ("silu", "swish"):
            return "--swiglu", None
        if act == "quick_gelu":
            return "--quick-geglu", None
        if act == "gelu" or act in _TANH_GELUS:
            fn = 'functools.partial(torch.nn.functional.gelu, approximate="tanh")' if act != "gelu" \
                else "torch.nn.functional.gelu"
            return "--quick-geglu", (
                f"the MLP is a GeGLU ({act}); Megatron-LM has no flag for it (--swiglu is SiLU), so megatron.args "
                "says --quick-geglu: the same matrices, memory and step time, but x*sigmoid(1.702x) in place of "
                "GELU (up to 0.021 apart), so HF weights will not give the same outputs. To build the model "
                f"exactly, {core}{fn}")
        return "--swiglu", (f"the MLP is a gated {act}; Megatron-LM has no flag for it, so megatron.args says "
                            "--swiglu (the same matrices, memory and step time, but SiLU). To build the model "
                            f"exactly, {core}your {act}")
    if act == "gelu" or act in _TANH_GELUS:
        return None, None
    fn = "torch.nn.functional.relu" if act == "relu" else f"your {act}"
    return None, (f"the MLP activation is {act}; Megatron-LM has no flag for it (--squared-relu is relu squared), "
                  f"so megatron.args keeps Megatron's default GELU (the same matrices, memory and step time). "
                  f"To build the model exactly, {core}{fn}")


def megatron_notes(model: ModelDims) -> list[str]:
    """What ``megatron.args`` cannot say about ``model``, one sentence each (empty when Megatron-LM
    builds the HF model exactly): the activation (``_megatron_activation``) and biases on some
    linear layers but not all. Megatron-LM has bias on every linear (``add_bias_linear``, the
    default) or on none (``--disable-bias-linear``), plus ``--add-qkv-bias`` for q/k/v alone
    (``transformer_config.py`` ``add_bias_linear``/``add_qkv_bias``); an o_proj or MLP bias alone
    has no flag, so megatron.args leaves it out and says so. Written into the run README and
    printed by ``dstk generate``."""
    notes = []
    note = _megatron_activation(model)[1]
    if note:
        notes.append(note)
    missing = [name for name, has in (("o_proj", model.o_bias), ("the MLP", model.mlp_bias)) if has and not model.bias]
    if missing:
        notes.append(f"the model has biases on {' and '.join(missing)} but not on every linear layer; Megatron-LM "
                     "biases every linear or none (--add-qkv-bias adds q/k/v alone), so megatron.args leaves "
                     "them out (a few parameters per layer; HF weights will not load as they are)")
    return notes


def megatron_window_args(model: ModelDims) -> list[tuple[str, str]]:
    """Megatron-LM's sliding-window options for ``model`` (NVIDIA/Megatron-LM
    ``megatron/training/arguments.py``: ``--window-size`` read by ``tuple_type``, ``"4095,0"`` ->
    ``(4095, 0)``; ``--window-attn-skip-freq`` by ``moe_freq_type``, a Python list expression of
    digits, ``[]()+*,`` where 1 marks a sliding layer). ``TransformerConfig.window_size`` is
    (left, right): query ``i`` sees keys ``i - left .. i + right``
    (``megatron/core/transformer/utils.py get_sliding_window_causal_mask``; TransformerEngine's
    and FlashAttention's ``window_size`` the same), so HF's window of ``W`` keys, the query
    included (transformers' ``sliding_window_overlay``: ``kv_idx > q_idx - W``), is ``(W - 1, 0)``.
    Which layers slide: ``is_layer_window_attention`` (1-based ``layer_number``), every layer
    without the skip pattern, else ``pattern[layer_number - 1]``; the pattern is written run by run
    (``[0]*28+[1]*4``), which ``$(cat megatron.args)`` passes as it is unless a file of a matching
    name sits in the working directory (bash leaves an unmatched glob alone)."""
    if model.sliding_window is None:
        return []
    out = [("--window-size", f"{model.sliding_window - 1},0")]
    if model.sliding_layers is not None:
        flags = [1 if i in set(model.sliding_layers) else 0 for i in range(model.num_layers)]
        runs = [(flag, len(list(group))) for flag, group in itertools.groupby(flags)]
        out.append(("--window-attn-skip-freq", "+".join(f"[{flag}]*{n}" for flag, n in runs)))
    return out


MEGATRON_ATTENTION_BACKEND = {"flash": "flash", "eager": "unfused"}
"""``--attention-backend`` for the plan's attention kernel (megatron-core's ``AttnBackend``).
``eager`` is priced as materialised scores with a fused softmax (``steptime.layer_seconds``): that
is TransformerEngine's ``unfused`` attention, which takes a sliding window as a mask. Left to
Megatron's default ``auto``, TransformerEngine would pick its flash or fused kernel and the run
would not be the one planned. (``local``, Megatron's own unfused attention, needs ``--spec local``
in current Megatron-LM.) ``sdpa`` has no Megatron meaning: ``auto``, priced as a fused kernel."""


def megatron_args(*, layout: Layout, training: TrainingIntent, model: ModelDims,
                  split: tuple[int, ...] | None = None) -> list[str]:
    """Megatron-LM ``pretrain_gpt.py`` arguments for the same layout, one option per item.

    ``split``: decoder layers per stage that the plan priced (a DeepSpeed-engine plan prices the
    cut of DeepSpeed's pipeline module, ``dstk.pipeline.partition.decoder_layers_per_stage``); it
    is written as it is: nothing when even, ``--decoder-first/last-pipeline-num-layers`` when the
    middle stages are even, else ``--pipeline-model-parallel-layout``. None: the layout's own
    first/last stages, or ``stage_layers``."""
    args: list[str] = []

    def opt(name: str, value=None) -> None:
        args.append(name if value is None else f"{name} {value}")

    opt("--tensor-model-parallel-size", layout.tp)
    opt("--pipeline-model-parallel-size", layout.pp)
    if layout.uneven_stages:
        layout.stage_layers(model.num_layers)  # a split megatron-core would refuse is a ValueError here
        if layout.first_stage_layers is not None:
            opt("--decoder-first-pipeline-num-layers", layout.first_stage_layers)
        if layout.last_stage_layers is not None:
            opt("--decoder-last-pipeline-num-layers", layout.last_stage_layers)
    elif layout.pp > 1:
        layers = tuple(split) if split is not None else stage_layers(model.num_layers, layout.pp)
        if len(layers) != layout.pp or sum(layers) != model.num_layers or min(layers) < 1:
            raise ValueError(f"split: {list(layers)} does not put {model.num_layers} layers on {layout.pp} stages")
        if len(set(layers)) > 1 and layout.virtual_stages > 1:
            raise ValueError(f"split: {list(layers)} is uneven; interleaving needs the layout's first/last stages")
        if len(set(layers)) > 1 and len(set(layers[1:-1])) <= 1:
            opt("--decoder-first-pipeline-num-layers", layers[0])
            opt("--decoder-last-pipeline-num-layers", layers[-1])
        elif len(set(layers)) > 1:  # middle stages that differ: only a layout string says it
            opt("--pipeline-model-parallel-layout", pipeline_layout_text(layers))
    if layout.virtual_stages > 1 and layout.uneven_stages:
        # Megatron-LM's arguments.py refuses --num-layers-per-virtual-pipeline-stage with uneven stages.
        opt("--num-virtual-stages-per-pipeline-rank", layout.virtual_stages)
    elif layout.virtual_stages > 1:
        opt("--num-layers-per-virtual-pipeline-stage", model.num_layers // (layout.pp * layout.virtual_stages))
    if layout.sequence_parallel:
        opt("--sequence-parallel")
    opt("--micro-batch-size", layout.micro_batch)
    opt("--global-batch-size", layout.global_batch)
    if layout.recompute == "selective":
        opt("--recompute-granularity", "selective")
    elif layout.recompute == "full":
        opt("--recompute-granularity", "full")
        opt("--recompute-method", "uniform")
        opt("--recompute-num-layers", 1)
    if layout.zero_stage >= 1:
        opt("--use-distributed-optimizer")  # Megatron's ZeRO-1: optimizer states sharded over DP
    opt("--num-layers", model.num_layers)
    opt("--hidden-size", model.hidden_size)
    opt("--ffn-hidden-size", model.ffn_hidden_size)
    opt("--num-attention-heads", model.num_heads)
    if model.head_dim is not None and model.head_dim * model.num_heads != model.hidden_size:
        opt("--kv-channels", model.head_dim)
    if model.num_kv_heads != model.num_heads:
        opt("--group-query-attention")
        opt("--num-query-groups", model.num_kv_heads)
    opt("--seq-length", training.seq_len)
    opt("--max-position-embeddings", max(training.seq_len, model.max_position_embeddings or 0))
    opt("--vocab-size", model.vocab_size)
    flag = _megatron_activation(model)[0]
    if flag:
        opt(flag)
    if flag == "--quick-geglu" and model.bias:  # megatron-core's mlp.py fuses a bias with gelu or swiglu only
        opt("--no-bias-gelu-fusion")
    opt("--normalization", "RMSNorm" if model.norm == "rmsnorm" else "LayerNorm")
    opt("--position-embedding-type", "rope" if model.rotary else "learned_absolute")
    if model.rotary and model.rotary_base is not None and model.rotary_base != 10000:
        opt("--rotary-base", _number(model.rotary_base))  # Megatron-LM reads an int
    if model.num_experts > 1:  # else Megatron-LM builds a dense model of the expert's width
        opt("--num-experts", model.num_experts)
        opt("--moe-router-topk", model.experts_per_token)
    if not model.tied_embeddings:
        opt("--untie-embeddings-and-output-weights")
    if not model.bias:
        opt("--disable-bias-linear")
        if model.qkv_bias:
            opt("--add-qkv-bias")
    if model.qk_norm:
        opt("--qk-layernorm")
    for name, value in megatron_window_args(model):
        opt(name, value)
    # The kernel the plan priced (``MEGATRON_ATTENTION_BACKEND``); sdpa leaves Megatron's "auto".
    if training.attention in MEGATRON_ATTENTION_BACKEND:
        opt("--attention-backend", MEGATRON_ATTENTION_BACKEND[training.attention])
    if (training.precision or "bf16") in ("bf16", "fp16"):
        opt(f"--{training.precision or 'bf16'}")
    opt("--optimizer", "sgd" if training.optimizer == "sgd" else "adam")
    opt("--lr", training.lr)
    opt("--min-lr", _number(training.lr * training.min_lr_ratio))
    opt("--lr-decay-style", training.schedule)
    opt("--lr-warmup-iters", max(1, min(training.warmup_steps, training.steps)))
    opt("--train-iters", training.steps)
    opt("--weight-decay", training.weight_decay)
    opt("--clip-grad", training.grad_clip)
    if training.optimizer in ("adamw", "adam"):
        opt("--adam-beta1", training.betas[0])
        opt("--adam-beta2", training.betas[1])
        opt("--adam-eps", training.eps)
    return args


# --- the run directory ------------------------------------------------------------------------


def lora_readme_note(*, lora: dict, family: str | None) -> str:
    """The run README's LoRA note: the plan's memory and time hold only with the adapters on a frozen
    base, so a script that launches ``ds_config.json`` must add them itself (peft's ``LoraConfig``
    with the plan's rank, alpha, dropout and target module paths; ``dstk finetune --plan`` does)."""
    from dstk.errors import DstkError
    from dstk.train.lora import resolve_targets

    try:
        targets = list(resolve_targets(family=family, targets=lora.get("targets"))) if family else None
    except DstkError:
        targets = None
    shown = repr(targets) if targets else repr(lora.get("targets") or "all-linear")
    quant = ("; QLoRA: load the base in 4-bit first (`BitsAndBytesConfig(load_in_4bit=True, "
             "bnb_4bit_quant_type=\"nf4\")`)") if lora.get("bits") == 4 else ""
    return (f"- LoRA: the memory and step time above are for rank-{lora['rank']} adapters on a frozen base. "
            "`dstk finetune --plan . --data FILE --output DIR` adds them; your own script must add them before "
            "`deepspeed.initialize` or the Trainer: `model = peft.get_peft_model(model, peft.LoraConfig("
            f"r={lora['rank']}, lora_alpha={lora['alpha']:g}, lora_dropout={lora.get('dropout') or 0:g}, "
            f"target_modules={shown}))`{quant}. Without them every parameter trains, which needs far more memory "
            "(the LoRA line under \"Why this layout\" gives the full fine-tune's figure).")


def _hardware_line(plan: dict) -> str:
    """The README's word on a ``--hardware`` file (``plan.json``'s ``cluster.hardware``): which file
    priced the plan and what it changed of the catalog's entry; empty for catalog figures."""
    record = (plan.get("cluster") or {}).get("hardware")
    if not isinstance(record, dict):
        return ""
    changed = ", ".join(k for k in record.get("gpu_fields") or {} if k != "name") or "nothing of the GPU entry"
    made = f" ({record['profile']})" if record.get("profile") else ""
    return (f"\nHardware figures from `{record.get('file')}`{made}, not the catalog's: {changed}; "
            f"`dstk plan`/`estimate` take it with `--hardware`.")


def megatron_layout_note(*, model, layout: Layout, training, cluster, usable_bytes: int) -> str | None:
    """What ``megatron.args`` of a DeepSpeed plan that Megatron-LM cannot run as planned costs there:
    it keeps the plan's dp/tp/pp, but Megatron-LM has no ZeRO-2/3 and no DeepSpeed offload (its
    ``--use-distributed-optimizer`` shards the optimizer states only, ZeRO-1), so each GPU holds
    every parameter and gradient of its stage. The figure is the estimate of that layout on the
    Megatron engine (``engine="megatron"``: fp32 main gradients, the distributed optimizer). Llama-3-70B
    on 64 H100s (ZeRO-3 dp=64) would need about 416 GiB per GPU there: the README offered the
    command with the plan's 71.5 GiB above it. None where the layout runs as planned (ZeRO 0/1, no
    offload), for LoRA (the README rules Megatron-LM out) and on CPU ranks."""
    import dataclasses

    from dstk.estimate import estimate

    offload = layout.offload_optimizer != "none" or layout.offload_params != "none"
    if (layout.zero_stage < 2 and not offload) or getattr(training, "lora", None) is not None or cluster.gpu.is_cpu \
            or isinstance(model, int):
        return None
    same = dataclasses.replace(layout, zero_stage=1, offload_optimizer="none", offload_params="none")
    need = estimate(model=model, layout=same, training=training, cluster=cluster, engine="megatron")
    total = need.memory.per_gpu.total_bytes
    what = f"ZeRO-{layout.zero_stage}" if layout.zero_stage >= 2 else ""
    what += (" or " if what and offload else "") + ("DeepSpeed's offload" if offload else "")
    verdict = (f"which does not fit in the {usable_bytes / 2**30:.1f} GiB usable: plan with `--engine megatron` "
               f"for a layout Megatron-LM runs" if total > usable_bytes else "which fits")
    return (f"megatron.args keeps this layout (dp={layout.dp}, tp={layout.tp}, pp={layout.pp}), but Megatron-LM "
            f"has no {what}: its distributed optimizer (ZeRO-1) needs about {total / 2**30:.1f} GiB per GPU here, "
            f"{verdict}")


def run_readme(*, plan: dict, world_size: int, num_nodes: int, gpus_per_node: int, cpu: bool,
               megatron_notes: tuple[str, ...] = (), megatron_layout: str | None = None) -> str:
    """A short README.md for a run directory: what the plan is and how to launch it; ``megatron_notes``
    (``megatron_notes``): what ``megatron.args`` cannot say about the model; ``megatron_layout``
    (``megatron_layout_note``): what its layout costs on Megatron-LM when that differs from the plan."""
    layout = plan["layout"]
    gib = plan["memory"]["per_gpu"]["total_bytes"] / 2**30
    step = plan["time"]["step_seconds"]
    launcher = f"deepspeed --num_gpus {gpus_per_node}" if num_nodes == 1 else (
        f"deepspeed --hostfile hostfile --num_nodes {num_nodes} --num_gpus {gpus_per_node} --master_addr FIRST_HOST"
    )
    kind = ", ".join(
        part
        for part in (
            f"dp={layout['dp']}",
            f"tp={layout['tp']}" if layout["tp"] > 1 else "",
            f"pp={layout['pp']}" if layout["pp"] > 1 else "",
            f"ZeRO-{layout['zero_stage']}",
            f"optimizer offload to {layout['offload_optimizer']}" if layout["offload_optimizer"] != "none" else "",
            f"parameter offload to {layout['offload_params']}" if layout["offload_params"] != "none" else "",
            f"recompute={layout['recompute']}" if layout["recompute"] != "none" else "",
        )
        if part
    )
    why = "\n".join(f"- {line}" for line in plan.get("why", []))
    hosts_flag, hosts_note = "", ""
    if num_nodes > 1:  # the runner's hostfile and FIRST_HOST are the user's to fill: say how
        example = ",".join(f"node{i}:{gpus_per_node}" for i in range(min(num_nodes, 2)))
        hosts_flag = f" --hosts {example}{',...' if num_nodes > 2 else ''}"
        hosts_note = (f"\n(`hostfile`: one `HOST slots={gpus_per_node}` line for each of the {num_nodes} nodes; "
                      "FIRST_HOST: the first one's address. `dstk launch --hosts` writes that file.)\n")
    notes = []
    if layout["recompute"] != "none" and layout["pp"] == 1:
        notes.append("- Recompute is on: call `model.gradient_checkpointing_enable()` (HF) before training.")
    if layout["pp"] > 1:
        stages = (plan.get("memory") or {}).get("per_stage") or []
        split = [s.get("num_layers") for s in stages if isinstance(s, dict)]
        seq = (plan.get("training") or {}).get("seq_len")
        said = f" (the plan prices decoder layers {split} per stage)" if len(split) == layout["pp"] else ""
        notes.append(
            f"- Pipeline{said}: build a `deepspeed.pipe.PipelineModule` with `num_stages={layout['pp']}` "
            f"(`dstk.models.to_pipeline(model, num_stages={layout['pp']}"
            + (f", seq_len={seq}" if seq else "") + ")` makes that cut for HF models) and call "
            "`engine.train_batch()`; `megatron.args` writes the same split for Megatron-LM."
        )
    if cpu:
        notes.append("- CPU ranks: DeepSpeed uses its CPU accelerator; use the gloo backend and bf16/fp32.")
    lora = (plan.get("training") or {}).get("lora")
    if lora:
        notes.insert(0, lora_readme_note(lora=lora, family=(plan.get("model") or {}).get("family")))
    notes_text = "\n".join(notes)
    megatron = (f"""With Megatron-LM (one argument per line in `megatron.args`):

    torchrun --nproc_per_node {gpus_per_node} pretrain_gpt.py $(cat megatron.args) ...data and tokenizer args...
""" + "".join(f"\nMegatron-LM cannot build this model exactly: {n}.\n" for n in megatron_notes)
                + (f"\n**Not this plan's memory:** {megatron_layout}.\n" if megatron_layout else "")
                if not lora else """Not with Megatron-LM: it has no LoRA, so `megatron.args` (the same layout) would train every
parameter, which this plan's memory does not cover.
""")
    ranks = ("CPU rank" if cpu else "GPU") + ("s" if world_size != 1 else "")
    validate_command = f"dstk validate ds_config.json --world-size {world_size}" + "".join(
        f" {flag} {layout[key]}" for flag, key in (("--tensor-parallel", "tp"), ("--pipeline-stages", "pp"))
        if int(layout.get(key) or 1) > 1)  # the batch triad is checked against world / (tp x pp)
    return f"""# dstk run: {plan.get('model', {}).get('name', 'model')} on {world_size} {ranks}

Layout: {kind}; micro-batch {layout['micro_batch']} x {layout['grad_accum']} accumulation steps
x {layout['dp']} replicas = {layout['micro_batch'] * layout['grad_accum'] * layout['dp']} sequences per step.
Predicted: {gib:.2f} GiB per GPU, {step:.3g} s per step.{_hardware_line(plan)}

## Launch

With dstk (reads this directory; checks hosts and slots against the plan):

    dstk launch .{hosts_flag} -- train.py        # your script gets --deepspeed_config ./ds_config.json

With DeepSpeed's runner and your own script (`deepspeed.initialize(config="ds_config.json", ...)`):

    {launcher} train.py --deepspeed_config ds_config.json
{hosts_note}
With transformers' Trainer: `TrainingArguments(**json.load(open("training_args.json")))` (it names
`deepspeed="ds_config.hf.json"`); the "auto" values are filled from those arguments, which carry the
plan's batch, accumulation, precision, optimizer and schedule. With accelerate, from this directory:

    accelerate launch --config_file accelerate_config.yaml train.py

{megatron}
{notes_text}

## Why this layout

{why}

Files: `plan.json` (the plan, with the model, cluster and training it was made for),
`ds_config.json`, `ds_config.hf.json`, `training_args.json`, `accelerate_config.yaml`, `megatron.args`.
Check the DeepSpeed files with `{validate_command}` (and `ds_config.hf.json` with `--hf`).
"""


def _dumps(data) -> str:
    return json.dumps(data, indent=2) + "\n"


TEMP_TAG = ".dstk-tmp-"
"""Temporary siblings are named ``.NAME.dstk-tmp-XXXXXXXX`` (NAME: the directory being written)."""


def _umask() -> int:
    """The process umask (read by setting it and putting it back; the CLI is single-threaded here)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def check_output_dir(directory: str | os.PathLike, *, flag: str = "--output") -> None:
    """Refuse, before any work, an output directory that cannot be made: a path below a regular file,
    through a dangling symlink, or in a directory this user cannot write. The error names the path
    and a fix (exit 1); nothing is created here."""
    from dstk.errors import DstkError

    out = Path(directory)
    if os.path.islink(out) and not out.exists():
        raise DstkError(f"{flag} {out}: a symlink to {os.readlink(out)}, which does not exist",
                        hint=f"create {os.readlink(out)} first, remove the dangling link, or choose another {flag}")
    if out.exists() and not out.is_dir():
        raise DstkError(f"{flag} {out}: exists and is not a directory",
                        hint=f"choose another {flag} (a directory path), or move {out} away")
    probe = out.parent
    while not os.path.lexists(probe) and probe != probe.parent:
        probe = probe.parent
    if os.path.islink(probe) and not probe.exists():
        raise DstkError(f"{flag} {out}: {probe} is a symlink to {os.readlink(probe)}, which does not exist",
                        hint=f"create {os.readlink(probe)}, remove the dangling link, or choose another {flag}")
    if probe.exists() and not probe.is_dir():
        raise DstkError(f"{flag} {out}: {probe} is a file, so nothing can be made below it",
                        hint=f"choose an {flag} outside {probe}, e.g. {probe.parent / (probe.name + '-run')}")
    for place in ((probe, out) if out.is_dir() else (probe,)):
        if not os.access(place, os.W_OK | os.X_OK):
            raise DstkError(f"{flag} {out}: {place} is not writable by this user",
                            hint=f"choose an {flag} in a directory you can write, or fix its permissions "
                                 f"(chmod u+w {place})")


def _write_file(directory: Path, name: str, text: str) -> Path:
    """One new file, created with mode 0666 so that the umask applies as it does for any tool (0644
    under umask 022), written and fsynced."""
    target = directory / name
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    return target


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two directories in one step: renameat2(RENAME_EXCHANGE) (Linux >= 3.15; ext4, xfs, btrfs,
    tmpfs, overlayfs) or renamex_np(RENAME_SWAP) (macOS). False where neither is available, so the
    caller falls back to two renames."""
    import ctypes
    import errno

    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return False
    # int renameat2(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, unsigned int flags)
    if hasattr(libc, "renameat2"):
        rc = libc.renameat2(-100, os.fsencode(a), -100, os.fsencode(b), ctypes.c_uint(2))  # AT_FDCWD, RENAME_EXCHANGE
    elif hasattr(libc, "renamex_np"):  # int renamex_np(const char *from, const char *to, unsigned flags)
        rc = libc.renamex_np(os.fsencode(a), os.fsencode(b), ctypes.c_uint(2))  # RENAME_SWAP
    else:
        return False
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _link_tree(src: str, dst: str) -> None:
    """``src`` recreated at ``dst`` without copying data: files as hard links, symlinks as symlinks,
    directories walked (their modes kept)."""
    if os.path.islink(src):
        os.symlink(os.readlink(src), dst)
    elif os.path.isdir(src):
        os.mkdir(dst, 0o700)
        with os.scandir(src) as entries:
            for entry in entries:
                _link_tree(entry.path, os.path.join(dst, entry.name))
        os.chmod(dst, os.stat(src).st_mode & 0o7777)
    else:
        os.link(src, dst, follow_symlinks=False)


def _leftover_of(name: str, written: dict[str, str]) -> bool:
    """A temp file that an older per-file writer (``.plan.json.XXXX``) left when it was killed."""
    return any(name.startswith(f".{w}.") for w in written)


def _remove_stale(parent: Path, name: str) -> None:
    """Remove the temporary siblings of ``parent/name`` that no live writer holds: a writer holds an
    exclusive flock(2) on its temporary directory until it ends, and the kernel drops the lock when
    the process dies (also by SIGKILL), so an unlocked one is the remains of a killed run."""
    import fcntl
    import shutil

    for entry in parent.glob(f".{name}{TEMP_TAG}*"):
        try:
            fd = os.open(entry, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # a live writer's
        else:
            shutil.rmtree(entry, ignore_errors=True)
        finally:
            os.close(fd)


def _write_in_place(out: Path, shown: Path, files: dict[str, str]) -> list[Path]:
    """``-o .`` (the directory this process, and the user's shell, are in): swapping it would leave
    the shell in a deleted directory, so each file is replaced on its own (temp file + rename:
    every file whole, but not the set). Temp files are named ``.NAME.dstk-tmp-XXXX`` and a later
    write removes any that a killed writer left."""
    from dstk.errors import DstkError

    written = []
    for stale in out.glob(".*" + TEMP_TAG + "*"):
        if any(stale.name.startswith(f".{name}{TEMP_TAG}") for name in files):
            stale.unlink(missing_ok=True)
    try:
        for name, text in files.items():
            fd, tmp = tempfile.mkstemp(prefix=f".{name}{TEMP_TAG}", dir=out)
            try:
                os.fchmod(fd, 0o666 & ~_umask())
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    fh.write(text)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, out / name)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
            written.append(shown / name)
    except OSError as exc:
        raise DstkError(f"--output {shown}: cannot write it: {exc.strerror} ({exc.filename or out})",
                        hint="choose an --output in a directory you can write, with free space") from None
    return written


def write_files(directory: str | os.PathLike, files: dict[str, str], *, force: bool, fill=None,
                keep_others: bool = True) -> list[Path]:
    """Write ``{name: text}`` as the directory ``directory``, complete or not at all.

    ``fill(tmp)``, when given, writes more into the temporary directory after ``files`` (``dstk
    export``: transformers' ``save_pretrained``, binary safetensors); what it wrote is fsynced
    (``_fsync_tree``) and counts as dstk's own (``--force`` replaces it). It cannot write ``-o .``.
    ``keep_others=False`` carries nothing of the old directory over: the new one replaces it whole
    (``dstk export --force``: no shard of an older export beside the new ones).

    The files go into a temporary sibling ``.NAME.dstk-tmp-XXXXXXXX`` (each fsynced), which is then
    renamed into place (rename(2) is atomic). Over an existing directory (``force``, or an empty
    one) the two are swapped in one step (``_exchange``), so the old directory stays whole until the
    new one is complete; entries of the old one that ``files`` does not name (checkpoints, the
    user's own files) come along as hard links, so ``--force`` replaces only what dstk writes, as
    before. Files get mode 0666 less the umask, the directory 0777 less the umask (or the old
    directory's mode). A writer killed at any point (SIGKILL included) leaves the old directory or
    the new one, never a mix, plus at most an unlocked temporary sibling, which the next write of
    the same directory removes (``_remove_stale``).

    An existing non-empty directory is refused unless ``force``; nothing is written then. A path
    that cannot be a directory is refused first (``check_output_dir``). The directory the process
    is in (``-o .``) is written file by file instead (``_write_in_place``)."""
    import fcntl
    import shutil

    from dstk.errors import DstkError, UsageError

    shown = Path(directory)
    check_output_dir(shown)
    out = Path(os.path.realpath(shown))
    if out.is_dir() and any(out.iterdir()) and not force:
        raise UsageError(
            f"{shown} already exists and is not empty",
            hint="choose another --output, or pass --force to overwrite the files dstk writes there",
        )
    here = os.path.realpath(os.getcwd())
    if out.is_dir() and (here == str(out) or here.startswith(str(out) + os.sep)):
        if fill is not None:
            raise UsageError(f"--output {shown}: the directory dstk runs in cannot be replaced whole",
                             hint="give a new directory, e.g. --output hf-model")
        return _write_in_place(out, shown, files)
    parent = out.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        _remove_stale(parent, out.name)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}{TEMP_TAG}", dir=parent))
    except OSError as exc:
        raise DstkError(f"--output {shown}: cannot create it: {exc.strerror} ({exc.filename or parent})",
                        hint="choose an --output in a directory you can write, with free space") from None
    lock = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        old_mode = os.stat(out).st_mode & 0o7777 if out.is_dir() else None
        for name, text in files.items():
            _write_file(tmp, name, text)
        if fill is not None:
            fill(tmp)
            _fsync_tree(tmp)
        extra = sorted(set(os.listdir(tmp)) - set(files))
        if old_mode is not None and keep_others:
            with os.scandir(out) as entries:
                for entry in entries:
                    if entry.name not in files and entry.name not in extra and not _leftover_of(entry.name, files):
                        _link_tree(entry.path, str(tmp / entry.name))
        os.chmod(tmp, old_mode if old_mode is not None else 0o777 & ~_umask())  # last: 0555 would stop the writes
        _fsync_dir(tmp)
        if old_mode is None:
            os.rename(tmp, out)
        elif not _exchange(tmp, out):
            aside = Path(tempfile.mkdtemp(prefix=f".{out.name}{TEMP_TAG}", dir=parent))
            os.rename(out, aside / out.name)  # no RENAME_EXCHANGE here: a short window without the directory
            try:
                os.rename(tmp, out)
            except OSError:
                os.rename(aside / out.name, out)
                os.rmdir(aside)
                raise
            tmp = aside
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise DstkError(f"--output {shown}: cannot write it: {exc.strerror} ({exc.filename or tmp})",
                        hint="choose an --output in a directory you can write, with free space; "
                             "nothing was changed") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        os.close(lock)
    shutil.rmtree(tmp, ignore_errors=True)  # the old directory, after a swap
    try:
        _fsync_dir(parent)  # the rename itself, durable across a power cut
    except OSError:
        pass
    return [shown / name for name in [*files, *extra]]


def _fsync_tree(root: Path) -> None:
    """fsync every file and directory below ``root`` (what ``write_files``' ``fill`` wrote)."""
    for folder, _dirs, names in os.walk(root):
        for name in names:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY | os.O_NOFOLLOW)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(folder))


def run_files(
    *,
    plan: dict,
    layout: Layout,
    training: TrainingIntent,
    model: ModelDims,
    num_nodes: int,
    gpus_per_node: int,
    cpu: bool,
    nvme_path: str | None = None,
    buffers=None,
    megatron_layout: str | None = None,
) -> dict[str, str]:
    """The text of every file in a run directory (see docs/contracts.md); ``buffers`` as in ``ds_config``;
    ``megatron_layout`` as in ``run_readme``."""
    ds = ds_config(layout=layout, training=training, torch_adam=cpu, nvme_path=nvme_path, buffers=buffers)
    hf = ds_config(layout=layout, training=training, hf=True, torch_adam=cpu, nvme_path=nvme_path, buffers=buffers)
    return {
        "plan.json": _dumps(plan),
        "ds_config.json": _dumps(ds),
        "ds_config.hf.json": _dumps(hf),
        "megatron.args": "\n".join(megatron_args(layout=layout, training=training, model=model,
                                                 split=_plan_split(plan, layout))) + "\n",
        "accelerate_config.yaml": accelerate_config_yaml(layout=layout, num_nodes=num_nodes, training=training),
        "training_args.json": _dumps(training_arguments(layout=layout, training=training)),
        "README.md": run_readme(
            plan=plan, world_size=layout.world_size, num_nodes=num_nodes, gpus_per_node=gpus_per_node, cpu=cpu,
            megatron_notes=tuple(megatron_notes(model)), megatron_layout=megatron_layout,
        ),
    }


# --- accelerate and transformers' Trainer ------------------------------------------------------

# dstk optimizer -> TrainingArguments.optim (transformers ``OptimizerNames``). The Trainer has no Adam
# with L2 decay: "adam" becomes AdamW (the same optimizer when weight_decay is 0).
_HF_OPTIM = {"adamw": "adamw_torch", "adam": "adamw_torch", "sgd": "sgd", "lion": "lion_32bit",
             "adafactor": "adafactor"}
# dstk schedule -> TrainingArguments.lr_scheduler_type (transformers ``SchedulerType``).
_HF_SCHEDULE = {"cosine": "cosine_with_min_lr", "linear": "linear", "constant": "constant_with_warmup"}


def training_arguments(*, layout: Layout, training: TrainingIntent, deepspeed: str = "ds_config.hf.json",
                       output_dir: str = "output") -> dict:
    """``transformers.TrainingArguments`` keyword arguments for the plan (``training_args.json``).

    They carry every value ``ds_config.hf.json`` leaves "auto", so the Trainer fills the DeepSpeed
    file from them (``HfTrainerDeepSpeedConfig.trainer_config_process``): per-device batch =
    micro-batch, accumulation, clipping, bf16/fp16; and the optimizer and schedule the DeepSpeed
    flavour would have run: lr, weight decay, Adam betas/eps, warmup = max(1, min(warmup, steps))
    as in ``_scheduler_block``, cosine down to ``min_lr_ratio`` x lr (``cosine_with_min_lr`` with
    ``min_lr_rate``), max_steps = the run's optimizer steps.
    """
    precision = training.precision or "bf16"
    steps = training.steps
    args: dict = {
        "output_dir": output_dir,
        "deepspeed": deepspeed,
        "per_device_train_batch_size": layout.micro_batch,
        "gradient_accumulation_steps": layout.grad_accum,
        "max_steps": steps,
        "bf16": precision == "bf16",
        "fp16": precision == "fp16",
        "optim": _HF_OPTIM[training.optimizer],
        "learning_rate": training.lr,
        "weight_decay": training.weight_decay,
        "adam_beta1": training.betas[0],
        "adam_beta2": training.betas[1],
        "adam_epsilon": training.eps,
        "max_grad_norm": training.grad_clip,
        "lr_scheduler_type": _HF_SCHEDULE[training.schedule],
        "warmup_steps": max(1, min(training.warmup_steps, steps)),
        "gradient_checkpointing": layout.recompute != "none" and layout.pp == 1,
        "logging_steps": 10,
    }
    if training.schedule == "cosine":
        args["lr_scheduler_kwargs"] = {"min_lr_rate": training.min_lr_ratio}
    return args


def accelerate_config_yaml(*, layout: Layout, num_nodes: int, training: TrainingIntent,
                           deepspeed_config_file: str = "ds_config.hf.json") -> str:
    """``accelerate_config.yaml`` for ``accelerate launch --config_file``: the DeepSpeed plugin
    reading ``ds_config.hf.json``, ``num_processes`` = the plan's world size, ``num_machines`` = nodes.

    Keys are those of accelerate's ``ClusterConfig`` (``accelerate/commands/config/config_args.py``).
    ``mixed_precision`` is left unset, as ``accelerate config`` does with a DeepSpeed file: accelerate
    refuses it next to ``deepspeed_config_file`` (``DeepSpeedPlugin._deepspeed_config_checks``) and
    takes the precision from the file, whose "auto" the Trainer fills from training_args.json.
    """
    precision = training.precision or "bf16"
    lines = [
        "# accelerate launch --config_file accelerate_config.yaml train.py  (run from this directory:",
        "# accelerate reads deepspeed_config_file relative to the working directory). Written by dstk.",
        f"# Precision: {precision}, set in ds_config.hf.json / training_args.json (accelerate refuses",
        "# mixed_precision next to deepspeed_config_file).",
        "compute_environment: LOCAL_MACHINE",
        "distributed_type: DEEPSPEED",
        "deepspeed_config:",
        f"  deepspeed_config_file: {deepspeed_config_file}",
        f"  zero3_init_flag: {'true' if layout.zero_stage == 3 else 'false'}",
    ]
    if num_nodes > 1:
        lines.append("  deepspeed_multinode_launcher: standard")
    lines += [
        f"num_machines: {num_nodes}",
        f"num_processes: {layout.world_size}",
        "machine_rank: 0",
    ]
    if num_nodes > 1:
        lines += [
            "# Multi-node: set main_process_ip to the first node's address and machine_rank on each node.",
            "main_process_ip: null",
            "main_process_port: 29500",
            "same_network: true",
        ]
    lines += [
        "rdzv_backend: static",
        "main_training_function: main",
        "use_cpu: false",
        "debug: false",
    ]
    return "\n".join(lines) + "\n"


def read_megatron_args(text: str) -> list[str]:
    """Split a ``megatron.args`` file back into argv items (the round trip of the renderer)."""
    return [item for line in text.splitlines() if line.strip() for item in shlex.split(line)]


# --- presets ----------------------------------------------------------------------------------


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class Preset:
    name: str
    """File stem under templates/presets/{deepspeed,hf}/."""
    summary: str
    """What it is for and when not to use it (the header users read)."""
    layout: Layout
    precision: str = "bf16"
    nvme_path: str | None = None


PRESETS: tuple[Preset, ...] = (
    Preset(
        name="zero0-bf16",
        summary="Plain data parallelism (DDP-like). The fastest when the model, its gradients and "
        "Adam states (16 bytes/param) fit on every GPU; not for models over ~1B on 24 GB GPUs.",
        layout=Layout(zero_stage=0),
    ),
    Preset(
        name="zero1-bf16",
        summary="ZeRO-1: optimizer states sharded over data-parallel ranks; same communication as "
        "plain DP. The default first step when plain DP runs out of memory.",
        layout=Layout(zero_stage=1),
    ),
    Preset(
        name="zero2-bf16",
        summary="ZeRO-2: optimizer states and gradients sharded. Little extra communication; "
        "use when ZeRO-1 does not fit. Not with pipeline parallelism.",
        layout=Layout(zero_stage=2),
    ),
    Preset(
        name="zero3-bf16",
        summary="ZeRO-3: parameters sharded too, gathered layer by layer (1.5x the communication of "
        "DP). For models that do not fit otherwise; across many nodes it is often slower than TP/PP.",
        layout=Layout(zero_stage=3),
    ),
    Preset(
        name="zero1-fp16",
        summary="ZeRO-1 with fp16 and dynamic loss scaling, for GPUs without bf16 (V100, T4). "
        "Prefer bf16 where the GPU has it; DeepSpeed's CPU accelerator has no fp16.",
        layout=Layout(zero_stage=1),
        precision="fp16",
    ),
    Preset(
        name="zero2-fp32",
        summary="ZeRO-2 in full fp32, for debugging numerics or CPU runs; 2-8x slower than bf16 on GPUs.",
        layout=Layout(zero_stage=2),
        precision="fp32",
    ),
    Preset(
        name="zero2-offload-cpu",
        summary="ZeRO-2 with the optimizer step on the CPU (ZeRO-Offload): frees ~12 bytes/param of "
        "GPU memory; needs that much pinned CPU RAM; the step becomes CPU-bound.",
        layout=Layout(zero_stage=2, offload_optimizer="cpu"),
    ),
    Preset(
        name="zero3-offload-cpu",
        summary="ZeRO-3 with optimizer states and parameters in CPU memory: trains models far larger "
        "than GPU memory, slowly (PCIe-bound). A last resort before adding GPUs.",
        layout=Layout(zero_stage=3, offload_optimizer="cpu", offload_params="cpu"),
    ),
    Preset(
        name="zero3-offload-nvme",
        summary="ZeRO-Infinity: optimizer states and parameters on local NVMe. Edit nvme_path to a fast "
        "local NVMe mount (not a network file system). Slowest; for models that fit nowhere else.",
        layout=Layout(zero_stage=3, offload_optimizer="nvme", offload_params="nvme"),
        nvme_path="/local_nvme",
    ),
    Preset(
        name="pipeline-pp2",
        summary="DeepSpeed pipeline engine (1F1B), ZeRO-1 over the data-parallel group, 8 micro-batches "
        "per step. Needs a PipelineModule (dstk.models.to_pipeline); ZeRO 2/3 are not allowed with it.",
        layout=Layout(pp=2, zero_stage=1, grad_accum=8),
    ),
    Preset(
        name="autotp2",
        summary="DeepSpeed AutoTP training: tensor parallelism of degree 2 on an HF model, ZeRO-1 over "
        "the rest. Keep TP inside a node; the degree must divide the attention and KV heads.",
        layout=Layout(tp=2, zero_stage=1),
    ),
)

PRESET_TRAINING = {
    "lr": 2e-5,
    "warmup_steps": 100,
    "train_steps": 1000,
    "weight_decay": 0.0,
    "schedule": "cosine",
}


def preset_files() -> dict[str, str]:
    """``{relative path: text}`` of every preset file under templates/presets/."""
    files: dict[str, str] = {}
    index = [
        "# DeepSpeed presets\n",
        "Generated by `python -m dstk.render --write-presets` from the same renderer as `dstk generate`;",
        "do not edit by hand (a test checks they are up to date). `deepspeed/` files are for",
        "`deepspeed.initialize` (the global batch is derived: micro x accumulation x data-parallel",
        "ranks); `hf/` files are for transformers' Trainer, with \"auto\" where the Trainer fills values.",
        "`dstk generate` writes a config sized for your model and cluster instead.\n",
        "| preset | what it is for |",
        "|---|---|",
    ]
    for preset in PRESETS:
        training = TrainingIntent(precision=preset.precision, **PRESET_TRAINING)
        for kind, hf in (("deepspeed", False), ("hf", True)):
            config = ds_config(
                layout=preset.layout, training=training, hf=hf, nvme_path=preset.nvme_path, world_independent=True
            )
            files[f"{kind}/{preset.name}.json"] = _dumps(config)
        index.append(f"| `{preset.name}` | {preset.summary} |")
    files["README.md"] = "\n".join(index) + "\n"
    return files


def presets_dir() -> Path:
    return Path(__file__).resolve().parent.parent / "templates" / "presets"


def write_presets(root: Path | None = None) -> list[Path]:
    root = root or presets_dir()
    written = []
    for rel, text in preset_files().items():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, target)
        written.append(target)
    return written


def stale_presets(root: Path | None = None) -> list[str]:
    """Preset files that differ from what the renderer writes now (or are missing or extra)."""
    root = root or presets_dir()
    expected = preset_files()
    found = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and p.name != "__init__.py"}
    stale = [rel for rel, text in expected.items() if not (root / rel).is_file() or (root / rel).read_text() != text]
    stale += sorted(found - set(expected))
    return stale


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m dstk.render", description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--write-presets", action="store_true", help="regenerate templates/presets/")
    group.add_argument("--check-presets", action="store_true", help="exit 1 if templates/presets/ is stale")
    args = parser.parse_args(argv)
    if args.write_presets:
        for path in write_presets():
            print(path)
        return 0
    stale = stale_presets()
    for rel in stale:
        print(f"stale: {rel}")
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
