"""The corpora: valid configs in the styles users ship, and one invalid file per mistake.

Expectations are data (``tests/data/validate/*-cases.json``); every file the recursive glob finds must
have an entry and every entry a file, so no case is silently skipped. DeepSpeed's own parser
(``DeepSpeedConfig`` at the case's data-parallel size, in one child process) is the oracle for the
``deepspeed`` column: "rejects" cases are ones DeepSpeed refuses at parse time, "accepts" cases are
traps it lets through.
"""

from __future__ import annotations

import copy
import json
import pathlib
import random

import pytest

from dstk.validate import read_document, validate_config, validate_document
from dstk.validate.deepspeed_check import parse_many

ROOT = pathlib.Path(__file__).parent / "data" / "validate"
VALID = json.loads((ROOT / "valid-cases.json").read_text())
INVALID = json.loads((ROOT / "invalid-cases.json").read_text())
OPTIONS = ("world_size", "tensor_parallel", "pipeline_stages", "hf")


def _options(entry: dict) -> dict:
    return {k: entry[k] for k in OPTIONS if k in entry}


def _dp(entry: dict) -> int:
    # AutoTP configs (autotp_size in the file, no --tensor-parallel) are parsed at the total rank count, as
    # deepspeed.initialize does (it passes no mpu); HF-filled ones at 1, the world size of HF's filler here.
    if entry.get("hf") or not entry.get("world_size"):
        return 1
    return entry["world_size"] // (entry.get("tensor_parallel", 1) * entry.get("pipeline_stages", 1))


def test_every_file_has_an_expectation_and_every_expectation_a_file():
    valid = sorted(p.name for p in (ROOT / "valid").rglob("*") if p.is_file())
    invalid = sorted(p.stem for p in (ROOT / "invalid").rglob("*") if p.is_file())
    assert valid == sorted(VALID)
    assert invalid == sorted(INVALID)
    assert len(valid) >= 10 and len(invalid) >= 40
    traps = [n for n, e in INVALID.items() if e["deepspeed"] == "accepts" and e.get("severity", "error") == "error"]
    assert len(traps) >= 25


@pytest.mark.parametrize("name", sorted(VALID))
def test_valid_config_has_no_errors(name):
    findings = validate_document(read_document(ROOT / "valid" / name), **_options(VALID[name]))
    assert [f for f in findings if f.severity == "error"] == []


@pytest.mark.parametrize("name", sorted(INVALID))
def test_invalid_config_gives_its_finding(name):
    entry = INVALID[name]
    findings = validate_document(read_document(ROOT / "invalid" / f"{name}.json"), **_options(entry))
    hits = [f for f in findings if (f.code, f.pointer) == (entry["code"], entry["pointer"])]
    assert hits, f"expected {entry['code']} at {entry['pointer']!r}, got {[(f.code, f.pointer) for f in findings]}"
    assert hits[0].severity == entry.get("severity", "error")
    assert hits[0].line is not None and hits[0].hint
    if "line" in entry:
        assert hits[0].line == entry["line"]


@pytest.fixture(scope="module")
def deepspeed_verdicts():
    jobs, keys = [], []
    for name, entry in VALID.items():
        doc = read_document(ROOT / "valid" / name)
        jobs.append({"config": doc.config, "dp": _dp(entry), "fill": bool(entry.get("hf"))})
        keys.append(("valid", name))
    for name, entry in INVALID.items():
        path = ROOT / "invalid" / f"{name}.json"
        config = str(path) if entry["code"] == "DS007" else read_document(path).config
        jobs.append({"config": config, "dp": _dp(entry), "fill": False})
        keys.append(("invalid", name))
    for i, config in enumerate(MUTANTS):
        jobs.append({"config": config, "dp": 1, "fill": False})
        keys.append(("mutant", i))
    return dict(zip(keys, parse_many(jobs)))


def _mutants(count: int, seed: int = 0) -> list[dict]:
    """Seeded random mutations of the plain valid configs: a value replaced by one of the wrong kind, a key
    renamed or dropped, a number negated."""
    rng = random.Random(seed)
    values = [-1, 0, 0.5, 3, 1e9, "x", "true", True, False, None, [], {}, "cpu", "nvme", 2.5]
    bases = [read_document(ROOT / "valid" / n).config for n, e in sorted(VALID.items()) if not e.get("hf")]

    def paths(node, prefix=()):
        if isinstance(node, dict):
            for key, value in node.items():
                yield prefix + (key,)
                yield from paths(value, prefix + (key,))

    out = []
    for _ in range(count):
        config = copy.deepcopy(rng.choice(bases))
        path = rng.choice(list(paths(config)))
        parent = config
        for key in path[:-1]:
            parent = parent[key]
        op, key = rng.random(), path[-1]
        if op < 0.4:
            parent[key] = rng.choice(values)
        elif op < 0.6:
            parent[key[:-1] + "x"] = parent.pop(key)
        elif op < 0.8:
            parent.pop(key)
        elif isinstance(parent[key], (int, float)) and not isinstance(parent[key], bool):
            parent[key] = -parent[key] - 1
        else:
            parent[key] = rng.choice(values)
        out.append(config)
    return out


MUTANTS = _mutants(150)


def test_deepspeed_accepts_every_valid_config(deepspeed_verdicts):
    rejected = {n: v.error for (kind, n), v in deepspeed_verdicts.items() if kind == "valid" and not v.accepted}
    assert rejected == {}


def test_deepspeed_verdict_on_invalid_cases_is_as_recorded(deepspeed_verdicts):
    wrong = {n: (INVALID[n]["deepspeed"], v.error) for (kind, n), v in deepspeed_verdicts.items()
             if kind == "invalid" and v.accepted != (INVALID[n]["deepspeed"] == "accepts")}
    assert wrong == {}


def test_whatever_deepspeed_rejects_dstk_rejects_too(deepspeed_verdicts):
    rejected = [i for (kind, i), v in deepspeed_verdicts.items() if kind == "mutant" and not v.accepted]
    assert len(rejected) >= 30  # the mutations do hit DeepSpeed's own checks
    missed = [(deepspeed_verdicts[("mutant", i)].error, MUTANTS[i]) for i in rejected
              if not any(f.severity == "error" for f in validate_config(MUTANTS[i], world_size=1))]
    assert missed == []
