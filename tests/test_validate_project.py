"""Suppressions and project settings: ``--ignore`` and ``[tool.dstk]`` in the nearest pyproject.toml."""

from __future__ import annotations

import json
import textwrap

import pytest

from dstk.cli import main

TRIAD = '{"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}'
COMMENTED = '{"_comment": "ZeRO-2", "train_micro_batch_size_per_gpu": 1, "gradient_clipping": "auto"}'


@pytest.fixture
def tree(tmp_path):
    def write(rel, content):
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(content))
        return str(path)
    return write


def _json(capsys) -> list[dict]:
    return json.loads(capsys.readouterr().out)["files"]


def test_ignore_flag_drops_codes_and_counts_them(tree, capsys):
    path = tree("ds_config.json", COMMENTED)
    assert main(["validate", path, "--format", "json", "--strict"]) == 1
    assert {f["code"] for f in _json(capsys)[0]["findings"]} == {"DS111", "DS107"}
    assert main(["validate", path, "--format", "json", "--strict", "--ignore", "DS111,ds107"]) == 0
    (entry,) = _json(capsys)
    assert entry["findings"] == [] and entry["ignored"] == 2
    assert main(["validate", path, "--ignore", "DS111", "--ignore", "DS107", "--strict"]) == 0
    assert "2 ignored" in capsys.readouterr().out


@pytest.mark.parametrize("bad", ["DS1", "E501", "DS999"])
def test_ignore_flag_rejects_what_is_not_a_code(tree, capsys, bad):
    path = tree("ds_config.json", COMMENTED)
    assert main(["validate", path, "--ignore", bad]) == 2
    assert "fix:" in capsys.readouterr().err


def test_pyproject_settings_apply_to_files_below_it(tree, capsys):
    tree("pyproject.toml", """
        [project]
        name = "trainer"

        [tool.dstk]
        ignore = ["DS111"]
        world_size = 4
        deepspeed_version = "0.19.8"
    """)
    commented = tree("configs/a.json", COMMENTED.replace('"auto"', "1.0"))
    triad = tree("configs/deep/b.json", TRIAD)
    assert main(["validate", commented, triad, "--format", "json", "--strict"]) == 1
    a, b = _json(capsys)
    assert a["valid"] and a["ignored"] == 1 and a["project"].endswith("pyproject.toml")
    assert [f["code"] for f in b["findings"]] == ["DS201"]  # checked at world size 4 (64 != 4 x 2 x 4)
    # flags win over the table
    assert main(["validate", triad, "--world-size", "8", "--format", "json"]) == 0
    assert main(["validate", triad, "--no-project", "--format", "json"]) == 0


def test_nearest_pyproject_with_a_dstk_table_wins_and_overrides_match_globs(tree, capsys):
    tree("pyproject.toml", """
        [tool.dstk]
        world_size = 4

        [[tool.dstk.overrides]]
        files = ["hf/*.json"]
        hf = true
        ignore = ["DS111"]
    """)
    tree("sub/pyproject.toml", '[project]\nname = "no dstk table here"\n')
    hf = tree("hf/ds_z2.json", COMMENTED)
    plain = tree("sub/ds.json", COMMENTED)
    assert main(["validate", hf, plain, "--format", "json"]) == 1
    hf_entry, plain_entry = _json(capsys)
    assert hf_entry["valid"] and hf_entry["findings"] == [] and hf_entry["ignored"] == 1
    assert main(["validate", hf, "--no-hf", "--format", "json"]) == 1  # the flag wins over the override
    assert [f["code"] for f in _json(capsys)[0]["findings"]] == ["DS107"]
    assert {f["code"] for f in plain_entry["findings"]} == {"DS111", "DS107"}  # the override is for hf/ only


def test_another_deepspeed_version_is_a_clear_warning(tree, capsys):
    tree("pyproject.toml", '[tool.dstk]\ndeepspeed_version = "0.12.4"\n')  # older than any shipped schema
    path = tree("ds.json", '{"train_micro_batch_size_per_gpu": 1}')
    assert main(["validate", path]) == 0
    out = capsys.readouterr().out
    assert "DS010" in out and "0.12.4" in out and "nearest, 0.14 (0.14.5)" in out
    assert main(["validate", path, "--strict"]) == 1


@pytest.mark.parametrize("table, needle", [
    ('[tool.dstk]\nworld_sise = 8\n', "did you mean 'world_size'"),
    ('[tool.dstk]\nworld_size = "8"\n', "positive integer"),
    ('[tool.dstk]\nignore = "DS111"\n', "must be a list"),
    ('[tool.dstk]\nignore = ["DS11"]\n', "not a finding code"),
    ('[[tool.dstk.overrides]]\nhf = true\n', "files"),
    ('[tool.dstk\n', "not valid TOML"),
])
def test_bad_project_settings_are_usage_errors(tree, capsys, table, needle):
    tree("pyproject.toml", table)
    path = tree("ds.json", '{"train_micro_batch_size_per_gpu": 1}')
    assert main(["validate", path]) == 2
    err = capsys.readouterr().err
    assert needle in err and "fix:" in err and "Traceback" not in err
