"""Generate ``toolkit/data/deepspeed-0.19.8.schema.json`` from the installed DeepSpeed.

Run ``python -m dstk.validate.schema_gen [OUT]`` (imports deepspeed and torch; never on the fast path).

Two sources, because DeepSpeed parses its config in two styles
(/work/shared/research/deepspeed-config-surface.md section 1.3):

* pydantic sections (``zero_optimization``, ``fp16``, ``bf16``, monitors, ``comms_logger``, ``compile``,
  ``hybrid_engine``, ``tensor_parallel``, ``weight_quantization``, ``timers.throughput``): walked from
  the models' ``model_fields`` -- names, aliases, types, enums, ranges, defaults, attribute docstrings.
  (``model_json_schema`` cannot be used: it fails on ZeRO's ``new_param_fn`` lambdas and on
  ``torch.dtype``.)
* plain-dict sections (read with ``dict.get``): written out below from DeepSpeed's own key constants,
  so a renamed constant breaks the generator instead of drifting silently.

Optimizer and scheduler parameters come from the signatures of the classes DeepSpeed instantiates
(its fused/CPU optimizers, ``torch.optim``, ``deepspeed.runtime.lr_schedules``,
``torch.optim.lr_scheduler``) and are stored under ``$defs``; ``dstk.validate.rules`` picks the one
for the configured ``type``.
"""

from __future__ import annotations

import ast
import enum
import inspect
import json
import os
import pathlib
import sys
import tempfile
import textwrap
import types
import typing

DS_VERSION = "0.19.8"
USER_MAP = "a map whose keys are chosen by the user"

# ---------------------------------------------------------------------------- small builders


def _s(type_=None, description: str = "", default=..., **extra) -> dict:
    out: dict = {}
    if type_ is not None:
        out["type"] = type_
    if description:
        out["description"] = description
    if default is not ...:
        out["default"] = default
    out.update(extra)
    return out


def _obj(properties: dict, description: str = "", **extra) -> dict:
    return {"type": "object", "description": description, "properties": properties,
            "additionalProperties": False, **extra}


B, I, N, S = "boolean", "integer", "number", "string"

# ---------------------------------------------------------------------------- pydantic walking


def _attribute_docs(cls) -> dict[str, str]:
    """Attribute docstrings (a string literal right after ``name: type = ...``) of a class."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for prev, node in zip(body, body[1:]):
            if (isinstance(prev, ast.AnnAssign) and isinstance(prev.target, ast.Name)
                    and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                    and isinstance(node.value.value, str)):
                text = " ".join(inspect.cleandoc(node.value.value).split("\n\n")[0].split())
                docs[prev.target.id] = text[:400]
    return docs


def _jsonable(value):
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, pathlib.PurePath):
        return str(value)
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return ...
    if isinstance(value, float) and value != value:
        return ...
    return value


def _annotation(ann) -> dict:
    import pydantic

    origin = typing.get_origin(ann)
    args = typing.get_args(ann)
    if origin is typing.Annotated:
        return _annotation(args[0])
    if origin in (typing.Union, types.UnionType):
        parts = [a for a in args if a is not type(None)]
        nullable = len(parts) != len(args)
        subs = [_annotation(a) for a in parts]
        if any(not s for s in subs):
            return {}
        if len(subs) == 1 and "properties" in subs[0]:  # Optional[Model]: keep the closed object, allow null
            return {**subs[0], "type": ["object", "null"] if nullable else "object"}
        if all(set(s) == {"type"} and isinstance(s["type"], str) for s in subs):
            kinds = [s["type"] for s in subs] + (["null"] if nullable else [])
            return {"type": kinds[0] if len(kinds) == 1 else kinds}
        if nullable:
            subs.append({"type": "null"})
        return {"anyOf": subs}
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin in (list, tuple, set, frozenset) or ann in (list, tuple):
        out: dict = {"type": "array"}
        if args and args[-1] is not Ellipsis:
            item = _annotation(args[0])
            if item:
                out["items"] = item
        return out
    if origin is dict or ann is dict:
        return {"type": "object", "description": USER_MAP}
    if ann is typing.Any:
        return {}
    if ann is bool:
        return {"type": B}
    if ann is int:
        return {"type": I}
    if ann is float:
        return {"type": N}
    if ann is str:
        return {"type": S}
    if isinstance(ann, type) and issubclass(ann, pathlib.PurePath):
        return {"type": S}
    if isinstance(ann, type) and issubclass(ann, enum.Enum):
        return {"enum": [m.value for m in ann]}
    if isinstance(ann, type) and issubclass(ann, pydantic.BaseModel):
        return model_schema(ann)
    # torch.dtype, process groups, mpu objects: Python objects that a JSON file cannot express.
    return {"not": {}, "x-dstk-not-json": True}


def _constraints(field) -> dict:
    out = {}
    for meta in field.metadata:
        for attr, key in (("ge", "minimum"), ("gt", "exclusiveMinimum"), ("le", "maximum"), ("lt", "exclusiveMaximum")):
            value = getattr(meta, attr, None)
            if value is not None:
                out[key] = value
    return out


def model_schema(cls, description: str = "") -> dict:
    """The JSON schema of one DeepSpeed pydantic config model (``extra="forbid"``: closed)."""
    from pydantic_core import PydanticUndefined

    docs = _attribute_docs(cls)
    props: dict = {}
    for name, field in cls.model_fields.items():
        sub = dict(_annotation(field.annotation))
        sub.update(_constraints(field))
        doc = field.description or docs.get(name, "")
        if doc:
            sub["description"] = doc
        if field.default is not PydanticUndefined and field.default is not None:
            default = _jsonable(field.default)
            if default is not ... and not isinstance(default, dict):
                sub["default"] = default
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        if extra.get("deprecated"):
            sub["deprecated"] = True
            if extra.get("new_param"):
                sub["x-dstk-replaced-by"] = extra["new_param"]
        props[name] = sub
        if field.alias and field.alias != name:
            props[field.alias] = {**sub, "description": f"Alias of `{name}`. " + sub.get("description", "")}
    doc = description or " ".join(inspect.cleandoc(cls.__doc__ or "").split("\n\n")[0].split())
    return _obj(props, doc[:400], **{"x-dstk-parser": f"pydantic {cls.__module__}.{cls.__qualname__}"})


# ---------------------------------------------------------------------------- plain-dict sections


def _plain_sections() -> dict:
    from deepspeed.autotuning import constants as at
    from deepspeed.profiling import constants as fp
    from deepspeed.runtime import constants as c
    from deepspeed.runtime.data_pipeline import constants as de
    from deepspeed.runtime.swap_tensor import constants as aio

    P = "plain dict: DeepSpeed reads it with dict.get, so a typo here is silently ignored"
    activation = _obj({
        "partition_activations": _s(B, "Partition activation checkpoints across model-parallel ranks.", False),
        "number_checkpoints": _s([I, "null"], "Number of checkpoints (with contiguous_memory_optimization).", None,
                                 minimum=1),
        "contiguous_memory_optimization": _s(B, "Copy checkpoints into one contiguous buffer.", False),
        "synchronize_checkpoint_boundary": _s(B, "Synchronize at each checkpoint boundary.", False),
        "profile": _s(B, "Profile forward/backward of checkpointed layers.", False),
        "cpu_checkpointing": _s(B, "Offload partitioned activations to the CPU.", False),
    }, "Activation checkpointing (deepspeed.checkpointing). " + P)
    pipeline = _obj({
        "stages": _s([I, S], "Not read from the config: pass num_stages to PipelineModule.", "auto"),
        "partition": _s(S, "Not read from the config: a PipelineModule argument.", "best"),
        "seed_layers": _s(B, "Not read from the config: a PipelineModule argument.", False),
        "activation_checkpoint_interval": _s(I, "Layers between activation checkpoints (0 = off).", 0, minimum=0),
        "pipe_partitioned": _s(B, "Partition activations sent between stages (must be a bool).", True),
        "grad_partitioned": _s(B, "Partition gradients sent between stages (must be a bool).", True),
        "use_reentrant": _s(B, "Use reentrant activation checkpointing in the pipeline engine.", True),
    }, "Pipeline engine options (PipelineModule / PipelineEngine). " + P)
    flops = _obj({
        fp.FLOPS_PROFILER_ENABLED: _s(B, "Enable the flops profiler (also turns on wall_clock_breakdown).",
                                      fp.FLOPS_PROFILER_ENABLED_DEFAULT),
        fp.FLOPS_PROFILER_RECOMPUTE_FWD_FACTOR: _s(N, "Extra forward passes from recomputation.",
                                                   fp.FLOPS_PROFILER_RECOMPUTE_FWD_FACTOR_DEFAULT),
        fp.FLOPS_PROFILER_PROFILE_STEP: _s(I, "Step at which to profile.", fp.FLOPS_PROFILER_PROFILE_STEP_DEFAULT),
        fp.FLOPS_PROFILER_MODULE_DEPTH: _s(I, "Module depth to report (-1 = all).",
                                           fp.FLOPS_PROFILER_MODULE_DEPTH_DEFAULT),
        fp.FLOPS_PROFILER_TOP_MODULES: _s(I, "Number of top modules to report.", fp.FLOPS_PROFILER_TOP_MODULES_DEFAULT),
        fp.FLOPS_PROFILER_DETAILED: _s(B, "Print the detailed per-module profile.", fp.FLOPS_PROFILER_DETAILED_DEFAULT),
        fp.FLOPS_PROFILER_OUTPUT_FILE: _s([S, "null"], "File for the profile (None = stdout).", None),
    }, "Flops profiler. " + P)
    autotuning = _obj({
        at.AUTOTUNING_ENABLED: _s(B, "Enable the autotuner.", False),
        at.AUTOTUNING_FAST: _s(B, "Tune only micro batch size and ZeRO stage.", True),
        at.AUTOTUNING_RESULTS_DIR: _s(S, "Directory for results (must be non-empty).", at.AUTOTUNING_RESULTS_DIR_DEFAULT,
                                      minLength=1),
        at.AUTOTUNING_EXPS_DIR: _s(S, "Directory for experiments (must be non-empty).", at.AUTOTUNING_EXPS_DIR_DEFAULT,
                                   minLength=1),
        at.AUTOTUNING_OVERWRITE: _s(B, "Overwrite earlier results.", True),
        at.AUTOTUNING_START_PROFILE_STEP: _s(I, "First profiled step.", 3, minimum=0),
        at.AUTOTUNING_END_PROFILE_STEP: _s(I, "Last profiled step.", 5, minimum=0),
        at.AUTOTUNING_METRIC: _s(S, "Metric to optimise.", at.AUTOTUNING_METRIC_THROUGHPUT,
                                 enum=sorted({at.AUTOTUNING_METRIC_LATENCY, at.AUTOTUNING_METRIC_THROUGHPUT,
                                              at.AUTOTUNING_METRIC_FLOPS, at.AUTOTUNING_METRIC_FORWARD,
                                              at.AUTOTUNING_METRIC_STEPS})),
        at.AUTOTUNING_METRIC_PATH: _s([S, "null"], "Where the metric file is written.", None),
        at.AUTOTUNING_TUNER_TYPE: _s(S, "Search strategy.", at.AUTOTUNING_TUNER_GRIDSEARCH,
                                     enum=[at.AUTOTUNING_TUNER_GRIDSEARCH, at.AUTOTUNING_TUNER_RANDOM,
                                           at.AUTOTUNING_TUNER_MODELBASED]),
        at.AUTOTUNING_TUNER_EARLY_STOPPING: _s(I, "Stop after this many trials without improvement.", 5, minimum=1),
        at.AUTOTUNING_TUNER_NUM_TRIALS: _s(I, "Maximum number of trials.", 50, minimum=1),
        at.AUTOTUNING_ARG_MAPPINGS: _s("object", "Maps DeepSpeed config keys to training-script arguments; "
                                       + USER_MAP + ".", additionalProperties={"type": S}),
        at.MODEL_INFO: _obj({
            at.MODEL_INFO_PROFILE: _s(B, "Profile the model to fill model_info.", False),
            at.MODEL_INFO_NUM_PARAMS: _s([I, "null"], "Number of parameters.", minimum=0),
            at.MODEL_INFO_HIDDEN_SIZE: _s([I, "null"], "Hidden size.", minimum=0),
            at.MODEL_INFO_NUM_LAYERS: _s([I, "null"], "Number of layers.", minimum=0),
        }, "Model facts the autotuner uses."),
        at.AUTOTUNING_MODEL_INFO_PATH: _s([S, "null"], "Where model_info is written.", None),
        at.AUTOTUNING_MP_SIZE: _s(I, "Model-parallel size.", 1, minimum=1),
        at.AUTOTUNING_MAX_TRAIN_BATCH_SIZE: _s([I, "null"], "Largest global batch to try.", None, minimum=1),
        at.AUTOTUNING_MIN_TRAIN_BATCH_SIZE: _s(I, "Smallest global batch to try.", 1, minimum=1),
        at.AUTOTUNING_MAX_TRAIN_MICRO_BATCH_SIZE_PER_GPU: _s(I, "Largest micro batch to try.", 1024, minimum=1),
        at.AUTOTUNING_MIN_TRAIN_MICRO_BATCH_SIZE_PER_GPU: _s(I, "Smallest micro batch to try.", 1, minimum=1),
        at.AUTOTUNING_NUM_TUNING_MICRO_BATCH_SIZES: _s(I, "How many micro batch sizes to try.", 3, minimum=1),
    }, "Autotuning (the `deepspeed --autotuning` launcher). " + P)
    aio_s = _obj({
        aio.AIO_BLOCK_SIZE: _s(I, "I/O block size in bytes.", aio.AIO_BLOCK_SIZE_DEFAULT, minimum=1),
        aio.AIO_QUEUE_DEPTH: _s(I, "I/O queue depth.", aio.AIO_QUEUE_DEPTH_DEFAULT, minimum=1),
        aio.AIO_INTRA_OP_PARALLELISM: _s(I, "I/O threads per operation.", aio.AIO_INTRA_OP_PARALLELISM_DEFAULT,
                                         minimum=1),
        aio.AIO_SINGLE_SUBMIT: _s(B, "Submit requests one at a time.", aio.AIO_SINGLE_SUBMIT_DEFAULT),
        aio.AIO_OVERLAP_EVENTS: _s(B, "Overlap submission and completion.", aio.AIO_OVERLAP_EVENTS_DEFAULT),
        aio.AIO_USE_GDS: _s(B, "GPUDirect Storage (DeepSpeed asserts a CUDA accelerator at parse time).",
                            aio.AIO_USE_GDS_DEFAULT),
    }, "Async I/O for NVMe offload (ZeRO-Infinity). " + P)
    writer = _obj({
        "type": _s(S, "Checkpoint writer (upper-cased by DeepSpeed).", "FAST",
                   pattern="^(?i:mock|python|fast)$"),
        "io_buffer_size": _s(I, "I/O buffer size in bytes.", 64 * 1024 * 1024, minimum=1),
        "io_buffer_double": _s(B, "Double-buffer the I/O.", True),
        "show_statistics": _s(B, "Print writer statistics.", False),
        "data_parallel": _s(S, "Which data-parallel ranks write (upper-cased by DeepSpeed).", "REPLICA",
                            pattern="^(?i:replica|socket|machine)$"),
        "decoupled": _s(B, "Write checkpoints in a separate process.", False),
        "io_multiplier": _s(I, "I/O parallelism multiplier.", 1, minimum=1),
    }, "Checkpoint writer; null means the default torch.save.")
    writer["type"] = ["object", "null"]
    checkpoint = _obj({
        "tag_validation": _s(S, "Check that all ranks save the same tag (upper-cased by DeepSpeed).", "Warn",
                             pattern="^(?i:warn|ignore|fail)$"),
        "load_universal": _s(B, "Load a universal checkpoint.", False),
        "use_node_local_storage": _s(B, "Each node saves to its local storage.", False),
        "parallel_write": _obj({"pipeline_stage": _s(B, "Each pipeline stage writes its own files.", False)},
                               "Parallel checkpoint writing."),
        "checkpoint_serialization": _s(B, "Use torch's zipfile serialization.", True),
        "writer": writer,
    }, "Checkpointing. " + P)
    dtype_enum = _dtype_names()
    data_types = _obj({
        c.GRAD_ACCUM_DTYPE: _s([S, "null"], "dtype of gradient accumulation buffers (resolved at initialize).", None,
                               enum=dtype_enum + [None]),
        c.PARAM_DTYPE: _s([S, "null"], "dtype of parameters; must agree with fp16/bf16.enabled.", None,
                          enum=dtype_enum + [None]),
        c.BUFFER_DTYPE: _s([S, "null"], "dtype of buffers (None keeps their loaded dtype).", None,
                           enum=dtype_enum + [None]),
        c.KEEP_IN_FP32_MODULES: {"description": "\"auto\" or a list of module-name patterns kept in fp32.",
                                 "default": "auto", "anyOf": [{"const": "auto"}, {"type": "array", "items": {"type": S}}]},
    }, "Data types. " + P)
    autocast = _obj({
        "enabled": _s(B, "Use torch.autocast in forward.", False),
        "dtype": _s(S, "Lower-precision dtype for autocast.", "bfloat16", enum=dtype_enum),
        "lower_precision_safe_modules": _s(["array", "null"], "Module classes autocast may run in lower precision.",
                                           None, items={"type": S}),
    }, "torch.autocast mixed precision. " + P)
    curriculum_metric = _obj({
        "index_to_sample_path": _s(S, "Index-to-sample file."),
        "index_to_metric_path": _s(S, "Index-to-metric file."),
        "difficulty_type": _s(S, "How difficulty is measured.", enum=[de.CURRICULUM_LEARNING_VALUE_BASED,
                                                                     de.CURRICULUM_LEARNING_PERCENTILE_BASED]),
        "clustering_type": _s(S, "Clustering of samples.", enum=[de.CURRICULUM_LEARNING_SINGLE_CLUSTER,
                                                                 de.CURRICULUM_LEARNING_CLUSTER_PREFIX]),
        "min_difficulty": _s(N, "Starting difficulty."),
        "max_difficulty": _s(N, "Final difficulty."),
        "schedule_type": _s(S, "Difficulty schedule.", enum=[de.CURRICULUM_LEARNING_SCHEDULE_FIXED_LINEAR,
                                                            de.CURRICULUM_LEARNING_SCHEDULE_FIXED_ROOT,
                                                            de.CURRICULUM_LEARNING_SCHEDULE_FIXED_DISCRETE,
                                                            de.CURRICULUM_LEARNING_SCHEDULE_CUSTOM]),
        "schedule_config": _obj({
            "total_curriculum_step": _s(I, "Steps to reach max difficulty.", minimum=1),
            "difficulty_step": _s(I, "Difficulty granularity.", minimum=1),
            "root_degree": _s(N, "Degree for fixed_root."),
            "difficulty": _s("array", "Difficulties for fixed_discrete."),
            "max_step": _s("array", "Step boundaries for fixed_discrete."),
        }, "Schedule parameters."),
    }, "One curriculum metric.")
    random_ltd = {"type": "object", "additionalProperties": {},
                  "description": "Random layerwise token dropping; DeepSpeed copies this block as is "
                                 "(its keys depend on the model), so only `enabled` is typed.",
                  "properties": {"enabled": _s(B, "Enable random-LTD.", False)}}
    data_efficiency = _obj({
        de.DATA_EFFICIENCY_ENABLED: _s(B, "Enable the data efficiency library.", False),
        de.DATA_EFFICIENCY_SEED: _s(I, "Random seed.", de.DATA_EFFICIENCY_SEED_DEFAULT),
        de.DATA_SAMPLING: _obj({
            de.DATA_SAMPLING_ENABLED: _s(B, "Enable data sampling.", False),
            de.DATA_SAMPLING_NUM_EPOCHS: _s(I, "Epochs to sample.", de.DATA_SAMPLING_NUM_EPOCHS_DEFAULT, minimum=1),
            de.DATA_SAMPLING_NUM_WORKERS: _s(I, "Data loader workers.", 0, minimum=0),
            de.DATA_SAMPLING_PIN_MEMORY: _s(B, "Pin host memory.", False),
            de.CURRICULUM_LEARNING: _obj({
                de.CURRICULUM_LEARNING_ENABLED: _s(B, "Enable curriculum learning (needs curriculum_metrics).", False),
                de.CURRICULUM_LEARNING_CLUSTER_PATH: _s(S, "Where clusters are stored."),
                de.CURRICULUM_LEARNING_METRICS: {"type": "object", "description": "Metric name -> metric; " + USER_MAP,
                                                 "additionalProperties": curriculum_metric},
            }, "Curriculum learning."),
            de.DYNAMIC_BATCHING: _obj({
                de.DYNAMIC_BATCHING_ENABLED: _s(B, "Enable dynamic batching (needs max_tokens).", False),
                de.DYNAMIC_BATCHING_METRICS_PATH: _s(S, "Sequence-length metrics file."),
                de.DYNAMIC_BATCHING_LR_SCALING_METHOD: _s(S, "LR scaling with batch size.", "linear",
                                                          enum=["linear", "sqrt", "none"]),
                de.DYNAMIC_BATCHING_MIN_BATCH_SIZE: _s(I, "Smallest batch.", 1, minimum=1),
                de.DYNAMIC_BATCHING_MAX_BATCH_SIZE: _s([I, "null"], "Largest batch.", None, minimum=1),
                de.DYNAMIC_BATCHING_SEQUENCE_PICKING_ORDER: _s(S, "Order of picking sequences.", "dataloader",
                                                               enum=["random", "seqlen", "dataloader"]),
                de.DYNAMIC_BATCHING_MAX_TOKENS: _s(I, "Tokens per batch.", minimum=1),
                de.DYNAMIC_BATCHING_VERBOSE: _s(B, "Log batching decisions.", False),
            }, "Dynamic batching by sequence length."),
        }, "Data sampling (curriculum learning, dynamic batching)."),
        de.DATA_ROUTING: _obj({
            de.DATA_ROUTING_ENABLED: _s(B, "Enable data routing.", False),
            de.RANDOM_LTD: random_ltd,
        }, "Data routing (random-LTD)."),
    }, "Data efficiency library. " + P)
    timers = _obj({}, "Timers; the outer block is a plain dict.")
    expert = {
        "enabled": (B, False), "autoep_size": (I, 1), "expert_tensor_parallel_size": (I, 1),
        "validate_folding_routing": (B, False), "async_split_plan": (B, False), "preset_model": ([S, "null"], None),
        "moe_layer_pattern": ([S, "null"], None), "expert_pattern": ([S, "null"], None),
        "router_pattern": ([S, "null"], None), "use_grouped_mm": (B, True), "disable_triton_grouped_mm": (B, False),
        "route_norm": ([B, "null"], None), "route_scale": (N, 1.0), "score_apply": (S, "auto"),
        "combine_impl": (S, "auto"), "row_weighting_impl": (S, "auto"), "gate_up_impl": (S, "separate"),
        "comm_backend": (S, "comm"), "comm_num_sm": (I, 12), "comm_qp_margin": (I, 4),
        "comm_max_tokens_per_rank": (I, 0), "num_expert_groups": ([I, "null"], None),
        "num_limited_groups": ([I, "null"], None), "score_func": (S, "auto"), "top_k": ([I, S], "auto"),
        "load_balance_coeff": ("null", None), "routed_scaling_factor": ([N, S], "auto"),
        "expert_w1": ([S, "null"], None), "expert_w2": ([S, "null"], None), "expert_w3": ([S, "null"], None),
        "num_experts_attr": ([S, "null"], None), "top_k_attr": ([S, "null"], None),
        "has_shared_experts": ([B, "null"], None), "shared_experts_pattern": ([S, "null"], None),
        "shared_experts_gate_pattern": ([S, "null"], None), "expert_activation": ([S, "null"], None),
    }
    expert_s = _obj({k: _s(t, "AutoEP option (checked at initialize).", d) for k, (t, d) in expert.items()},
                    "Automatic expert parallelism (AutoEP). " + P)
    return {
        "activation_checkpointing": activation, "pipeline": pipeline, "flops_profiler": flops, "autotuning": autotuning, "aio": aio_s, "checkpoint": checkpoint,
        "data_types": data_types, "torch_autocast": autocast, "data_efficiency": data_efficiency,
        "timers": timers, "expert_parallel": expert_s,
        "datastates_ckpt": {"type": ["object", "boolean"], "additionalProperties": {},
                            "description": "DataStates async checkpointing; enabled when present and not false. "
                                           "DeepSpeed passes the block through as is."},
    }


def _dtype_names() -> list[str]:
    """The strings ``deepspeed.runtime.config.DtypeEnum(value)`` accepts (``runtime/config.py:144-162``: its
    ``__new__`` registers every alias in ``_value2member_map_``), used by ``torch_autocast.dtype``
    (``get_torch_autocast_dtype``) and ``data_types.*_dtype`` (resolved at initialize). "bfloat" is not one
    (``inference.config.DtypeEnum`` has it, the training config's does not). int8 is left out: DeepSpeed
    accepts the name, but torch.autocast only runs in a float dtype, and int8 parameters cannot train."""
    from deepspeed.runtime.config import DtypeEnum

    return [name for name, member in DtypeEnum._value2member_map_.items()
            if isinstance(name, str) and member is not DtypeEnum.int8]


def _top_scalars() -> dict:
    from deepspeed.runtime import constants as c

    return {
        c.TRAIN_BATCH_SIZE: _s(I, "Global batch: micro batch x gradient accumulation x data-parallel size.",
                               minimum=1),
        c.TRAIN_MICRO_BATCH_SIZE_PER_GPU: _s(I, "Samples per GPU per forward/backward.", minimum=1),
        c.GRADIENT_ACCUMULATION_STEPS: _s(I, "Micro batches accumulated per optimizer step.", minimum=1),
        "managed_gradient_accumulation": _s(B, "DeepSpeed manages gradient accumulation boundaries.", True),
        c.STEPS_PER_PRINT: _s(I, "Print progress every N steps.", minimum=1),
        c.GRADIENT_CLIPPING: _s(N, "Clip gradients to this global norm (0 = off). DeepSpeed's default is 1.0.",
                                c.GRADIENT_CLIPPING_DEFAULT, minimum=0),
        c.COMMUNICATION_DATA_TYPE: _s([S, "null"], "dtype for gradient all-reduce.", None,
                                      pattern="^(?i:fp16|bf16|fp32)$"),
        c.SEQ_PARALLEL_COMMUNICATION_DATA_TYPE: _s(S, "dtype for sequence-parallel communication.", "fp32",
                                                   pattern="^(?i:fp16|bf16|fp32)$"),
        c.PRESCALE_GRADIENTS: _s(B, "Scale gradients before all-reduce.", False),
        c.GRADIENT_PREDIVIDE_FACTOR: _s(N, "Divide gradients by this before all-reduce.", 1.0, exclusiveMinimum=0),
        "gradient_allreduce_op": _s(S, "Reduction of gradients across data-parallel ranks.", "mean",
                                    pattern="^(?i:mean|sum)$"),
        c.DISABLE_ALLGATHER: _s(B, "Disable allgather (use broadcast).", False),
        c.DUMP_STATE: _s(B, "Print the DeepSpeed state after initialize.", False),
        "disable_python_gc": _s(B, "Disable Python's garbage collector during training.", False),
        c.VOCABULARY_SIZE: _s(I, "Vocabulary size (a multiple of 8 is faster).", minimum=1),
        c.WALL_CLOCK_BREAKDOWN: _s(B, "Time forward/backward/step.", False),
        c.MEMORY_BREAKDOWN: _s(B, "Report memory after each phase.", False),
        c.ZERO_ALLOW_UNTESTED_OPTIMIZER: _s(B, "Allow an optimizer ZeRO was not tested with.", False),
        c.ZERO_FORCE_DS_CPU_OPTIMIZER: _s(B, "Require DeepSpeed's CPU optimizer with ZeRO-Offload.", True),
        "use_data_before_expert_parallelism": _s(B, "Data-parallel groups before expert-parallel groups.", False),
        c.DATALOADER_DROP_LAST: _s(B, "Drop the last incomplete batch.", False),
        "log_level": _s(S, "DeepSpeed's log level (checked at initialize).",
                        enum=["debug", "info", "warning", "error", "critical"]),
        "sequence_parallel_size": _s(I, "Ulysses sequence-parallel size (divides the data-parallel size).",
                                     minimum=1),
        "data_parallel_size": _s(I, "Data-parallel size for the DPxSP mesh (with sequence_parallel_size).",
                                 minimum=1),
    }


# ---------------------------------------------------------------------------- optimizers and schedulers


def _param_schema(name: str, param: inspect.Parameter) -> dict:
    default = param.default
    doc = "required" if default is inspect.Parameter.empty else f"default {default!r}"
    if isinstance(default, bool):
        kind = B
    elif isinstance(default, int):
        kind = [I, N] if name in ("lr", "weight_decay", "eps", "momentum", "dampening") else I
    elif isinstance(default, float):
        kind = N
    elif isinstance(default, (tuple, list)):  # betas=(0.9, 0.999): the constructor unpacks exactly that many
        item = {"type": [N, "null"]} if None in default else {"type": N}  # Adafactor's eps=(None, 1e-3)
        return _s("array", doc, list(default), items=item, minItems=len(default), maxItems=len(default))
    elif isinstance(default, str):
        kind = S
    elif "lr" in name or "mom" in name or name in ("eps", "betas", "weight_decay"):
        kind = [N, "null"] if default is None else N
    else:
        kind = None  # None default or required: any JSON value DeepSpeed would pass through
    if kind == [I, N]:
        kind = N
    out = _s(kind, doc)
    if name in ("lr", "weight_decay", "eps"):
        out["minimum"] = 0
    return out


def _signature_params(callables, *, skip=("self", "params", "optimizer", "model_params", "model")) -> dict:
    props: dict = {}
    required: set[str] | None = None
    for fn in callables:
        sig = inspect.signature(fn)
        req = set()
        for pname, param in sig.parameters.items():
            if pname in skip or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                continue
            props.setdefault(pname, _param_schema(pname, param))
            if param.default is inspect.Parameter.empty:
                req.add(pname)
        required = req if required is None else required & req
    return props, sorted(required or ())


def _optimizers() -> tuple[dict, dict]:
    import torch

    from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad
    from deepspeed.ops.adam import DeepSpeedCPUAdam, FusedAdam
    from deepspeed.ops.lamb import FusedLamb
    from deepspeed.ops.lion import DeepSpeedCPULion, FusedLion
    from deepspeed.runtime.config import DEEPSPEED_OPTIMIZERS

    extra_adam = {
        "torch_adam": _s(B, "Use torch.optim.Adam/AdamW instead of FusedAdam (no C++ build).", False),
        "adam_w_mode": _s(B, "Decoupled weight decay; DeepSpeed defaults it to true, so 'Adam' is AdamW.", True),
        "fp32_optimizer_states": _s(B, "Keep optimizer states in fp32 (CPU offload).", True),
        "foreach": _s([B, "null"], "torch foreach implementation (with torch_adam).", None),
        "fused": _s([B, "null"], "torch fused implementation (with torch_adam).", None),
    }
    muon = {k: _s(t, "Muon option.") for k, t in dict(
        lr=N, momentum=N, weight_decay=N, ns_method=S, muon_lr=N, adam_lr=N, betas="array", eps=N,
        per_head_muon=B).items()}
    impls = {
        "adam": [FusedAdam, DeepSpeedCPUAdam, torch.optim.Adam, torch.optim.AdamW],
        "adamw": [FusedAdam, DeepSpeedCPUAdam, torch.optim.AdamW],
        "adagrad": [torch.optim.Adagrad, DeepSpeedCPUAdagrad],
        "lamb": [FusedLamb],
        "lion": [FusedLion, DeepSpeedCPULion],
    }
    defs: dict = {}
    for name in DEEPSPEED_OPTIMIZERS:
        if name in impls:
            props, _ = _signature_params(impls[name])
            if name in ("adam", "adamw"):
                props.update(extra_adam)
            if name in ("adagrad", "lion"):
                props["fp32_optimizer_states"] = extra_adam["fp32_optimizer_states"]
        elif name == "muon":
            props = muon
        else:  # muadam/muadamw/musgd come from the optional `mup` package: its names are not known here
            defs[name] = {"type": "object", "description": f"DeepSpeed optimizer '{name}' (needs the mup package); "
                          "its parameters are not checked."}
            continue
        defs[name] = _obj(props, f"Parameters of DeepSpeed's '{name}' optimizer ({', '.join(c.__name__ for c in impls.get(name, []))}).")
    torch_names = []
    for attr in sorted(dir(torch.optim)):
        cls = getattr(torch.optim, attr)
        if isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer) and cls is not torch.optim.Optimizer:
            torch_names.append(attr)
            props, req = _signature_params([cls])
            defs[f"torch.{attr}"] = _obj(props, f"Parameters of torch.optim.{attr}.", **({"required": req} if req else {}))
    return defs, {"deepspeed": list(DEEPSPEED_OPTIMIZERS), "torch": torch_names}


def _schedulers() -> tuple[dict, dict]:
    import torch

    from deepspeed.runtime import lr_schedules

    defs: dict = {}
    ds_names = list(lr_schedules.VALID_LR_SCHEDULES)
    for name in ds_names:
        props, req = _signature_params([getattr(lr_schedules, name)])
        for key in ("warmup_num_steps", "lr_range_test_step_size", "cycle_first_step_size", "total_num_steps"):
            if key in props:
                props[key] = {**props[key], "type": I, "minimum": 1,
                              "description": props[key]["description"] + "; a positive integer"}
        if "warmup_type" in props:
            props["warmup_type"]["enum"] = ["log", "linear"]
        defs[name] = _obj(props, f"Parameters of deepspeed.runtime.lr_schedules.{name}.",
                          **({"required": req} if req else {}))
    torch_names = []
    base = torch.optim.lr_scheduler.LRScheduler
    for attr in sorted(dir(torch.optim.lr_scheduler)):
        cls = getattr(torch.optim.lr_scheduler, attr)
        if isinstance(cls, type) and issubclass(cls, base) and cls is not base and not attr.startswith("_"):
            torch_names.append(attr)
            props, req = _signature_params([cls])
            defs[f"torch.{attr}"] = _obj(props, f"Parameters of torch.optim.lr_scheduler.{attr}.",
                                         **({"required": req} if req else {}))
    return defs, {"deepspeed": ds_names, "torch": torch_names}


def _zenflow_validator() -> dict:
    """What ``ZenFlowConfig.validate_fields`` (``deepspeed/runtime/zenflow/zenflow_config.py:52-65``, a
    pydantic model validator the field annotations do not show) accepts: ``select_strategy`` one of
    "auto", "step", "epoch"; ``select_interval`` "auto" or an integer; ``update_interval`` "auto" or an
    integer >= 1. The source is checked here so that a changed validator breaks the generator."""
    from deepspeed.runtime.zenflow.zenflow_config import ZenFlowConfig

    source = inspect.getsource(ZenFlowConfig.validate_fields)
    for needle in ('["auto", "step", "epoch"]', 'self.select_interval != "auto"', 'self.update_interval != "auto"',
                   "self.update_interval < 1"):
        if needle not in source:
            raise SystemExit(f"schema_gen: ZenFlowConfig.validate_fields changed ({needle!r} is gone); update "
                             "_zenflow_validator")
    fields = ZenFlowConfig.model_fields
    docs = _attribute_docs(ZenFlowConfig)

    def field(name: str, **rule) -> dict:
        return {"description": fields[name].description or docs.get(name, ""), "default": fields[name].default, **rule}

    return {
        "select_strategy": field("select_strategy", type=S, enum=["auto", "step", "epoch"]),
        "select_interval": field("select_interval", anyOf=[{"const": "auto"}, {"type": I}]),
        "update_interval": field("update_interval", anyOf=[{"const": "auto"}, {"type": I, "minimum": 1}]),
    }


# ---------------------------------------------------------------------------- the whole document


def build_schema() -> dict:
    import deepspeed
    from deepspeed.comm.config import CommsLoggerConfig
    from deepspeed.compile.config import CompileConfig
    from deepspeed.inference.config import WeightQuantConfig
    from deepspeed.monitor.config import CometConfig, CSVConfig, TensorBoardConfig, WandbConfig
    from deepspeed.runtime.config import HybridEngineConfig
    from deepspeed.runtime.precision_config import DeepSpeedBF16Config, DeepSpeedFP16Config
    from deepspeed.runtime.tensor_parallel.config import TPTrainingConfig
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from deepspeed.utils.config import DeepSpeedThroughputTimerConfig

    if deepspeed.__version__ != DS_VERSION:
        raise SystemExit(f"schema_gen: DeepSpeed {deepspeed.__version__} installed, expected {DS_VERSION}")

    zero = model_schema(DeepSpeedZeroConfig, "ZeRO redundancy optimizer: stages 0-3, offload, ZeRO++. "
                        "Also accepts the legacy form true/false (stage 1/0).")
    zero["type"] = ["object", "boolean"]
    zero["properties"]["zenflow"]["properties"].update(_zenflow_validator())
    bf16 = model_schema(DeepSpeedBF16Config, "bfloat16 mixed precision.")
    opt_defs, opt_names = _optimizers()
    sched_defs, sched_names = _schedulers()
    props = dict(_top_scalars())
    props.update({
        "zero_optimization": zero,
        "fp16": model_schema(DeepSpeedFP16Config, "fp16 mixed precision with loss scaling."),
        "bf16": bf16,
        "bfloat16": {**bf16, "deprecated": True, "x-dstk-replaced-by": "bf16",
                     "description": "Legacy name of `bf16`; used only when `bf16` is absent."},
        "optimizer": _obj({
            "type": _s(S, "A DeepSpeed optimizer (case-insensitive) or a torch.optim class (case-sensitive)."),
            "params": _s("object", "Keyword arguments of the optimizer; see $defs/optimizer_params."),
            "legacy_fusion": _s(B, "Legacy fused optimizer.", False),
        }, "Optimizer DeepSpeed builds (a client optimizer passed to initialize overrides it)."),
        "scheduler": _obj({
            "type": _s(S, "A deepspeed.runtime.lr_schedules or torch.optim.lr_scheduler class (case-sensitive)."),
            "params": _s("object", "Keyword arguments of the scheduler; see $defs/scheduler_params."),
        }, "Learning-rate scheduler, built at initialize."),
        "tensorboard": model_schema(TensorBoardConfig),
        "wandb": model_schema(WandbConfig),
        "csv_monitor": model_schema(CSVConfig),
        "comet": model_schema(CometConfig),
        "comms_logger": model_schema(CommsLoggerConfig, "Communication logger. Logging is ON whenever this key "
                                     "is present, whatever `enabled` says."),
        "hybrid_engine": model_schema(HybridEngineConfig),
        "compile": model_schema(CompileConfig),
        "tensor_parallel": model_schema(TPTrainingConfig, "AutoTP tensor-parallel training."),
        "weight_quantization": model_schema(WeightQuantConfig),
    })
    props.update(_plain_sections())
    props["$schema"] = _s(S, "Where editors find this schema (e.g. the output of `dstk schema`); DeepSpeed "
                          "ignores it.", format="uri-reference")
    props["timers"]["properties"]["throughput"] = model_schema(DeepSpeedThroughputTimerConfig)
    props = dict(sorted(props.items()))
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://dstk.invalid/schemas/deepspeed-{DS_VERSION}.schema.json",
        "title": f"DeepSpeed {DS_VERSION} configuration",
        "description": "Every key DeepSpeed reads from ds_config. Unknown keys are errors at every level "
                       "(DeepSpeed itself ignores unknown top-level keys). Generated by dstk.validate.schema_gen.",
        "type": "object",
        "properties": props,
        "additionalProperties": False,
        "x-dstk-deepspeed-version": DS_VERSION,
        "x-dstk-optimizers": opt_names,
        "x-dstk-schedulers": sched_names,
        "$defs": {"optimizer_params": opt_defs, "scheduler_params": sched_defs},
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = pathlib.Path(argv[0]) if argv else pathlib.Path(__file__).resolve().parent.parent / "data" / \
        f"deepspeed-{DS_VERSION}.schema.json"
    text = json.dumps(build_schema(), indent=1, sort_keys=False) + "\n"
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=".schema-")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, out)
    print(f"wrote {out} ({len(text)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
