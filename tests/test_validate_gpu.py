"""``dstk validate --gpu SLUG`` and ``[tool.dstk] gpu``: precision the GPU lacks (DS250)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dstk.cli import main
from dstk.validate.gpu import gpu_findings, resolve_gpu

BF16 = {"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True}, "zero_optimization": {"stage": 2}}
FP16 = {"train_micro_batch_size_per_gpu": 2, "fp16": {"enabled": True}, "zero_optimization": {"stage": 2}}


def _file(tmp_path, config, name="ds.json"):
    path = tmp_path / name
    path.write_text(json.dumps(config, indent=1))
    return str(path)


def _validate(argv, capsys):
    code = main(["validate", "--format", "json", *argv])
    out = capsys.readouterr().out
    return code, (json.loads(out)["files"] if out.strip() else [])


def test_bf16_on_a_v100_is_an_error_with_the_fp16_fix(tmp_path, capsys):
    code, (entry,) = _validate([_file(tmp_path, BF16), "--gpu", "v100", "--no-project"], capsys)
    assert code == 1 and not entry["valid"]
    (finding,) = entry["findings"]
    assert finding["code"] == "DS250" and finding["severity"] == "error" and finding["pointer"] == "/bf16/enabled"
    assert finding["line"] == 4  # json.dumps(indent=1): "enabled" of "bf16" is on the fourth line
    assert '"fp16": {"enabled": true}' in finding["hint"] and "V100" in finding["message"]


@pytest.mark.parametrize("slug", ["a100-80gb", "h100-sxm", "h200", "cpu"])
def test_bf16_where_the_gpu_has_it_is_fine(tmp_path, capsys, slug):
    code, (entry,) = _validate([_file(tmp_path, BF16), "--gpu", slug, "--no-project"], capsys)
    assert code == 0 and entry["findings"] == []


def test_fp16_on_a_v100_is_fine_and_without_gpu_nothing_is_said(tmp_path, capsys):
    assert _validate([_file(tmp_path, FP16), "--gpu", "v100-32gb", "--no-project"], capsys)[0] == 0
    code, (entry,) = _validate([_file(tmp_path, BF16), "--no-project"], capsys)
    assert code == 0 and entry["findings"] == []


def test_legacy_bfloat16_and_torch_autocast_default_dtype_count_as_bf16():
    v100 = resolve_gpu("v100")
    legacy = gpu_findings({"bfloat16": {"enabled": True}}, gpu=v100)
    assert [f.pointer for f in legacy] == ["/bfloat16/enabled"]
    autocast = gpu_findings({"torch_autocast": {"enabled": True}}, gpu=v100)
    assert [(f.code, f.pointer) for f in autocast] == [("DS250", "/torch_autocast/dtype")]
    assert gpu_findings({"torch_autocast": {"enabled": True, "dtype": "torch.float16"}}, gpu=v100) == []
    assert gpu_findings({"bf16": {"enabled": False}}, gpu=v100) == []


def test_auto_counts_when_the_training_args_turn_bf16_on(tmp_path, capsys):
    path = _file(tmp_path, {"train_micro_batch_size_per_gpu": "auto", "bf16": {"enabled": "auto"}})
    assert _validate([path, "--hf", "--gpu", "v100", "--no-project"], capsys)[0] == 0  # unknown: the Trainer decides
    args = tmp_path / "training_args.json"
    args.write_text(json.dumps({"bf16": True}))
    code, (entry,) = _validate([path, "--hf", "--gpu", "v100", "--no-project", "--training-args", str(args)], capsys)
    assert code == 1 and [f["code"] for f in entry["findings"]] == ["DS250"]
    assert "training arguments" in entry["findings"][0]["hint"]


def test_fp16_on_cpu_ranks_is_a_warning(tmp_path, capsys):
    code, (entry,) = _validate([_file(tmp_path, FP16), "--gpu", "cpu", "--no-project"], capsys)
    assert code == 0 and [(f["code"], f["severity"]) for f in entry["findings"]] == [("DS250", "warning")]
    assert _validate([_file(tmp_path, FP16), "--gpu", "cpu", "--no-project", "--strict"], capsys)[0] == 1


def test_the_project_table_gives_the_gpu_and_the_flag_wins(tmp_path, capsys):
    (tmp_path / "pyproject.toml").write_text('[tool.dstk]\ngpu = "v100-32gb"\n\n[[tool.dstk.overrides]]\n'
                                             'files = ["new/*.json"]\ngpu = "a100-80gb"\n')
    old = _file(tmp_path, BF16, "old.json")
    (tmp_path / "new").mkdir()
    new = _file(tmp_path / "new", BF16, "ds.json")
    code, entries = _validate([old, new], capsys)
    assert code == 1
    verdicts = {e["path"]: [f["code"] for f in e["findings"]] for e in entries}
    assert verdicts == {old: ["DS250"], new: []}
    assert _validate([old, "--gpu", "a100-80gb"], capsys)[0] == 0


@pytest.mark.parametrize("slug, words", [("h100", ["h100-sxm", "h100-pcie"]), ("t4", ["v100-32gb", "dstk gpus"])])
def test_an_unknown_or_ambiguous_slug_is_a_usage_error_that_lists_the_choices(tmp_path, capsys, slug, words):
    assert main(["validate", _file(tmp_path, BF16), "--gpu", slug, "--no-project"]) == 2
    err = capsys.readouterr().err
    assert f"--gpu {slug}" in err and all(w in err for w in words)


def test_a_bad_gpu_in_the_project_table_names_the_file(tmp_path, capsys):
    (tmp_path / "pyproject.toml").write_text('[tool.dstk]\ngpu = "v1000"\n')
    assert main(["validate", _file(tmp_path, BF16)]) == 2
    assert "pyproject.toml [tool.dstk] gpu" in capsys.readouterr().err


def test_validate_with_gpu_stays_light(tmp_path):
    code = ("import sys; from dstk.cli import main; rc = main(['validate', sys.argv[1], '--gpu', 'v100', "
            "'--no-project']); heavy = [m for m in ('torch', 'deepspeed', 'transformers') if m in sys.modules]; "
            "print(rc, heavy)")
    proc = subprocess.run([sys.executable, "-c", code, _file(tmp_path, BF16)], capture_output=True, text=True,
                          timeout=120)
    assert proc.stdout.strip().splitlines()[-1] == "1 []", proc.stderr
