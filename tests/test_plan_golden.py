"""Golden cases as data: tests/data/plan/*.yaml, one file per case (intent in; expected layout
and key config values out). The count is asserted, so a lost file or a non-recursive glob shows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from dstk import plan as planner
from dstk.intent import intent_from_dict
from dstk.render import read_megatron_args

CASES_DIR = Path(__file__).resolve().parent / "data" / "plan"
CASES = sorted(CASES_DIR.rglob("*.yaml"))
EXPECTED_COUNT = 10


def test_all_cases_are_found():
    assert len(CASES) == EXPECTED_COUNT, [c.name for c in CASES]


def _pointer(doc, pointer: str):
    node = doc
    for part in pointer.lstrip("/").split("/"):
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_golden_case(path):
    case = yaml.safe_load(path.read_text())
    expect = case["expect"]
    intent = intent_from_dict(case["intent"], source=path.name)
    ctx = planner.resolve(intent)
    result = planner.plan_intent(ctx)
    if not expect.get("fits", True):
        assert not result.plans, f"expected nothing to fit, got {planner.describe(result.plans[0].layout)}"
        fixes = planner.suggest_fixes(intent)
        for needle in expect.get("suggestions_mention", []):
            assert any(needle in f for f in fixes), (needle, fixes)
        return
    assert result.plans, planner.nothing_fits_message(ctx, result)
    layout = result.plans[0].layout.to_dict()
    for key, value in expect.get("layout", {}).items():
        assert layout[key] == value, f"{key}: {layout[key]} != {value} in {planner.describe(result.plans[0].layout)}"
    for key, allowed in expect.get("layout_in", {}).items():
        assert layout[key] in allowed, (key, layout[key], allowed)
    for needle in expect.get("why_mentions", []):
        assert any(needle in line for line in result.plans[0].why), (needle, result.plans[0].why)
    files = planner.run_dir_files(ctx, result)
    ds = json.loads(files["ds_config.json"])
    for pointer, value in expect.get("ds_config", {}).items():
        assert _pointer(ds, pointer) == value, pointer
    for pointer in expect.get("ds_config_absent", []):
        with pytest.raises((KeyError, IndexError)):
            _pointer(ds, pointer)
    args = read_megatron_args(files["megatron.args"])
    for option, value in expect.get("megatron", {}).items():
        assert option in args, option
        if value is not None:
            assert args[args.index(option) + 1] == str(value), option
