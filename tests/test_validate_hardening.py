"""``dstk validate`` on what fuzzing and real repositories threw at it: comment keys, keys in the wrong
place, non-finite numbers, huge literals, unterminated comments, FIFOs, ZenFlow and autocast values.
DeepSpeed's own verdict on the same inputs is in tests/test_validate_oracle.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from dstk.cli import main
from dstk.validate import parse_text, validate_config, validate_document

BASE = {"train_micro_batch_size_per_gpu": 1}


def _codes(findings):
    return [(f.code, f.pointer, f.severity) for f in findings]


def _run(tmp_path, capsys, text: str, *argv) -> tuple[int, dict]:
    path = tmp_path / "ds_config.json"
    path.write_text(text)
    code = main(["validate", str(path), "--format", "json", "--no-project", *argv])
    return code, json.loads(capsys.readouterr().out)["files"][0]


# ---------------------------------------------------------------------------- 1. comment keys and $schema


def test_llamafactory_autotp_config_passes_with_one_comment_warning(tmp_path, capsys):
    """LLaMA-Factory's examples/deepspeed/ds_z2_autotp_config.json (its shape): it failed only for `_comment`."""
    text = json.dumps({
        "_comment": "suitable model: ...; AutoTP with ZeRO-2",
        "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto", "zero_allow_untested_optimizer": True,
        "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
                 "hysteresis": 2, "min_loss_scale": 1},
        "bf16": {"enabled": "auto"},
        "zero_optimization": {"stage": 2, "allgather_partitions": True, "allgather_bucket_size": 5e8,
                              "overlap_comm": False, "reduce_scatter": True, "reduce_bucket_size": 5e8,
                              "contiguous_gradients": True, "round_robin_gradients": True},
        "tensor_parallel": {"autotp_size": 2},
    }, indent=2)
    code, entry = _run(tmp_path, capsys, text, "--hf")
    assert code == 0, entry
    assert [(f["code"], f["pointer"], f["severity"]) for f in entry["findings"]] == [("DS111", "/_comment", "warning")]
    assert "comet" not in entry["findings"][0]["hint"]
    code, entry = _run(tmp_path, capsys, text, "--hf", "--strict")
    assert code == 1


@pytest.mark.parametrize("pointer_parts, severity", [
    ((), "warning"),                               # top level: DeepSpeed ignores unknown keys
    (("optimizer",), "warning"),                   # read with dict.get
    (("activation_checkpointing",), "warning"),
    (("zero_optimization",), "error"),             # pydantic, extra="forbid"
    (("zero_optimization", "offload_optimizer"), "error"),
    (("bf16",), "error"),
    (("optimizer", "params"), "error"),            # a constructor keyword argument
])
def test_comment_key_is_a_warning_where_deepspeed_ignores_it_and_an_error_where_it_rejects_it(pointer_parts, severity):
    config = {**BASE, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 2}}
    node = config
    for part in pointer_parts:
        node = node.setdefault(part, {})
    node["_comment"] = "why this is here"
    pointer = "/" + "/".join((*pointer_parts, "_comment"))
    assert [(f.code, f.pointer, f.severity) for f in validate_config(config)] == [("DS111", pointer, severity)]


def test_schema_key_is_accepted_at_the_top_level_only():
    from jsonschema import Draft202012Validator

    from dstk.validate import load_schema

    assert validate_config({**BASE, "$schema": "https://example.org/ds.schema.json"}) == []
    # an editor checks the file against the published schema itself: "$schema" must pass there too
    Draft202012Validator(load_schema()).validate({**BASE, "$schema": "./deepspeed.schema.json"})
    assert _codes(validate_config({**BASE, "bf16": {"$schema": "x"}})) == [("DS101", "/bf16/$schema", "error")]


# ---------------------------------------------------------------------------- 2. where a key belongs


@pytest.mark.parametrize("config, pointer, needle", [
    ({"max_grad_norm": 1.0}, "/max_grad_norm", "'gradient_clipping' at the top level"),
    ({"log": {"steps_per_print": 10}}, "/log", "steps_per_print belongs at the top level"),
    ({"zero_optimization": {"stage": 1, "gradient_clipping": 1.0}}, "/zero_optimization/gradient_clipping",
     "belongs at the top level"),
    ({"overlap_comm": True}, "/overlap_comm", "belongs under /zero_optimization"),
    ({"learning_rate": 1e-4}, "/learning_rate", "'lr' under /optimizer/params"),
    ({"zero_optimisation": {"stage": 1}}, "/zero_optimisation", "did you mean 'zero_optimization'?"),
])
def test_hint_says_where_the_key_belongs(config, pointer, needle):
    (finding,) = [f for f in validate_config({**BASE, **config}) if f.pointer == pointer]
    assert finding.code == "DS101" and needle in finding.hint, finding.hint


def test_type_hint_uses_the_right_article():
    (finding,) = validate_config({"train_micro_batch_size_per_gpu": "two"})
    assert finding.hint == "write an integer"


# ---------------------------------------------------------------------------- 3. smaller


def test_auto_total_num_steps_is_reported_once_as_auto():
    config = {**BASE, "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": "auto"}}}
    assert _codes(validate_config(config)) == [("DS107", "/scheduler/params/total_num_steps", "error")]
    assert validate_config(config, hf=True) == []
    missing = {**BASE, "scheduler": {"type": "WarmupDecayLR", "params": {}}}
    assert _codes(validate_config(missing)) == [("DS110", "/scheduler/params/total_num_steps", "error")]


@pytest.mark.parametrize("betas, ok", [([0.9, 0.95], True), ([0.9], False), ([0.9, 0.95, 0.99], False)])
def test_betas_need_exactly_two_values(betas, ok):
    found = validate_config({**BASE, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": betas}}})
    assert (found == []) == ok
    if not ok:
        assert _codes(found) == [("DS104", "/optimizer/params/betas", "error")] and "[0.9, 0.999]" in found[0].hint


def test_tuple_defaults_with_none_accept_null_items():
    """torch.optim.Adafactor(eps=(None, 1e-3)): the first item may be null."""
    assert validate_config({**BASE, "optimizer": {"type": "Adafactor", "params": {"lr": 1e-2, "eps": [None, 1e-3]}}}) == []


# ---------------------------------------------------------------------------- 4. robustness


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e400", "-1e400"])
def test_non_finite_numbers_are_errors(tmp_path, capsys, literal):
    code, entry = _run(tmp_path, capsys, '{"train_micro_batch_size_per_gpu": 1,\n "gradient_clipping": %s}' % literal)
    assert code == 1
    assert [(f["code"], f["pointer"], f["line"]) for f in entry["findings"]] == [("DS009", "/gradient_clipping", 2)]


def test_non_finite_numbers_inside_lists_and_params_are_found():
    doc = parse_text('{"optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, NaN]}}}')
    assert ("DS009", "/optimizer/params/betas/1", "error") in _codes(doc.findings)


def test_a_5000_digit_integer_is_a_finding_with_its_position(tmp_path, capsys):
    code, entry = _run(tmp_path, capsys, '{"train_micro_batch_size_per_gpu": 1,\n "steps_per_print": ' + "7" * 5000 + "}")
    assert code == 1
    assert [(f["code"], f["line"], f["column"]) for f in entry["findings"]] == [("DS009", 2, 21)]


@pytest.mark.parametrize("text", ['{"train_micro_batch_size_per_gpu": 1 /* never closed',
                                  '{\n  "train_micro_batch_size_per_gpu": 1,\n  /* never\n  closed\n'])
def test_unterminated_block_comment_is_a_finding(tmp_path, capsys, text):
    code, entry = _run(tmp_path, capsys, text)
    assert code == 1
    (finding,) = entry["findings"]
    assert finding["code"] == "DS001" and "never closed" in finding["message"] and finding["line"] is not None


def test_fifo_and_device_paths_are_refused_without_blocking(tmp_path, capsys):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    code = subprocess.run([sys.executable, "-m", "dstk.cli", "validate", str(fifo), "--no-project"],
                          capture_output=True, text=True, timeout=60)
    assert code.returncode == 2 and "FIFO" in code.stderr and "Traceback" not in code.stderr
    assert main(["validate", os.devnull, "--no-project"]) == 2
    assert "device" in capsys.readouterr().err


@pytest.mark.parametrize("zenflow, pointer", [
    ({"select_strategy": "xx"}, "select_strategy"),
    ({"update_interval": 0}, "update_interval"),
    ({"update_interval": "often"}, "update_interval"),
    ({"select_interval": "often"}, "select_interval"),
    ({"select_strategy": "step", "select_interval": 3, "update_interval": "auto"}, None),
])
def test_zenflow_values_deepspeed_validates(zenflow, pointer):
    found = validate_config({**BASE, "zero_optimization": {"stage": 2, "zenflow": zenflow}})
    if pointer is None:
        assert found == []
    else:
        assert [f.pointer for f in found if f.severity == "error"] == [f"/zero_optimization/zenflow/{pointer}"]


@pytest.mark.parametrize("dtype, ok", [("bf16", True), ("torch.bfloat16", True), ("half", True), ("xx", False),
                                       ("BF16", False)])
def test_torch_autocast_dtype(dtype, ok):
    assert (validate_config({**BASE, "torch_autocast": {"enabled": True, "dtype": dtype}}) == []) == ok


def test_many_keys_use_bisection_for_positions_and_cap_did_you_mean():
    """Not a timing test (benchmarks/validate_large.py times it): the number of difflib comparisons is bounded
    per object, and positions of far-apart keys are right."""
    from dstk.validate import schema

    config = {**BASE, **{f"k{i:05d}": i for i in range(schema.MAX_GUESSES_PER_OBJECT + 50)}}
    text = json.dumps(config, indent=1)
    calls = []
    original = schema.did_you_mean
    schema.did_you_mean = lambda word, choices: calls.append(word) or original(word, choices)
    try:
        findings = validate_document(parse_text(text))
    finally:
        schema.did_you_mean = original
    assert len(calls) == schema.MAX_GUESSES_PER_OBJECT
    last = max(findings, key=lambda f: f.line)
    assert last.pointer == f"/k{schema.MAX_GUESSES_PER_OBJECT + 49:05d}" and last.line == len(config) + 1
    # a key at column 1 (hjson without root braces) sits exactly on a line start
    (typo,) = validate_document(parse_text("train_micro_batch_size_per_gpu: 1\nzero_optimisation: {}\n"))[1:]
    assert (typo.code, typo.line, typo.column) == ("DS101", 2, 1)


# ---------------------------------------------------------------------------- 8. cold start


def test_validate_command_imports_only_what_it_uses(tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text('{"train_micro_batch_size_per_gpu": 1}')
    code = ("import sys; from dstk.cli import main; rc = main(['validate', sys.argv[1], '--no-project']); "
            "print(rc, ','.join(sorted(m for m in sys.modules if m.startswith('dstk.') and not "
            "m.startswith(('dstk.validate', 'dstk.findings', 'dstk.errors', 'dstk.resources')))))")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True,
                         timeout=60)
    rc, modules = out.stdout.split("\n")[-2].split(" ", 1) if " " in out.stdout.split("\n")[-2] else (
        out.stdout.split("\n")[-2], "")
    assert rc == "0"
    assert set(filter(None, modules.split(","))) <= {"dstk.cli", "dstk.commands", "dstk.commands.validate"}


# ---------------------------------------------------------------------------- fuzzing


_TOKENS = ['{', '}', '[', ']', ':', ',', '"a"', '"zero_optimization"', '"stage"', '3', '-1', '1e400', 'NaN', 'Infinity',
           'true', 'null', '"auto"', "'x'", '/*', '*/', '//', '#', '\n', ' ', '"\\u00', '"\\"', "'''", '9' * 50, '0.5',
           '"_c"', '"$schema"', 'abc', '"optimizer"', '"params"', '"betas"', '"train_batch_size"', '"\\ud800"', '\t',
           '-', '.', 'e', '"~1/"', '9' * 4400]


def test_random_token_soup_never_raises():
    import random

    rng = random.Random(12)
    for _ in range(3000):
        text = "".join(rng.choice(_TOKENS) for _ in range(rng.randint(1, 40)))
        findings = validate_document(parse_text(text), world_size=rng.choice([None, 1, 8]))
        assert all(f.code and f.message for f in findings)
