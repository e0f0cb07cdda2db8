"""The public API of dstk.validate: what other parts of dstk call (``dstk generate`` validates every
config it writes with ``validate_config``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dstk.validate import validate_config, validate_file


def codes(findings):
    return sorted((f.code, f.pointer) for f in findings if f.severity == "error")


def test_a_good_config_has_no_findings():
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "train_batch_size": 64,
              "zero_optimization": {"stage": 2, "overlap_comm": True},
              "bf16": {"enabled": True},
              "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.1, "torch_adam": True}}}
    assert validate_config(config, world_size=8) == []


def test_triad_against_the_data_parallel_size_prints_the_arithmetic():
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "train_batch_size": 64}
    # dp = 8 / 2 = 4: 4 x 2 x 4 = 32 != 64
    (f,) = validate_config(config, world_size=8, tensor_parallel=2)
    assert f.code == "DS201" and f.pointer == "/train_batch_size"
    assert "= 32" in f.message and "train_batch_size 32" in f.hint and "gradient_accumulation_steps 4" in f.hint


def test_top_level_typo_is_an_error_with_did_you_mean():
    (f,) = [f for f in validate_config({"train_micro_batch_size_per_gpu": 1, "zero_optimisation": {"stage": 3}})]
    assert (f.code, f.pointer) == ("DS101", "/zero_optimisation")
    assert "zero_optimization" in f.hint


def test_auto_is_an_error_in_plain_mode_and_fine_where_hf_fills_it():
    config = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
              "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto"}}}
    assert {f.code for f in validate_config(config)} == {"DS107"}
    assert validate_config(config, hf=True) == []


def test_file_findings_carry_line_and_column(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text('{\n  "train_micro_batch_size_per_gpu": 1,\n  "zero_optimization": {\n    "stage": 2,\n'
                    '    "overlap_com": true\n  }\n}\n')
    (f,) = validate_file(path)
    assert (f.code, f.pointer, f.line, f.column) == ("DS101", "/zero_optimization/overlap_com", 5, 5)


def test_bad_arguments_are_programmer_errors():
    with pytest.raises(ValueError, match="tensor_parallel"):
        validate_config({}, tensor_parallel=0)


def test_the_fast_path_imports_nothing_heavy():
    code = ("import sys; from dstk.validate import validate_config; "
            "validate_config({'train_micro_batch_size_per_gpu': 1, 'optimizer': {'type': 'SGD', 'params': {'lr': 1}}}); "
            "import dstk.commands.validate, dstk.commands.schema; "
            "print(','.join(m for m in ('torch', 'deepspeed', 'transformers', 'datasets') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
