"""Generate ``toolkit/data/deepspeed-<minor>.schema.json`` from one DeepSpeed release's own code.

    python -m dstk.validate.schema_gen                       # the installed deepspeed -> its minor's file
    python -m dstk.validate.schema_gen --deepspeed-src DIR   # an unpacked sdist (DIR/deepspeed/...), e.g.
        pip download deepspeed==0.14.5 --no-deps --no-binary :all: -d /tmp && tar xzf /tmp/deepspeed-0.14.5.tar.gz -C /tmp
        python -m dstk.validate.schema_gen --deepspeed-src /tmp/deepspeed-0.14.5 --version 0.14.5

``--deepspeed-src`` puts DIR first on ``sys.path``, so ``import deepspeed`` loads that release (its
pydantic models, key constants, optimizer and scheduler classes) next to the installed torch; nothing of
it is copied, only the generated schema is written (minified, one file per minor release). This imports
deepspeed and torch; it never runs on the fast path.

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

import argparse
import ast
import enum
import functools
import importlib
import inspect
import json
import os
import pathlib
import sys
import tempfile
import textwrap
import types
import typing

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
    if isinstance(ann, type) and (issubclass(ann, pydantic.BaseModel) or _is_v1_model(ann)):
        return model_schema(ann)
    if isinstance(ann, type) and issubclass(ann, (bool, int, float, str)):  # pydantic v1's conint(...) and kin
        out = _annotation(next(t for t in (bool, int, float, str) if issubclass(ann, t)))
        for attr, key in (("ge", "minimum"), ("gt", "exclusiveMinimum"), ("le", "maximum"), ("lt", "exclusiveMaximum")):
            if getattr(ann, attr, None) is not None:
                out[key] = getattr(ann, attr)
        return out
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


def _is_v1_model(cls) -> bool:
    """A pydantic v1 model (DeepSpeed 0.14 still built its config models on ``pydantic.v1``)."""
    try:
        from pydantic import v1
    except ImportError:
        return False
    return isinstance(cls, type) and issubclass(cls, v1.BaseModel)


def _fields(cls):
    """(name, annotation, alias, default, description, constraints, extra) of each field, pydantic v2 or v1."""
    if _is_v1_model(cls):
        for name, field in cls.__fields__.items():
            info = field.field_info
            cons = {key: getattr(info, attr) for attr, key in (("ge", "minimum"), ("gt", "exclusiveMinimum"),
                    ("le", "maximum"), ("lt", "exclusiveMaximum")) if getattr(info, attr, None) is not None}
            default = None if field.required else field.default
            yield (name, getattr(field, "annotation", field.outer_type_), field.alias, default, info.description, cons,
                   info.extra if isinstance(info.extra, dict) else {})
        return
    from pydantic_core import PydanticUndefined

    for name, field in cls.model_fields.items():
        default = None if field.default is PydanticUndefined else field.default
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        yield name, field.annotation, field.alias, default, field.description, _constraints(field), extra


def model_schema(cls, description: str = "") -> dict:
    """The JSON schema of one DeepSpeed pydantic config model (``extra="forbid"``: closed)."""
    docs = _attribute_docs(cls)
    props: dict = {}
    for name, annotation, alias, field_default, field_doc, cons, extra in _fields(cls):
        sub = dict(_annotation(annotation))
        sub.update(cons)
        doc = field_doc or docs.get(name, "")
        if doc:
            sub["description"] = doc
        if field_default is not None:
            default = _jsonable(field_default)
            if default is not ... and not isinstance(default, dict):
                sub["default"] = default
        if extra.get("deprecated"):
            sub["deprecated"] = True
            if extra.get("new_param"):
                sub["x-dstk-replaced-by"] = extra["new_param"]
        props[name] = sub
        if alias and alias != name:
            props[alias] = {**sub, "description": f"Alias of `{name}`. " + sub.get("description", "")}
    doc = description or " ".join(inspect.cleandoc(cls.__doc__ or "").split("\n\n")[0].split())
    return _obj(props, doc[:400], **{"x-dstk-parser": f"pydantic {cls.__module__}.{cls.__qualname__}"})



# ---------------------------------------------------------------------------- one release's own code

MISSING = "\x00missing:"
"""Prefix of what :class:`_Consts` returns for a constant the release does not define: keys and values
carrying it are pruned by :func:`_prune` (that release cannot read such a key)."""


class _Consts:
    """A DeepSpeed constants module whose missing names read as ``MISSING + name`` instead of raising, so
    the one generator below runs against every release from 0.14 on."""

    def __init__(self, dotted: str):
        try:
            self._module = importlib.import_module(dotted)
        except ImportError:
            self._module = None

    def __getattr__(self, name: str):
        return getattr(self._module, name, MISSING + name) if self._module is not None else MISSING + name


@functools.cache
def _release_text() -> str:
    """All Python source of the imported ``deepspeed`` package, for :func:`_reads`."""
    import deepspeed

    root = pathlib.Path(deepspeed.__file__).parent
    parts = []
    for path in sorted(root.rglob("*.py")):
        if "inference/v2" in path.as_posix() or "/ops/csrc/" in path.as_posix():
            continue
        try:
            parts.append(path.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            continue
    return "\n".join(parts)


def _reads(key: str) -> bool:
    """Whether the release's source names ``key`` as a string literal: the test for keys of the plain-dict
    sections (read with ``dict.get``/``get_scalar_param`` by name), which have no model to walk. A key
    that a release cannot name is one it cannot read."""
    text = _release_text()
    return f'"{key}"' in text or f"'{key}'" in text


def _model(*dotted: str):
    """The first of these pydantic model classes that the release has, or None."""
    for path in dotted:
        module, _, name = path.rpartition(".")
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
    return None


def _is_pydantic(node: dict) -> bool:
    return str(node.get("x-dstk-parser", "")).startswith("pydantic")


def _prune(node, *, top: bool = False):
    """Drop from the plain-dict sections what the release cannot read: keys built from a constant it
    lacks (``MISSING``) and keys its source never names. Pydantic sections come from the release's own
    models and are left as they are."""
    if isinstance(node, list):
        return [_prune(v) for v in node if not (isinstance(v, str) and v.startswith(MISSING))]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if isinstance(key, str) and key.startswith(MISSING):
            continue
        if isinstance(value, str) and value.startswith(MISSING):
            continue
        if key == "properties" and isinstance(value, dict) and not _is_pydantic(node):
            value = {k: v for k, v in value.items() if k == "$schema" or (not k.startswith(MISSING) and _reads(k))}
        out[key] = value if (isinstance(value, dict) and _is_pydantic(value)) else _prune(value)
    return out


def release_version() -> str:
    """The imported deepspeed's version, without a local tag (``0.14.5``)."""
    import deepspeed

    return deepspeed.__version__.strip().split("+")[0]


def minor_of(version: str) -> str:
    return ".".join(version.split(".")[:2])


def schema_id(minor: str) -> str:
    """The schema's ``$id``: a URN, not a URL. dstk has no web host to publish under, and a URL that does
    not resolve (the old placeholder) makes editors that fetch ``$id`` report an error; a URN names the
    schema stably (one per DeepSpeed minor release), and editors take the schema from the file ``dstk
    schema`` writes (VS Code ``json.schemas`` or a ``$schema`` path), never from the ``$id``."""
    return f"urn:dstk:schema:deepspeed-config:{minor}"


# ---------------------------------------------------------------------------- plain-dict sections


def _plain_sections() -> dict:
    at = _Consts("deepspeed.autotuning.constants")
    fp = _Consts("deepspeed.profiling.constants")
    c = _Consts("deepspeed.runtime.constants")
    de = _Consts("deepspeed.runtime.data_pipeline.constants")
    aio = _Consts("deepspeed.runtime.swap_tensor.constants")

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
        aio.AIO_THREAD_COUNT: _s(I, "I/O threads (0.14; intra_op_parallelism from 0.15).", aio.AIO_THREAD_COUNT_DEFAULT,
                                 minimum=1),
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

    names = [name for name, member in DtypeEnum._value2member_map_.items()
             if isinstance(name, str) and member is not DtypeEnum.int8]
    if not names:  # before the aliases were registered (0.14-0.16), a member's value is the tuple of its names
        names = [v for member in DtypeEnum if member.name != "int8" for v in member.value if isinstance(v, str)]
    return names


def _top_scalars() -> dict:
    c = _Consts("deepspeed.runtime.constants")

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

    from deepspeed.runtime.config import DEEPSPEED_OPTIMIZERS

    def classes(*dotted):
        return [cls for cls in (_model(d) for d in dotted) if cls is not None]

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
    adam = classes("deepspeed.ops.adam.FusedAdam", "deepspeed.ops.adam.DeepSpeedCPUAdam")
    impls = {
        "adam": adam + [torch.optim.Adam, torch.optim.AdamW],
        "adamw": adam + [torch.optim.AdamW],
        "adagrad": [torch.optim.Adagrad, *classes("deepspeed.ops.adagrad.DeepSpeedCPUAdagrad")],
        "lamb": classes("deepspeed.ops.lamb.FusedLamb"),
        "lion": classes("deepspeed.ops.lion.FusedLion", "deepspeed.ops.lion.DeepSpeedCPULion"),
        # the 1-bit optimizers (removed in 0.19): DeepSpeed passes the whole params dict to their constructors
        "onebitadam": classes("deepspeed.runtime.fp16.onebit.adam.OnebitAdam"),
        "onebitlamb": classes("deepspeed.runtime.fp16.onebit.lamb.OnebitLamb"),
        "zerooneadam": classes("deepspeed.runtime.fp16.onebit.zoadam.ZeroOneAdam"),
    }
    impls = {k: v for k, v in impls.items() if v}
    defs: dict = {}
    for name in DEEPSPEED_OPTIMIZERS:
        if name in impls:
            props, _ = _signature_params(impls[name])
            if name in ("adam", "adamw"):
                props.update(extra_adam)
            if name in ("adagrad", "lion"):
                props["fp32_optimizer_states"] = extra_adam["fp32_optimizer_states"]
            props.pop("deepspeed", None)  # the engine, passed positionally to the 1-bit optimizers
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
    for needle in ('["auto", "step", "epoch"]', 'self.select_interval != "auto"', 'self.update_interval != "auto"'):
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
        "update_interval": field("update_interval", anyOf=[{"const": "auto"}, {"type": I, **(
            {"minimum": 1} if "self.update_interval < 1" in source else {})}]),  # the bound came in 0.19
    }


# ---------------------------------------------------------------------------- the whole document


REMOVED_SECTIONS = {
    "amp": "object", "compression_training": "object", "curriculum_learning": "object",
    "elasticity": "object", "graph_harvesting": "boolean", "nebula": "object",
    "progressive_layer_drop": "object", "quantize_training": "object", "sparse_attention": "object",
    "sparse_gradients": "boolean",
}
"""Top-level keys DeepSpeed 0.19 removed (``runtime/config.py`` ``_REMOVED_TOP_LEVEL_CONFIG_KEYS``): a release
that still reads one gets it as an open section (its contents are not typed by dstk), except ``elasticity``
and ``progressive_layer_drop`` (typed below). ``eigenvalue`` is not here: before 0.19 it was read only inside
``quantize_training`` (``get_eigenvalue_config`` reads ``param_dict[QUANTIZE_TRAINING]``), so a top-level
block was ignored, and it stays an unknown key (DS101)."""


def _progressive_layer_drop() -> dict:
    """``progressive_layer_drop`` before 0.19: ``get_pld_params`` pops ``enabled`` from a copy of the block
    unconditionally (a KeyError when it is missing) and the engine builds ``ProgressiveLayerDrop(theta=...,
    gamma=...)`` from ``PLD_THETA``/``PLD_GAMMA`` (``runtime/config.py``, ``runtime/engine.py``)."""
    c = _Consts("deepspeed.runtime.constants")
    return _obj({
        c.PLD_ENABLED: _s(B, "Enable Progressive Layer Dropping (required: DeepSpeed pops it).", c.PLD_ENABLED_DEFAULT),
        c.PLD_THETA: _s(N, "Keep probability floor theta.", c.PLD_THETA_DEFAULT),
        c.PLD_GAMMA: _s(N, "Decay rate gamma.", c.PLD_GAMMA_DEFAULT),
    }, "Progressive Layer Dropping (removed in 0.19). plain dict: DeepSpeed reads it with dict.get",
        required=[c.PLD_ENABLED])


def _elasticity() -> dict:
    """``elasticity`` before 0.19 (``elasticity/config.py`` ``ElasticityConfig``, a plain class over the keys of
    ``elasticity/constants.py``): when ``enabled`` it raises ``ElasticityConfigError`` without
    ``max_train_batch_size`` or ``micro_batch_sizes``, and on micro batch sizes that are not positive integers."""
    e = _Consts("deepspeed.elasticity.constants")
    props = {
        e.ENABLED: _s(B, "Enable elastic training.", False),
        e.MAX_ACCEPTABLE_BATCH_SIZE: _s(I, "Largest global batch (required when enabled).", minimum=1),
        e.MICRO_BATCHES: _s("array", "Candidate micro batch sizes (required when enabled).",
                            items={"type": I, "minimum": 1}, minItems=1),
        e.MIN_GPUS: _s(I, "Fewest GPUs.", e.MIN_GPUS_DEFAULT, minimum=1),
        e.MAX_GPUS: _s(I, "Most GPUs.", e.MAX_GPUS_DEFAULT, minimum=1),
        e.NUM_GPUS_PER_NODE: _s(I, "GPUs per node.", e.NUM_GPUS_PER_NODE_DEFAULT, minimum=1),
        e.MODEL_PARALLEL_SIZE: _s(I, "Model-parallel size.", e.MODEL_PARALLEL_SIZE_DEFAULT, minimum=1),
        e.MIN_TIME: _s(I, "Minimum running time (minutes) before a scale event.", e.MIN_TIME_DEFAULT, minimum=0),
        e.PREFER_LARGER_BATCH: _s(B, "Prefer a larger global batch.", e.PREFER_LARGER_BATCH_DEFAULT),
        e.IGNORE_NON_ELASTIC_BATCH_INFO: _s(B, "Ignore the batch keys outside this block.",
                                            e.IGNORE_NON_ELASTIC_BATCH_INFO_DEFAULT),
        e.VERSION: _s(N, "Elasticity algorithm version.", e.VERSION_DEFAULT),
    }
    return _obj(props, "Elastic training (removed in 0.19). plain dict: DeepSpeed reads it with dict.get, so a "
                "typo here is silently ignored", anyOf=[
                    {"properties": {e.ENABLED: {"const": False}}},
                    {"required": [e.MAX_ACCEPTABLE_BATCH_SIZE, e.MICRO_BATCHES]}])


def _legacy_precision(name: str, prefix: str) -> dict:
    """fp16/bf16 before ``precision_config.py`` (0.14-0.16): plain dicts read with ``get_scalar_param``;
    the keys are the release's ``FP16_*``/``BFLOAT16_*`` constants, typed by their ``_DEFAULT``."""
    from deepspeed.runtime import constants as c

    props = {}
    for attr in sorted(vars(c)):
        value = getattr(c, attr)
        if (not attr.startswith(prefix + "_") or attr.endswith(("_DEFAULT", "_FORMAT", "_OLD"))
                or not isinstance(value, str) or value in props):
            continue
        default = getattr(c, attr + "_DEFAULT", None)
        if isinstance(default, bool):
            kind = B
        elif isinstance(default, int):
            kind = N if "loss_scale" in value and "window" not in value else I
        elif isinstance(default, float):
            kind = N
        else:
            kind = None
        props[value] = _s(kind, f"{name} option (constant {attr}).", *(() if default is None else (default,)))
    return _obj(props, f"{name} mixed precision. plain dict: DeepSpeed reads it with dict.get, so a typo here is "
                "silently ignored")


def _removed_tables() -> dict:
    """The release's own removed-key tables (``runtime/config.py``; empty before 0.19)."""
    from deepspeed.runtime import config

    return {"top_level": dict(getattr(config, "_REMOVED_TOP_LEVEL_CONFIG_KEYS", {})),
            "zero_optimization": dict(getattr(config, "_REMOVED_ZERO_CONFIG_KEYS", {}))}


def build_schema(*, expect_version: str | None = None) -> dict:
    """The schema of the imported deepspeed release (its minor names the file)."""
    version = release_version()
    if expect_version is not None and version != expect_version and minor_of(version) != expect_version:
        raise SystemExit(f"schema_gen: DeepSpeed {version} imported, expected {expect_version}")
    minor = minor_of(version)
    zero_cls = _model("deepspeed.runtime.zero.config.DeepSpeedZeroConfig")
    zero = model_schema(zero_cls, "ZeRO redundancy optimizer: stages 0-3, offload, ZeRO++. "
                        "Also accepts the legacy form true/false (stage 1/0).")
    zero["type"] = ["object", "boolean"]
    if "zenflow" in zero["properties"]:
        zero["properties"]["zenflow"]["properties"].update(_zenflow_validator())
    fp16_cls = _model("deepspeed.runtime.precision_config.DeepSpeedFP16Config")
    bf16_cls = _model("deepspeed.runtime.precision_config.DeepSpeedBF16Config")
    fp16 = (model_schema(fp16_cls, "fp16 mixed precision with loss scaling.") if fp16_cls
            else _legacy_precision("fp16", "FP16"))
    bf16 = model_schema(bf16_cls, "bfloat16 mixed precision.") if bf16_cls else _legacy_precision("bf16", "BFLOAT16")
    opt_defs, opt_names = _optimizers()
    sched_defs, sched_names = _schedulers()
    removed = _removed_tables()
    props = dict(_top_scalars())
    props.update({
        "fp16": fp16,
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
    })
    props.update(_plain_sections())
    for key, kind in REMOVED_SECTIONS.items():
        if key == "elasticity" and key not in removed["top_level"] and _reads(key):
            props[key] = _elasticity()
        elif key == "progressive_layer_drop" and key not in removed["top_level"] and _reads(key):
            props[key] = _progressive_layer_drop()
        elif key not in removed["top_level"] and _reads(key):
            props[key] = {"type": kind, **({"additionalProperties": {}} if kind == "object" else {}),
                          "description": f"Read by DeepSpeed {minor} (removed in 0.19); its contents are not "
                                         "checked by dstk."}
    props = _prune({"properties": props})["properties"]
    pydantic_sections = {
        "zero_optimization": zero,
        "tensorboard": ("deepspeed.monitor.config.TensorBoardConfig",),
        "wandb": ("deepspeed.monitor.config.WandbConfig",),
        "csv_monitor": ("deepspeed.monitor.config.CSVConfig",),
        "comet": ("deepspeed.monitor.config.CometConfig",),
        "comms_logger": ("deepspeed.comm.config.CommsLoggerConfig", "Communication logger. Logging is ON whenever "
                         "this key is present, whatever `enabled` says."),
        "hybrid_engine": ("deepspeed.runtime.config.HybridEngineConfig",),
        "compile": ("deepspeed.compile.config.CompileConfig",),
        "tensor_parallel": ("deepspeed.runtime.tensor_parallel.config.TPTrainingConfig",
                            "AutoTP tensor-parallel training."),
        "weight_quantization": ("deepspeed.inference.config.WeightQuantConfig",),
    }
    for key, spec in pydantic_sections.items():
        if isinstance(spec, dict):
            props[key] = spec
            continue
        cls = _model(spec[0])
        if cls is not None and _reads(key):
            props[key] = model_schema(cls, *spec[1:])
    if fp16_cls:
        props["fp16"], props["bf16"] = fp16, bf16
        props["bfloat16"] = {**bf16, "deprecated": True, "x-dstk-replaced-by": "bf16",
                             "description": "Legacy name of `bf16`; used only when `bf16` is absent."}
    props["$schema"] = _s(S, "Where editors find this schema (e.g. the output of `dstk schema`); DeepSpeed "
                          "ignores it.", format="uri-reference")
    throughput = _model("deepspeed.utils.config.DeepSpeedThroughputTimerConfig")
    if "timers" in props and throughput is not None:
        props["timers"]["properties"]["throughput"] = model_schema(throughput)
    props = dict(sorted(props.items()))
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": schema_id(minor),
        "title": f"DeepSpeed {minor} configuration",
        "description": f"Every key DeepSpeed {version} reads from ds_config. Unknown keys are errors at every level "
                       "(DeepSpeed itself ignores unknown top-level keys). Generated by dstk.validate.schema_gen "
                       f"from DeepSpeed {version}'s own config models and key constants.",
        "type": "object",
        "properties": props,
        "additionalProperties": False,
        "x-dstk-deepspeed-version": version,
        "x-dstk-optimizers": opt_names,
        "x-dstk-schedulers": sched_names,
        "x-dstk-removed": removed,
        "$defs": {"optimizer_params": opt_defs, "scheduler_params": sched_defs},
    }


def default_path(minor: str) -> pathlib.Path:
    return pathlib.Path(__file__).resolve().parent.parent / "data" / f"deepspeed-{minor}.schema.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dstk.validate.schema_gen", description=__doc__.split("\n")[0])
    parser.add_argument("out", nargs="?", help="where to write (default: toolkit/data/deepspeed-<minor>.schema.json)")
    parser.add_argument("--deepspeed-src", metavar="DIR",
                        help="an unpacked DeepSpeed source tree (DIR/deepspeed/__init__.py); default: the installed one")
    parser.add_argument("--version", metavar="X", help="the release DIR must be (0.14 or 0.14.5); a check")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.deepspeed_src:
        src = pathlib.Path(args.deepspeed_src).resolve()
        if not (src / "deepspeed" / "__init__.py").is_file():
            raise SystemExit(f"schema_gen: {src} has no deepspeed/__init__.py (pass the unpacked sdist's folder)")
        if "deepspeed" in sys.modules and not pathlib.Path(sys.modules["deepspeed"].__file__).is_relative_to(src):
            raise SystemExit("schema_gen: another deepspeed is already imported; run in a fresh process")
        sys.path.insert(0, str(src))
    schema = build_schema(expect_version=args.version)
    out = pathlib.Path(args.out) if args.out else default_path(minor_of(schema["x-dstk-deepspeed-version"]))
    text = json.dumps(schema, separators=(",", ":"), sort_keys=False) + "\n"
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=".schema-")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, out)
    print(f"wrote {out} ({len(text)} bytes, DeepSpeed {schema['x-dstk-deepspeed-version']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
