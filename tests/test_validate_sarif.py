"""``--format sarif``: SARIF 2.1.0 for GitHub code scanning, and the codes table it takes its rules from.

The structure checked is what the SARIF 2.1.0 standard (OASIS, sections 3.13-3.30) requires and what
GitHub's upload documents ("SARIF support for code scanning"): version, one run with tool.driver.name and
rules, results with ruleId, level, message.text and a physicalLocation (artifactLocation.uri, region with
1-based startLine/startColumn).
"""

from __future__ import annotations

import json
import os
import pathlib
import re

from dstk.cli import main
from dstk.validate.codes import CODES

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_sarif_has_one_run_rules_from_the_codes_and_located_results(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "a.json").write_text('{\n  "_comment": "x",\n  "zero_optimisation": {"stage": 2},\n'
                                                 '  "train_micro_batch_size_per_gpu": 1\n}\n')
    (tmp_path / "configs" / "b.json").write_text('{"train_micro_batch_size_per_gpu": 1}')
    assert main(["validate", "configs/a.json", "configs/b.json", "--format", "sarif", "--no-project"]) == 1
    sarif = json.loads(capsys.readouterr().out)
    assert sarif["version"] == "2.1.0" and sarif["$schema"].endswith("sarif-2.1.0.json")
    (run,) = sarif["runs"]
    driver = run["tool"]["driver"]
    assert driver["name"] == "dstk" and driver["version"]
    rules = driver["rules"]
    assert [r["id"] for r in rules] == sorted(CODES)
    for rule in rules:
        severity, text = CODES[rule["id"]]
        assert rule["shortDescription"]["text"] == text
        assert rule["defaultConfiguration"]["level"] == ("warning" if severity == "warning" else "error")
    results = run["results"]
    assert [(r["ruleId"], r["level"]) for r in results] == [("DS111", "warning"), ("DS101", "error")]
    for r in results:
        assert rules[r["ruleIndex"]]["id"] == r["ruleId"]
        assert r["message"]["text"]
        (loc,) = r["locations"]
        assert loc["physicalLocation"]["artifactLocation"] == {"uri": "configs/a.json", "uriBaseId": "%SRCROOT%"}
    assert [r["locations"][0]["physicalLocation"]["region"] for r in results] == [
        {"startLine": 2, "startColumn": 3}, {"startLine": 3, "startColumn": 3}]
    assert results[1]["locations"][0]["logicalLocations"] == [{"fullyQualifiedName": "/zero_optimisation",
                                                              "kind": "member"}]


def test_sarif_absolute_paths_are_file_uris_and_clean_files_give_no_results(tmp_path, capsys):
    path = tmp_path / "ok.json"
    path.write_text('{"train_micro_batch_size_per_gpu": 1}')
    assert main(["validate", str(path), "--format", "sarif", "--no-project"]) == 0
    run = json.loads(capsys.readouterr().out)["runs"][0]
    assert run["results"] == []
    bad = tmp_path / "bad.json"
    bad.write_text("")
    assert main(["validate", str(bad), "--format", "sarif", "--no-project"]) == 1
    (result,) = json.loads(capsys.readouterr().out)["runs"][0]["results"]
    uri = result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
    assert uri.startswith("file:///") and uri.endswith("/bad.json") and os.path.isabs(str(bad))
    assert "region" not in result["locations"][0]["physicalLocation"]  # an empty file has no line


def test_codes_table_in_the_docs_is_the_one_in_the_code():
    rows = re.findall(r"^\| (DS\d{3}) \| ([a-z/]+) \| (.+) \|$", (ROOT / "docs" / "validate.md").read_text(), re.M)
    assert {code: (severity, text) for code, severity, text in rows} == CODES
    source = "".join(p.read_text() for p in (ROOT / "toolkit" / "validate").glob("*.py") if p.name != "codes.py")
    source += (ROOT / "toolkit" / "commands" / "validate.py").read_text()
    assert set(re.findall(r'"(DS\d{3})"', source)) == set(CODES)  # every code is raised somewhere
