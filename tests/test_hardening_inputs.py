"""plan / generate / estimate refuse bad numbers and bad intent files with exit 1, the flag or
file:line and a fix: never an internal error (exit 3), never a default in place of what was given
(issue 15, part 3). The fuzz-style loops run the real CLI (``dstk.cli.main``) over nasty values."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dstk.cli import main
from dstk.commands.plan import _FLAGS

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "examples" / "intents" / "tiny-llama-cpu.yaml")
TINY_TEXT = Path(TINY).read_text(encoding="utf-8")

NUMERIC = [(flag, kw["type"], f"{section}.{field}") for flag, section, field, kw in _FLAGS
           if kw.get("type") in (int, float)] + [("--gpus", int, "cluster.num_nodes")]
"""Every numeric intent flag of plan/generate (helpers that add flags to _FLAGS are covered too)."""

ZERO_OK = {"--zero", "--weight-decay", "--grad-clip", "--min-lr-ratio", "--headroom", "--betas", "--lora-dropout"}
"""Flags where 0 is a real value (ZeRO-0, no decay, no clipping ...)."""

BAD_FOR_ALL = ["abc", "", " ", "nan", "NaN", "inf", "-inf", "1e400", "-1", "-0.5", "9" * 5000, "0x10", "1,5",
               "--", "1e-400x"]
BAD_FOR_INT = ["1.5", "0.999", "9223372036854775808", "1e300", "2e19"]
LIMITED = {"--nodes": "65537", "--gpus-per-node": "1025", "--gpus": "1e12", "--global-batch": "1e9",
           "--gpu-memory-gib": "1e300", "--gpu-tflops": "1e300", "--host-memory": "1e300",
           "--min-lr-ratio": "1.5", "--headroom": "0.95", "--betas": "1"}
"""A value over each flag's own limit."""


def _bad_values(flag: str, kind: type) -> list[str]:
    values = list(BAD_FOR_ALL)
    if kind is int:
        values += BAD_FOR_INT
    if flag not in ZERO_OK:
        values += ["0", "0.0", "-0"]
    if flag in LIMITED:
        values.append(LIMITED[flag])
    if flag == "--betas":  # nargs=2 takes no `=`: words argparse reads as options are its own syntax errors
        values = [v for v in values if v not in ("--", "-inf")]
    return values


def _args(flag: str, value: str) -> list[str]:
    extra = {"--betas": ["--betas", value, "0.95"], "--global-batch-tokens": ["--global-batch-tokens=" + value]}
    return extra.get(flag, [f"{flag}={value}"])


@pytest.mark.parametrize("flag, kind, field", NUMERIC, ids=[f for f, _, _ in NUMERIC])
def test_every_numeric_plan_flag_refuses_every_bad_value(flag, kind, field, capsys):
    """Each bad value: exit 1 (not 2 from argparse, not 3 from a crash, not 0 with a default) and the
    flag named in the message, with a fix."""
    failures = []
    for value in _bad_values(flag, kind):
        capsys.readouterr()
        code = main(["plan", TINY, *_args(flag, value)])
        err = capsys.readouterr().err
        if code != 1 or flag not in err or "fix:" not in err or "internal error" in err:
            failures.append((value[:20], code, err.strip().splitlines()[:1]))
    assert failures == []


@pytest.mark.parametrize("command", ["generate", "estimate"])
def test_generate_and_estimate_refuse_the_same_values(tmp_path, command, capsys):
    out = tmp_path / "run"
    base = {"generate": ["generate", TINY, "-o", str(out)],
            "estimate": ["estimate", "--model", "tiny-llama", "--gpus", "2", "--gpu", "cpu"]}[command]
    cases = [("--gpus", "0"), ("--gpus-per-node", "0"), ("--seq-len", "0"), ("--global-batch", "0"),
             ("--gpu-memory-gib", "0"), ("--gpu-memory-gib", "inf"), ("--gpu-memory-gib", "nan"),
             ("--gpu-memory-gib", "-1"), ("--seq-len", "9" * 5000), ("--gpu-memory-gib", "1e300")]
    if command == "estimate":
        cases += [("--params", v) for v in ("inf", "nan", "-1", "0", "1e300", "9" * 5000)]
        cases += [("--micro-batch", "0"), ("--tp", "0"), ("--tokens", "0"), ("--zero", "7")]
    for flag, value in cases:
        args = [a for a in base if a != "--gpus" or flag != "--gpus"]
        if flag == "--gpus" and command == "estimate":
            args = ["estimate", "--model", "tiny-llama", "--gpu", "cpu"]
        if flag == "--params":
            args = ["estimate", "--gpus", "2"]
        capsys.readouterr()
        assert main([*args, f"{flag}={value}"]) == 1, (flag, value[:20])
        err = capsys.readouterr().err
        assert flag in err and "fix:" in err and "internal error" not in err, (flag, value[:20], err)
    assert not out.exists()


def test_zero_is_never_replaced_by_a_default(capsys):
    """`--gpus-per-node 0` with `--gpus 8` was read as "not given" (``0 or 8``) and planned 8 GPUs per node."""
    assert main(["plan", TINY, "--gpus", "8", "--gpus-per-node", "0"]) == 1
    assert "--gpus-per-node 0" in capsys.readouterr().err
    assert main(["estimate", "--model", "tiny-llama", "--gpu", "cpu", "--gpus", "2", "--seq-len", "0"]) == 1
    assert "--seq-len 0" in capsys.readouterr().err


def _intent(tmp_path: Path, name: str, text: str | bytes) -> str:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return str(path)


def _lines(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new, 1)


BAD_INTENTS = {
    # name: (content, expected line, words in the message)
    "quoted-int.yaml": (_lines(TINY_TEXT, "num_layers: 2", "num_layers: '2'"), 7, "quoted"),
    "quoted-double.yaml": (_lines(TINY_TEXT, "seq_len: 64", 'seq_len: "64"'), 18, "quoted"),
    "quoted-float.yaml": (_lines(TINY_TEXT, "lr: 1.0e-3", "lr: '1.0e-3'"), 21, "quoted"),
    "duplicate-key.yaml": (_lines(TINY_TEXT, "  vocab_size: 512\n", "  vocab_size: 512\n  vocab_size: 1024\n"), 13,
                           "given twice"),
    "duplicate-section.yaml": (TINY_TEXT + "training:\n  seq_len: 32\n", 24, "given twice"),
    "duplicate.json": ('{"model": {"name": "tiny-llama"},\n "cluster": {"gpu": "cpu",\n  "gpu": "h100-sxm"}}', 3,
                       "given twice"),
    "deep.yaml": ("model: " + "[" * 10_000 + "]" * 10_000 + "\n", 1, "nested"),
    "deep-block.yaml": ("".join("  " * i + f"k{i}:\n" for i in range(200)), 33, "nested"),
    "digits.yaml": (_lines(TINY_TEXT, "num_layers: 2", "num_layers: " + "9" * 5000), 7, "5000-character number"),
    "hex.yaml": (_lines(TINY_TEXT, "num_layers: 2", "num_layers: 0x" + "f" * 5000), 7, "5002-character number"),
    "hex-short.yaml": (_lines(TINY_TEXT, "num_layers: 2", "num_layers: 0x" + "f" * 30), 7, "too large"),
    "base60.yaml": (_lines(TINY_TEXT, "num_layers: 2", "num_layers: 1" + ":59" * 30), 7, "91-character number"),
    "inf.yaml": (_lines(TINY_TEXT, "seq_len: 64", "seq_len: .inf"), 18, "seq_len"),
    "nan.yaml": (TINY_TEXT + "  eps: .nan\n", 24, "finite"),
    "unknown-key.yaml": (TINY_TEXT + "  lr_unused: 1\n", 24, "unknown key"),
    "gpus-zero.yaml": (_lines(TINY_TEXT, "gpus_per_node: 2", "gpus_per_node: 0"), 15, "positive"),
    "seq-zero.yaml": (_lines(TINY_TEXT, "seq_len: 64", "seq_len: 0"), 18, "positive"),
    "batch-zero.yaml": (_lines(TINY_TEXT, "global_batch: 8", "global_batch: 0"), 19, "positive"),
    "memory-zero.yaml": (_lines(TINY_TEXT, "gpu: cpu", "gpu: cpu\n  gpu_memory_gib: 0"), 17, "positive"),
    "memory-huge.yaml": (_lines(TINY_TEXT, "gpu: cpu", "gpu: cpu\n  gpu_memory_gib: 1.0e+300"), 17, "at most"),
    "binary.yaml": (b"model:\n  name: x\n" + bytes(range(256)), 3, "binary"),
    "laughs.yaml": ("a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
                    + "".join(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 9))
                    + "model:\n  name: tiny-llama\n", 2, "alias"),
    "cycle.yaml": ("model: &m\n  name: tiny-llama\n  x: *m\n", 3, "alias"),
    "latin1.yaml": (TINY_TEXT.replace("# A tiny", "# \xe9 tiny").encode("latin-1"), 1, "UTF-8"),
}


@pytest.mark.parametrize("name", sorted(BAD_INTENTS))
@pytest.mark.parametrize("command", ["plan", "generate", "estimate"])
def test_bad_intent_files_name_file_and_line(tmp_path, name, command, capsys):
    content, line, words = BAD_INTENTS[name]
    path = _intent(tmp_path, name, content)
    args = {"plan": ["plan", path], "generate": ["generate", path, "-o", str(tmp_path / "run")],
            "estimate": ["estimate", "--intent", path]}[command]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert f"{path}:{line}" in err and words in err and "fix:" in err, err
    assert not (tmp_path / "run").exists()


def test_bad_intent_on_stdin_names_stdin_and_line(monkeypatch, capsys):
    import io

    content = _lines(TINY_TEXT, "num_layers: 2", "num_layers: '2'")
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(content.encode())))
    assert main(["plan", "-"]) == 1
    assert "<stdin>:7" in capsys.readouterr().err


def test_unquoted_yaml_numbers_still_load(tmp_path, capsys):
    """PyYAML 1.1 reads `3e-4` and `1e12` (no dot) as strings: plain (unquoted) ones are the numbers meant."""
    text = _lines(TINY_TEXT, "lr: 1.0e-3", "lr: 3e-4\n  num_tokens: 1e6")
    assert main(["plan", _intent(tmp_path, "ok.yaml", text), "--format", "json"]) == 0


@pytest.mark.parametrize("path", ["/dev/zero", "/dev/null", "DIR"])
def test_devices_and_directories_are_not_intents(tmp_path, path, capsys):
    path = str(tmp_path) if path == "DIR" else path
    assert main(["plan", path]) in (1, 2)
    err = capsys.readouterr().err
    assert "internal error" not in err and "fix:" in err and path in err


def test_oversized_intent_is_refused_without_reading_it_all(tmp_path, capsys):
    path = tmp_path / "huge.yaml"
    with open(path, "wb") as fh:
        fh.truncate(1 << 30)  # a sparse 1 GiB file
    assert main(["plan", str(path)]) == 1
    assert "larger than 1 MiB" in capsys.readouterr().err
    os.unlink(path)


def test_every_numeric_estimate_flag_refuses_bad_values(capsys):
    """`dstk estimate` has its own flags: text, nan, inf and 5,000 digits on each numeric one, and 0 and
    -1 on each that takes a positive number (``dstk.intent.FLAG_RANGES``): exit 1 naming the flag."""
    import argparse

    from dstk.commands import estimate
    from dstk.intent import FLAG_RANGES

    parser = argparse.ArgumentParser()
    estimate.configure(parser)
    numeric = [a for a in parser._actions if a.option_strings and getattr(a.type, "__name__", "") in ("int", "float")]
    assert len(numeric) >= 20
    failures = []
    for action in numeric:
        flag = max(action.option_strings, key=len)
        values = ["abc", "", "nan", "inf", "1e400", "9" * 5000]
        if action.dest in FLAG_RANGES:
            values += ["0", "-1"]
        base = ["estimate", "--gpus", "2"] + ([] if action.dest in ("params", "gpus") else ["--params", "1e6"])
        for value in values:
            capsys.readouterr()
            code = main([*base, f"{flag}={value}"])
            err = capsys.readouterr().err
            if code != 1 or flag not in err or "fix:" not in err:
                failures.append((flag, value[:10], code, err.strip().splitlines()[:1]))
    assert failures == []
