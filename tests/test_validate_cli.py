"""``dstk validate`` and ``dstk schema`` end to end: exit codes, formats, bad input."""

from __future__ import annotations

import json

import pytest

from dstk.cli import main

GOOD = '{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1}\n'


@pytest.fixture
def files(tmp_path):
    def write(name, content):
        path = tmp_path / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        return str(path)
    return write


@pytest.mark.parametrize("content, code", [
    ("", "DS002"),
    ("  \n\t\n", "DS002"),
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "DS004"),
    (b"\xff\xfe{\x00}", "DS004"),
    ("[1, 2, 3]", "DS003"),
    ('"just a string"', "DS003"),
    ("[" * 500 + "]" * 500, "DS006"),
    ('{"a": ' * 100 + "1" + "}" * 100, "DS006"),
    ('{"train_batch_size": 8,,, }', "DS001"),
    ('{"train_batch_size": }', "DS001"),
])
def test_bad_input_is_one_clear_finding_and_exit_1(files, capsys, content, code):
    path = files("bad.json", content)
    assert main(["validate", path, "--format", "json"]) == 1
    out = json.loads(capsys.readouterr().out)
    (entry,) = out["files"]
    assert entry["valid"] is False
    assert [f["code"] for f in entry["findings"]] == [code]
    assert entry["findings"][0]["hint"]


def test_huge_file_is_refused_without_reading_it_all(files, capsys):
    path = files("huge.json", '{"train_batch_size": 8, "x": "' + "a" * (9 * 1024 * 1024) + '"}')
    assert main(["validate", path]) == 1
    assert "DS005" in capsys.readouterr().out


def test_all_findings_of_all_files_are_reported(files, capsys):
    a = files("a.json", '{"zero_optimisation": {}, "train_micro_batch_size_per_gpu": 1, "fp16": {"enabld": true}}')
    b = files("b.json", GOOD)
    c = files("c.json", "")
    assert main(["validate", a, b, c, "--format", "json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert [f["valid"] for f in out["files"]] == [False, True, False]
    assert {f["pointer"] for f in out["files"][0]["findings"]} == {"/zero_optimisation", "/fp16/enabld"}
    assert set(out["files"][0]["findings"][0]) == {"severity", "code", "pointer", "line", "column", "message", "hint"}


def test_valid_file_exits_0_and_warnings_fail_only_under_strict(files, capsys):
    path = files("ds.hjson", '{\n  // hjson comment\n  "train_micro_batch_size_per_gpu": 2,\n}\n')
    assert main(["validate", path]) == 0
    assert "DS008" in capsys.readouterr().out
    assert main(["validate", path, "--strict"]) == 1


def test_world_size_flags_reach_the_triad(files, capsys):
    path = files("ds.json", '{"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4}')
    assert main(["validate", path, "--world-size", "8"]) == 0
    assert main(["validate", path, "--world-size", "8", "--tensor-parallel", "2", "--pipeline-stages", "2"]) == 0
    assert main(["validate", path, "--world-size", "12"]) == 1
    assert "use train_batch_size 48" in capsys.readouterr().out


def test_github_format_annotates_file_line_and_column(files, capsys):
    path = files("ds.json", '{\n  "train_micro_batch_size_per_gpu": 1,\n  "zero_optimization": {"stage": 5}\n}\n')
    assert main(["validate", path, "--format", "github"]) == 1
    line = capsys.readouterr().out.strip()
    assert line.startswith("::error file=") and ",line=3,col=25," in line and "title=DS103" in line


def test_hf_flag_accepts_auto(files):
    path = files("ds.json", '{"train_micro_batch_size_per_gpu": "auto", "gradient_clipping": "auto"}')
    assert main(["validate", path]) == 1
    assert main(["validate", path, "--hf"]) == 0


@pytest.mark.parametrize("argv", [["validate"], ["validate", "x.json", "--world-size", "0"],
                                  ["validate", "x.json", "--format", "xml"]])
def test_usage_errors_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2


def test_unreadable_path_exits_2_even_next_to_valid_files(files, tmp_path, capsys):
    good = files("ok.json", GOOD)
    assert main(["validate", str(tmp_path / "missing.json")]) == 2
    assert main(["validate", good, str(tmp_path / "missing.json")]) == 2
    assert main(["validate", str(tmp_path)]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_schema_command_prints_the_schema_and_parts_of_it(capsys):
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["$schema"].endswith("2020-12/schema") and schema["additionalProperties"] is False
    assert main(["schema", "--pointer", "/properties/zero_optimization/properties/stage"]) == 0
    assert json.loads(capsys.readouterr().out)["enum"] == [0, 1, 2, 3]
    assert main(["schema", "--pointer", "/properties/nope"]) == 2
    assert main(["schema", "--hf-auto", "--format", "text"]) == 0
    assert "per_device_train_batch_size" in capsys.readouterr().out


def test_deepspeed_flag_reports_deepspeeds_own_verdict(files, capsys):
    """DeepSpeed accepts the top-level typo (a trap) and rejects the bad triad at dp 4."""
    typo = files("typo.json", '{"train_micro_batch_size_per_gpu": 2, "zero_optimisation": {"stage": 3}}')
    triad = files("triad.json", '{"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4, '
                                '"gradient_accumulation_steps": 2}')
    assert main(["validate", typo, triad, "--deepspeed", "--world-size", "4", "--format", "json"]) == 1
    out = json.loads(capsys.readouterr().out)
    verdicts = [f["deepspeed"] for f in out["files"]]
    assert verdicts[0] == {"accepted": True, "error": None}
    assert verdicts[1]["accepted"] is False and "64 != 4 * 2 * 4" in verdicts[1]["error"]


def test_docs_list_every_finding_code_and_the_hooks_call_dstk():
    import pathlib
    import re

    import yaml

    root = pathlib.Path(__file__).resolve().parent.parent
    source = "".join(p.read_text() for p in (root / "toolkit" / "validate").glob("*.py"))
    source += (root / "toolkit" / "commands" / "validate.py").read_text()  # DS301, DeepSpeed's own rejection
    used = set(re.findall(r'"(DS\d{3})"', source))
    documented = set(re.findall(r"^\| (DS\d{3}) \|", (root / "docs" / "validate.md").read_text(), re.M))
    assert used and used == documented
    hooks = yaml.safe_load((root / ".pre-commit-hooks.yaml").read_text())
    assert {h["id"] for h in hooks} == {"dstk-validate", "dstk-validate-hf"}
    assert all(h["entry"].startswith("dstk validate") for h in hooks)
    workflow = yaml.safe_load((root / "examples" / "github-workflow.yml").read_text())
    steps = [s.get("run", "") for s in workflow["jobs"]["validate"]["steps"]]
    assert any("dstk validate" in s and "--format github" in s for s in steps)
    yaml.safe_load((root / "examples" / "pre-commit-config.yaml").read_text())
