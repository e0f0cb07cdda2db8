"""Drift: the shipped schema against the installed DeepSpeed's own config models and key constants.

Fails where DeepSpeed has a key, a type or an enum value that the schema lacks, so a DeepSpeed
upgrade cannot silently make ``dstk validate`` reject (or miss) real keys.
"""

from __future__ import annotations

import enum
import json
import typing

import pytest

from dstk.validate import rules
from dstk.validate.schema import load_schema, schema_text

deepspeed = pytest.importorskip("deepspeed")

MODELS = {  # schema pointer -> dotted path of the pydantic model DeepSpeed parses that section with
    "/properties/zero_optimization": "deepspeed.runtime.zero.config.DeepSpeedZeroConfig",
    "/properties/fp16": "deepspeed.runtime.precision_config.DeepSpeedFP16Config",
    "/properties/bf16": "deepspeed.runtime.precision_config.DeepSpeedBF16Config",
    "/properties/tensorboard": "deepspeed.monitor.config.TensorBoardConfig",
    "/properties/wandb": "deepspeed.monitor.config.WandbConfig",
    "/properties/csv_monitor": "deepspeed.monitor.config.CSVConfig",
    "/properties/comet": "deepspeed.monitor.config.CometConfig",
    "/properties/comms_logger": "deepspeed.comm.config.CommsLoggerConfig",
    "/properties/hybrid_engine": "deepspeed.runtime.config.HybridEngineConfig",
    "/properties/compile": "deepspeed.compile.config.CompileConfig",
    "/properties/tensor_parallel": "deepspeed.runtime.tensor_parallel.config.TPTrainingConfig",
    "/properties/weight_quantization": "deepspeed.inference.config.WeightQuantConfig",
    "/properties/timers/properties/throughput": "deepspeed.utils.config.DeepSpeedThroughputTimerConfig",
}

# Key constants that are not config keys (enum values, file names, state-dict keys, launcher arguments):
NOT_KEYS = {
    # runtime/constants.py
    "ds_config", "latest", "none", "cpu", "nvme", "mean", "sum", "fp16", "bf16", "fp32", "dtype", "WARN", "IGNORE",
    "FAIL", "Warn", "Ignore", "Fail",
    "train", "eval", "predict", "encode",  # ROUTE_*: engine forward routes
    "ddp_bf16", "ds_pipe_replicated", "data_parallel_group", "global_rank",  # internal attribute/group names
    # CHECK_OVERFLOW is still documented in constants.py but DeepSpeedBF16Config rejects it (extra="forbid"):
    # keeping it out of the schema is right, and the corpus case bf16-check-overflow proves DeepSpeed rejects it.
    "check_overflow",
}


def _load(dotted: str):
    module, _, name = dotted.rpartition(".")
    return getattr(__import__(module, fromlist=[name]), name)


def _node(pointer: str) -> dict:
    node = load_schema()
    for part in pointer.strip("/").split("/"):
        node = node[part]
    return node


def _json_types(ann) -> set[str] | None:
    """The JSON types a pydantic annotation accepts (None: not expressible / anything)."""
    import pydantic

    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if origin is typing.Annotated:
        return _json_types(args[0])
    if origin in (typing.Union, getattr(__import__("types"), "UnionType")):
        out = set()
        for a in args:
            sub = {"null"} if a is type(None) else _json_types(a)
            if sub is None:
                return None
            out |= sub
        return out
    simple = {bool: {"boolean"}, int: {"integer"}, float: {"number"}, str: {"string"}, list: {"array"},
              tuple: {"array"}, dict: {"object"}}
    if ann in simple:
        return simple[ann]
    if origin in (list, tuple, set):
        return {"array"}
    if origin is dict:
        return {"object"}
    if isinstance(ann, type) and issubclass(ann, pydantic.BaseModel):
        return {"object"}
    return None


def _schema_types(node: dict) -> set[str]:
    if "anyOf" in node:
        return set().union(*(_schema_types(n) for n in node["anyOf"]))
    if "enum" in node or "const" in node:
        return {{bool: "boolean", int: "integer", float: "number", str: "string", type(None): "null"}[type(v)]
                for v in node.get("enum", [node.get("const")])}
    kind = node.get("type", [])
    out = set([kind] if isinstance(kind, str) else kind)
    return out


def _walk_model(cls, pointer: str, problems: list[str]) -> None:
    import pydantic

    node = _node(pointer)
    props = node.get("properties", {})
    if node.get("additionalProperties") is not False:
        problems.append(f"{pointer}: not closed (additionalProperties is not false)")
    for name, field in cls.model_fields.items():
        for key in {name, field.alias or name}:
            if key not in props:
                problems.append(f"{pointer}: lacks '{key}' ({cls.__name__}.{name})")
        sub = props.get(name)
        if sub is None:
            continue
        want = _json_types(field.annotation)
        if want is not None:
            have = _schema_types(sub)
            if not want <= have:
                problems.append(f"{pointer}/{name}: schema types {sorted(have)} miss {sorted(want - have)}")
        ann = field.annotation
        for a in (typing.get_args(ann) or (ann,)):
            if isinstance(a, type) and issubclass(a, enum.Enum):
                missing = {m.value for m in a} - set(sub.get("enum", []))
                if missing:
                    problems.append(f"{pointer}/{name}: enum lacks {sorted(missing)}")
            if typing.get_origin(a) is typing.Literal:
                missing = set(typing.get_args(a)) - set(sub.get("enum", []))
                if missing:
                    problems.append(f"{pointer}/{name}: enum lacks {sorted(missing)}")
            if isinstance(a, type) and issubclass(a, pydantic.BaseModel):
                _walk_model(a, f"{pointer}/properties/{name}", problems)


@pytest.mark.parametrize("pointer", sorted(MODELS))
def test_every_pydantic_field_is_in_the_schema(pointer):
    problems: list[str] = []
    _walk_model(_load(MODELS[pointer]), pointer, problems)
    assert problems == []


def _all_names(node, out: set[str]) -> set[str]:
    if isinstance(node, dict):
        for key, value in node.get("properties", {}).items():
            out.add(key)
        for key in ("enum",):
            for v in node.get(key, []):
                if isinstance(v, str):
                    out.add(v)
        pattern = node.get("pattern", "")
        if pattern.startswith("^(?i:"):
            out.update(p.lower() for p in pattern[5:-2].split("|"))
            out.update(p.upper() for p in pattern[5:-2].split("|"))
        for value in node.values():
            _all_names(value, out)
    elif isinstance(node, list):
        for value in node:
            _all_names(value, out)
    return out


KEY_MODULES = ("deepspeed.runtime.constants", "deepspeed.profiling.constants",
               "deepspeed.runtime.swap_tensor.constants", "deepspeed.runtime.data_pipeline.constants")
# data_pipeline constants that name state kept in checkpoints or random-LTD internals, not config keys
STATE_PREFIXES = ("CURRICULUM_LEARNING_CURRENT", "CURRICULUM_LEARNING_BATCH", "CURRICULUM_LEARNING_CONSUMED",
                  "CURRICULUM_LEARNING_STEP", "CURRICULUM_LEARNING_DATA_CLUSTER_", "CURRICULUM_LEARNING_NP_RNG",
                  "RANDOM_LTD_")


@pytest.mark.parametrize("module", KEY_MODULES)
def test_every_key_constant_is_in_the_schema(module):
    names = _all_names(load_schema(), set())
    mod = __import__(module, fromlist=["x"])
    missing = []
    for attr, value in vars(mod).items():
        if not attr.isupper() or attr.endswith("_DEFAULT") or not isinstance(value, str) or attr.endswith("_FORMAT"):
            continue
        if attr.startswith(STATE_PREFIXES) or value in NOT_KEYS or value in names:
            continue
        missing.append(f"{attr} = {value!r}")
    assert missing == []


def test_optimizer_and_scheduler_names_match_deepspeed():
    from deepspeed.runtime import lr_schedules
    from deepspeed.runtime.config import DEEPSPEED_OPTIMIZERS

    schema = load_schema()
    assert schema["x-dstk-optimizers"]["deepspeed"] == list(DEEPSPEED_OPTIMIZERS)
    assert schema["x-dstk-schedulers"]["deepspeed"] == list(lr_schedules.VALID_LR_SCHEDULES)
    import torch

    torch_opts = {n for n in dir(torch.optim) if isinstance(getattr(torch.optim, n), type)
                  and issubclass(getattr(torch.optim, n), torch.optim.Optimizer) and n != "Optimizer"}
    assert set(schema["x-dstk-optimizers"]["torch"]) == torch_opts


def test_removed_keys_match_deepspeed():
    from deepspeed.runtime import config

    assert set(rules.REMOVED_TOP_LEVEL) == set(config._REMOVED_TOP_LEVEL_CONFIG_KEYS)
    assert set(rules.REMOVED_ZERO) == set(config._REMOVED_ZERO_CONFIG_KEYS)


def test_shipped_schema_is_what_the_generator_writes_now(tmp_path):
    from dstk.validate import schema_gen

    out = tmp_path / "schema.json"
    schema_gen.main([str(out)])
    assert json.loads(out.read_text()) == json.loads(schema_text()), (
        "regenerate: python -m dstk.validate.schema_gen")


def test_schema_is_a_valid_draft_2020_12_schema_closed_at_every_level():
    from jsonschema import Draft202012Validator

    schema = load_schema()
    Draft202012Validator.check_schema(schema)
    open_objects = []

    def walk(node, pointer):
        if isinstance(node, dict):
            if node.get("type") == "object" or "properties" in node:
                if "properties" in node and node.get("additionalProperties") is not False and not node.get(
                        "description", "").startswith("Random layerwise") and "DataStates" not in node.get(
                        "description", ""):
                    open_objects.append(pointer)
            for k, v in node.items():
                walk(v, f"{pointer}/{k}")

    walk(schema, "")
    assert open_objects == []
    assert all("description" in v for v in schema["properties"].values())


def test_the_drift_walk_does_fail_on_a_missing_key_type_or_enum(monkeypatch):
    import copy

    import test_schema_drift as me

    broken = copy.deepcopy(load_schema())
    zero = broken["properties"]["zero_optimization"]["properties"]
    del zero["overlap_comm"]
    zero["stage"]["enum"] = [0, 1, 2]
    zero["reduce_scatter"]["type"] = "string"
    monkeypatch.setattr(me, "load_schema", lambda: broken)
    problems: list[str] = []
    _walk_model(_load(MODELS["/properties/zero_optimization"]), "/properties/zero_optimization", problems)
    text = "\n".join(problems)
    assert "lacks 'overlap_comm'" in text and "enum lacks [3]" in text and "reduce_scatter" in text
