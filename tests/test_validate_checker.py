"""dstk's own JSON Schema checker (:mod:`dstk.validate.checker`) against ``jsonschema`` as the oracle:
the same violations (keyword and path) and the same findings after translation, on the corpora, on
seeded random values at every place of the schema, and on the optimizer/scheduler parameter schemas."""

from __future__ import annotations

import json
import pathlib
import random

import pytest
from jsonschema import Draft202012Validator

from dstk.validate import checker, load_schema, read_document
from dstk.validate.schema import _translate, subschema

ROOT = pathlib.Path(__file__).parent / "data" / "validate"
VALUES = [None, True, False, 0, 1, -1, 1.0, 2.5, -0.5, 3, 1e9, "", "x", "auto", "cpu", "nvme", "1e-3", "true",
          "fp16", "bf16", "step", "Warn", "mean", [], [0.9], [0.9, 0.95], [0.9, 0.95, 0.99], ["a"], {}, {"x": 1},
          {"enabled": True}, {"stage": 3}, {"type": "AdamW"}]


def _keyed(errors) -> list[tuple]:
    out = []
    for e in errors:
        context = sorted(_keyed(e.context)) if e.context else []
        out.append((e.validator, tuple(e.absolute_path), json.dumps(e.instance, sort_keys=True, default=str),
                    tuple(e.relative_schema_path), repr(context)))
    return sorted(out)


def _findings(errors, base: str = "", what: str = "") -> list[tuple]:
    out = []
    for e in errors:
        for f in _translate(e, base=base, what=what):
            out.append((f.code, f.pointer, f.severity, "" if f.code == "DS199" else f.message, f.hint or ""))
    return sorted(out)


def _both(instance, schema):
    ours = list(checker.iter_errors(instance, schema))
    theirs = list(Draft202012Validator(schema).iter_errors(instance))
    return ours, theirs


def _places(schema: dict, prefix=()) -> list[tuple[str, ...]]:
    out = []
    for key, sub in schema.get("properties", {}).items():
        out.append(prefix + (key,))
        if isinstance(sub, dict):
            out.extend(_places(sub, prefix + (key,)))
    return out


def _corpus() -> list:
    files = sorted(p for p in ROOT.rglob("*") if p.is_file() and p.suffix in (".json", ".hjson"))
    configs = [read_document(p).config for p in files if p.parent.name in ("valid", "invalid")]
    return [c for c in configs if c is not None]


def _random_configs(count: int, seed: int) -> list:
    rng = random.Random(seed)
    places = _places(load_schema())
    out = []
    for _ in range(count):
        config = {}
        for _ in range(rng.randint(1, 4)):
            path = rng.choice(places)
            node = config
            for key in path[:-1]:
                if not isinstance(node.get(key), dict):
                    node[key] = {}
                node = node[key]
            node[path[-1]] = json.loads(json.dumps(rng.choice(VALUES)))
            if rng.random() < 0.2:
                node[path[-1] + "x"] = 1
        out.append(config)
    return out


CORPUS = _corpus()
RANDOM = _random_configs(600, seed=12)


def test_the_corpus_is_found():
    assert len(CORPUS) >= 60


@pytest.mark.parametrize("index", range(len(CORPUS)))
def test_same_errors_as_jsonschema_on_the_corpus(index):
    ours, theirs = _both(CORPUS[index], load_schema())
    assert _keyed(ours) == _keyed(theirs)
    assert _findings(ours) == _findings(theirs)


def test_same_errors_as_jsonschema_on_random_values_everywhere():
    schema = load_schema()
    disagreements = []
    violations = 0
    for config in RANDOM:
        ours, theirs = _both(config, schema)
        violations += len(theirs)
        if _keyed(ours) != _keyed(theirs) or _findings(ours) != _findings(theirs):
            disagreements.append((config, _keyed(ours), _keyed(theirs)))
    assert disagreements == []
    assert violations >= 500  # the values do break the schema in many ways


TRICKY = [  # JSON equality and types: booleans are not numbers, 1.0 is an integer
    {"zero_optimization": {"stage": True}}, {"zero_optimization": {"stage": 1.0}},
    {"zero_optimization": {"stage": False}}, {"zero_optimization": False}, {"gradient_clipping": True},
    {"train_batch_size": 8.0}, {"train_batch_size": 8.5}, {"steps_per_print": True},
    {"torch_autocast": {"dtype": 1}}, {"data_types": {"param_dtype": None}}, {"data_types": {"param_dtype": 0}},
    {"zero_optimization": {"zenflow": {"update_interval": True}}}, {"zero_optimization": {"zenflow": {
        "update_interval": 0.0}}}, {"checkpoint": {"writer": None}}, {"checkpoint": {"writer": {"type": "FAST"}}},
]


@pytest.mark.parametrize("index", range(len(TRICKY)))
def test_same_errors_as_jsonschema_on_tricky_values(index):
    ours, theirs = _both(TRICKY[index], load_schema())
    assert _keyed(ours) == _keyed(theirs)
    assert _findings(ours) == _findings(theirs)


@pytest.mark.parametrize("kind", ["optimizer_params", "scheduler_params"])
def test_same_errors_as_jsonschema_on_parameter_schemas(kind):
    rng = random.Random(kind)
    defs = load_schema()["$defs"][kind]
    names = ["lr", "betas", "eps", "weight_decay", "momentum", "total_num_steps", "warmup_num_steps",
             "warmup_type", "torch_adam", "adam_w_mode", "nope"]
    disagreements = []
    for name in sorted(defs):
        node = subschema(f"/$defs/{kind}/{name}")
        for _ in range(30):
            params = {rng.choice(names): json.loads(json.dumps(rng.choice(VALUES))) for _ in range(rng.randint(0, 3))}
            ours, theirs = _both(params, node)
            if (_keyed(ours) != _keyed(theirs)
                    or _findings(ours, base="/p", what="x") != _findings(theirs, base="/p", what="x")):
                disagreements.append((name, params))
    assert disagreements == []


def test_keywords_outside_the_supported_set_fail_loudly():
    with pytest.raises(NotImplementedError, match="uniqueItems"):
        list(checker.iter_errors([1, 1], {"uniqueItems": True}))
    with pytest.raises(NotImplementedError, match="'decimal'"):
        list(checker.iter_errors(1, {"type": "decimal"}))
