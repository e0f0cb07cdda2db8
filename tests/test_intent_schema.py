"""``dstk schema --intent``: the intent YAML's JSON Schema, checked with jsonschema (the oracle) against
every intent the project ships, and against dstk's own loader on values it must accept or refuse."""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path

import jsonschema
import pytest
import yaml

from dstk.cli import main
from dstk.commands.schema import intent_schema
from dstk.errors import DstkError
from dstk.intent import ENGINES, SCHEDULES, SECTIONS, intent_from_dict
from dstk.layout import ATTENTIONS, OFFLOADS, OPTIMIZERS, PRECISIONS, RECOMPUTES

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = [*sorted((ROOT / "examples" / "intents").glob("*.yaml")),
           *sorted((ROOT / "tests" / "data" / "plan").glob("*.yaml"))]
CHOICES = sorted({*ENGINES, *SCHEDULES, *ATTENTIONS, *OFFLOADS, *OPTIMIZERS, *PRECISIONS, *RECOMPUTES})
"""Every word the loader's choice checks know, tried on every field."""
TINY = {"model": {"name": "tiny-llama"}, "cluster": {"num_nodes": 1, "gpus_per_node": 2, "gpu": "cpu"}}


@pytest.fixture(scope="module")
def validator():
    schema = intent_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _intent_of(path: Path) -> dict:
    data = yaml.safe_load(path.read_text())
    return data["intent"] if "expect" in data else data  # tests/data/plan wraps the intent with expectations


def _loads(data: dict) -> bool:
    try:
        intent_from_dict(data)
    except DstkError:
        return False
    return True


def test_cli_prints_the_schema_and_a_pointer(capsys):
    assert main(["schema", "--intent"]) == 0
    assert json.loads(capsys.readouterr().out) == intent_schema()
    assert main(["schema", "--intent", "--pointer", "/properties/constraints/properties/recompute"]) == 0
    node = json.loads(capsys.readouterr().out)
    assert node["enum"] == ["none", "selective", "full", None] and "recomputation" in node["description"]
    assert main(["schema", "--intent", "--pointer", "/properties/nope"]) == 2


def test_the_shipped_intents_are_all_found():
    assert len(SHIPPED) >= 14  # 4 examples + 10 golden cases when written: a broken glob would test none


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_intent_is_valid(validator, path):
    data = _intent_of(path)
    assert _loads(data)  # dstk loads it, so the schema must accept it
    assert [e.message for e in validator.iter_errors(data)] == []


@pytest.mark.parametrize("data", [
    {**TINY, "training": {"seq_lenn": 64}},              # misspelt field
    {**TINY, "trainng": {"seq_len": 64}},                 # misspelt section
    {"cluster": TINY["cluster"]},                         # no model
    {"model": {"name": "tiny-llama", "num_layers": 2}},   # a name and dimensions
    {"model": {"num_layers": 2, "hidden_size": 64}},      # half the dimensions
    {**TINY, "training": {"precision": "bf32"}},
    {**TINY, "training": {"seq_len": 0}},
    {**TINY, "training": {"betas": [0.9]}},
    {**TINY, "constraints": {"zero_stage": 4}},
    {**TINY, "constraints": {"offload": "yes"}},
    {**TINY, "constraints": {"memory_headroom": 0.95}},
])
def test_what_dstk_refuses_the_schema_refuses(validator, data):
    assert not _loads(data)
    assert list(validator.iter_errors(data))


def _probes(section: str, name: str, hint) -> list:
    """Values on both sides of each check a field can have: each choice, text, 0, -1, a fraction, 1."""
    base = [o for o in typing.get_args(hint) if o is not type(None)] or [hint]
    if typing.get_origin(base[0]) is tuple:
        return [[0.9, 0.95], [0.9, 1.0], [-0.1, 0.5], [0.9]]
    return ["zzz", 0, -1, 0.5, 0.95, 1, 2, 3, 4, True, "3e-4", None, *CHOICES]


def _context(section: str, field: str) -> dict:
    """An intent where no cross-field check can refuse the probe values (12 GPUs and 24 sequences divide
    by 1-4; megatron for virtual stages), so a verdict is about the field alone."""
    data = {"model": {"name": "tiny-llama"}, "cluster": {"num_nodes": 1, "gpus_per_node": 12, "gpu": "h100-sxm"},
            "training": {"global_batch": 24}, "constraints": {"nvme_path": "/nvme"}}
    if field in ("global_batch", "global_batch_tokens"):
        data["training"] = {"seq_len": 1}
    if field == "virtual_stages":
        data["constraints"]["engine"] = "megatron"
    if field == "engine":
        data["constraints"].pop("nvme_path")
    if field.startswith("lora_") and field != "lora_rank":  # the other LoRA fields need a rank
        data["training"]["lora_rank"] = 8
    return data


@pytest.mark.parametrize("section, field", [(s, f.name) for s, cls in SECTIONS.items()
                                            for f in dataclasses.fields(cls) if s != "model"])
def test_schema_and_loader_agree_field_by_field(validator, section, field):
    """The schema is derived from the dataclasses; the checks live in their ``__post_init__``. On every
    probe value the two give the same verdict, so a new choice or range in one shows up here. The one
    allowed difference: text that reads as a number (YAML 1.1's ``3e-4``) passes the schema's pattern
    even where the loader then finds it is no integer."""
    hint = typing.get_type_hints(SECTIONS[section])[field]
    disagree = []
    for value in _probes(section, field, hint):
        data = _context(section, field)
        data[section] = {**data[section], field: value}
        loads, schema_ok = _loads(data), not list(validator.iter_errors(data))
        if loads != schema_ok and not (schema_ok and value == "3e-4"):
            disagree.append((value, "dstk loads it" if loads else "dstk refuses it"))
    assert disagree == []
