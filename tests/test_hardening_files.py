"""User files other than the intent are read as strictly as the intent, and `dstk export` writes its
HF directory complete or not at all (issue 15's leftovers).

- ``--hardware FILE`` (a hand-written catalog or a ``doctor --calibrate`` profile), ``--from`` /
  ``dstk import`` (accelerate, LLaMA-Factory, axolotl YAML, ``TrainingArguments`` JSON, the DeepSpeed
  JSON they point at), ``validate --training-args`` and ``[tool.dstk]``: a key given twice (which
  PyYAML and ``json`` would keep the last of, silently) is refused with ``file:line`` and a fix,
  never a traceback. The duplicated files are the real configs under tests/data/import.
- ``dstk export`` killed by SIGKILL at each step of its writer leaves no ``--output`` (or the old
  empty one) or the complete export, never a part of it; the next export leaves no temporary sibling.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dstk.cli import main
from tests.procs import until_paused

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "import"
TINY = str(ROOT / "examples" / "intents" / "tiny-llama-cpu.yaml")


def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def _after(text: str, anchor: str, extra: str) -> tuple[str, int]:
    """``text`` with ``extra`` inserted on the line after the one holding ``anchor``; the 1-based
    line ``extra`` lands on."""
    lines = text.splitlines(keepends=True)
    (i,) = [n for n, line in enumerate(lines) if anchor in line][:1]
    return "".join(lines[: i + 1]) + extra + "".join(lines[i + 1:]), i + 2


def _calibrated_profile(suffix: str) -> str:
    import dstk.calibrate as cal
    from dstk.hardware import get_gpu

    sys.path.insert(0, str(ROOT / "tests"))
    from test_doctor_calibrate import _measured

    profile = cal.build_profile(base=get_gpu("cpu"), measured=_measured())
    return cal.render_json(profile) if suffix == ".json" else cal.render_yaml(profile, header=("dstk hardware profile",))


def _cases(tmp_path: Path) -> dict[str, tuple[list[str], str, int, int]]:
    """name -> (argv, the file, the duplicate's line, exit code)."""
    out: dict[str, tuple[list[str], str, int, int]] = {}

    def case(name: str, text: str, line: int, argv, code: int = 1) -> None:
        path = _write(tmp_path, name, text)
        out[name] = (argv(path), path, line, code)

    text, line = _after("gpus:\n  h100-sxm: {achievable_fraction: 0.4}\n", "h100-sxm", "  h100-sxm: {memory_gib: 64}\n")
    case("hw.yaml", text, line, lambda p: ["plan", TINY, "--hardware", p])
    text, line = _after('{"gpus": {\n  "my-gpu": {"base": "a100-80gb",\n    "memory_gib": 64,\n', '"base"',
                        '    "base": "h100-sxm",\n')
    case("hw.json", text + '    "bf16_tflops": 1e3}}}\n', line, lambda p: ["estimate", "--intent", TINY, "--hardware", p])
    for suffix in (".yaml", ".json"):
        profile = _calibrated_profile(suffix)
        key = "    hbm_gbps:" if suffix == ".yaml" else '"hbm_gbps"'
        text, line = _after(profile, key, "    hbm_gbps: 99\n" if suffix == ".yaml" else '      "hbm_gbps": 99,\n')
        case(f"profile{suffix}", text, line, lambda p: ["plan", TINY, "--hardware", p])

    acc = (DATA / "accelerate_deepspeed.yaml").read_text()
    text, line = _after(acc, "zero_stage:", "  zero_stage: 1\n")
    case("accelerate.yaml", text, line, lambda p: ["plan", "--from", p])
    lf = (DATA / "llamafactory_full_sft.yaml").read_text()
    text, line = _after(lf, "cutoff_len:", "cutoff_len: 4096\n")
    case("llamafactory.yaml", text, line, lambda p: ["import", p, "--model", "tiny-llama"])
    ax = (DATA / "axolotl_full.yml").read_text()
    text, line = _after(ax, "micro_batch_size:", "micro_batch_size: 8\n")
    case("axolotl.yml", text, line, lambda p: ["generate", "--from", p, "--model", "tiny-llama",
                                               "--output", str(tmp_path / "run")])
    ta = (DATA / "training_args.json").read_text()
    text, line = _after(ta, '"per_device_train_batch_size"', '  "per_device_train_batch_size": 16,\n')
    case("hf_args.json", text, line, lambda p: ["import", p, "--model", "tiny-llama"])
    case("training_args.json", text, line,
         lambda p: ["validate", str(ROOT / "templates" / "presets" / "hf" / os.listdir(ROOT / "templates" / "presets" / "hf")[0]),
                    "--hf", "--no-project", "--training-args", p])
    # an HF config.json given as --model (transformers' json.load would keep the last one too)
    from dstk.models import family_module

    hf = json.dumps({**family_module("llama").PRESETS["llama-3-8b"], "model_type": "llama"}, indent=2)
    text, line = _after(hf, '"num_hidden_layers"', '  "num_hidden_layers": 2,\n')
    case("hf_config.json", text, line, lambda p: ["plan", TINY, "--model", p])
    # the DeepSpeed JSON an accelerate config points at (validate's reader: DS007)
    ds = (DATA / "deepspeed_configs" / "zero3_bf16_cpuoffload_params.json").read_text()
    ds_text, ds_line = _after(ds, '"stage"', '    "stage": 2,\n')
    ds_path = _write(tmp_path, "ds_dup.json", ds_text)
    acc_file = (DATA / "accelerate_config_file.yaml").read_text()
    acc_file = "\n".join(
        f"  deepspeed_config_file: {ds_path}" if line.strip().startswith("deepspeed_config_file:") else line
        for line in acc_file.splitlines()) + "\n"
    path = _write(tmp_path, "accelerate_file.yaml", acc_file)
    out["followed-deepspeed.json"] = (["import", path, "--model", "tiny-llama"], ds_path, ds_line, 1)
    # [tool.dstk]: bad project settings are usage errors (exit 2), as every other [tool.dstk] mistake
    (tmp_path / "proj").mkdir()
    toml = _write(tmp_path / "proj", "pyproject.toml", '[tool.dstk]\nworld_size = 8\nworld_size = 16\n')
    cfg = _write(tmp_path / "proj", "ds.json", '{"train_micro_batch_size_per_gpu": 1}\n')
    out["pyproject.toml"] = (["validate", cfg], toml, 3, 2)
    return out


CASE_NAMES = ["hw.yaml", "hw.json", "profile.yaml", "profile.json", "accelerate.yaml", "llamafactory.yaml",
              "axolotl.yml", "hf_args.json", "training_args.json", "hf_config.json", "followed-deepspeed.json",
              "pyproject.toml"]


@pytest.mark.parametrize("name", CASE_NAMES)
def test_a_key_given_twice_is_refused_with_file_and_line(tmp_path, name, capsys, monkeypatch):
    cases = _cases(tmp_path)
    assert sorted(cases) == sorted(CASE_NAMES)  # every kind is tested
    argv, path, line, code = cases[name]
    if name == "pyproject.toml":
        monkeypatch.chdir(tmp_path / "proj")
    assert main(argv) == code
    err = capsys.readouterr().err
    assert f"{path}:{line}" in err, err
    assert ("given twice" in err or "duplicate key" in err or "overwrite" in err) and "fix:" in err, err
    assert "Traceback" not in err and "internal error" not in err
    assert not (tmp_path / "run").exists()


def test_the_same_files_without_the_duplicate_still_load(tmp_path, capsys):
    """The strict reader keeps what each format needs: JSON read by json (`1e-05` a float, tabs
    fine), YAML by PyYAML as the tools read it, the calibrated profiles, the real configs."""
    tabbed = json.dumps(json.loads((DATA / "training_args.json").read_text()), indent="\t")
    path = _write(tmp_path, "tabbed.json", tabbed)
    shutil.copy(DATA / "ds_z2_config.json", tmp_path)  # the DeepSpeed JSON it names
    assert main(["import", path, "--model", "tiny-llama", "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    lr = [line for line in report["lines"] if line["key"] == "learning_rate"]
    assert lr and isinstance(lr[0]["value"], float) and lr[0]["target"] == "training.lr", lr
    assert report["intent"]["training"]["lr"] == json.loads(tabbed)["learning_rate"]
    for suffix in (".yaml", ".json"):
        profile = _write(tmp_path, f"profile{suffix}", _calibrated_profile(suffix))
        assert main(["plan", TINY, "--hardware", profile, "--format", "json", "--top", "1"]) == 0
        capsys.readouterr()
    for name in ("accelerate_deepspeed.yaml", "llamafactory_full_sft.yaml", "axolotl_full.yml"):
        assert main(["import", str(DATA / name), "--model", "tiny-llama"]) == 0, capsys.readouterr().err
        capsys.readouterr()


BAD = {
    # name: (content, line, words)
    "alias.yaml": ("compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\nmixed_precision: &p bf16\n"
                   "num_processes: 8\ndowncast_bf16: *p\n", 5, "alias"),
    "nan.json": ('{"gpus": {"h100-sxm": {\n  "achievable_fraction": NaN}}}\n', None, "NaN"),
    "deep.json": ('{"gpus": ' + "[" * 100 + "]" * 100 + "}\n", None, "nested"),
    "binary.yaml": ("gpus:\n  h100-sxm:\n    memory_gib: \x00\n", 3, "binary"),
    "list-entry.yaml": ("gpus:\n  h100-sxm: [1, 2]\n", 2, "mapping"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_other_strictness_of_the_intent_applies_too(tmp_path, name, capsys):
    content, line, words = BAD[name]
    path = _write(tmp_path, name, content)
    argv = ["import", path, "--kind", "accelerate"] if name == "alias.yaml" else ["plan", TINY, "--hardware", path]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert (f"{path}:{line}" if line else path) in err and words in err and "fix:" in err, err
    assert "Traceback" not in err and "internal error" not in err


def test_no_traceback_in_a_real_process(tmp_path):
    """The CLI as a user runs it: a duplicate in --hardware is exit 1, one line and a fix."""
    path = _write(tmp_path, "hw.yaml", "gpus:\n  cpu: {memory_gib: 8}\n  cpu: {memory_gib: 16}\n")
    proc = subprocess.run([sys.executable, "-m", "dstk.cli", "plan", TINY, "--hardware", path],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and f"{path}:3" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


# --- dstk export: complete or not at all ------------------------------------------------------------------

MAKE_CHECKPOINT = r"""
import sys, torch
from pathlib import Path
from transformers import LlamaConfig, LlamaForCausalLM
root = Path(sys.argv[1])
cfg = LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=2, vocab_size=64, max_position_embeddings=32)
torch.manual_seed(0)
model = LlamaForCausalLM(cfg)
tag = root / "global_step1"
tag.mkdir(parents=True)
# the layout DeepSpeed's save_checkpoint writes for ZeRO-0/1/2 (engine._save_checkpoint: "module")
torch.save({"module": model.state_dict(), "ds_config": {}}, tag / "mp_rank_00_model_states.pt")
(root / "latest").write_text("global_step1")
cfg.save_pretrained(root)
"""

# The child runs the real CLI; the writer's steps (dstk.render's, and transformers' safetensors write
# inside save_pretrained) are wrapped so that the PAUSE_AT-th prints where it is and sleeps until the
# parent SIGKILLs it.
CHILD = r"""
import os, sys, time
import dstk.render as r
import transformers.modeling_utils as mu
pause_at = int(os.environ.get("PAUSE_AT", "0"))
count = [0]
def step(label):
    count[0] += 1
    if count[0] == pause_at:
        print("PAUSED", label, file=sys.__stdout__, flush=True)  # export sends sys.stdout to stderr
        time.sleep(300)
def wrap(module, name, *, after=False):
    real = getattr(module, name)
    def wrapped(*a, **k):
        if not after:
            step(f"before {name}")
        out = real(*a, **k)
        if after:
            step(f"after {name}")
        return out
    setattr(module, name, wrapped)
for name in ("_remove_stale", "_fsync_tree", "_fsync_dir"):
    wrap(r, name)
wrap(r, "_exchange", after=True)
wrap(mu, "safe_save_file")
wrap(mu, "safe_save_file", after=True)
import shutil
wrap(shutil, "rmtree")
from dstk.cli import main
code = main(sys.argv[1:])
print("DONE", code, flush=True)
sys.exit(code)
"""


def _tree(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def _temps(parent: Path) -> list[str]:
    """Hidden entries beside --output: the writer's temporary siblings (any writer's naming)."""
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("export") / "ckpt"
    subprocess.run([sys.executable, "-c", MAKE_CHECKPOINT, str(root)], check=True, timeout=300)
    return root


@pytest.mark.parametrize("existing", [False, True], ids=["new", "empty-dir"])
def test_export_killed_at_every_step_leaves_nothing_or_all(tmp_path, checkpoint, existing, capsys):
    ref = tmp_path / "ref"
    assert main(["export", str(checkpoint), "--output", str(ref)]) == 0
    capsys.readouterr()
    reference = _tree(ref)
    assert {"config.json", "model.safetensors"} <= set(reference)
    parent = tmp_path / "models"
    parent.mkdir()
    out = parent / "hf"
    steps = []
    for pause_at in range(1, 30):
        if out.exists():
            shutil.rmtree(out)
        for leftover in _temps(parent):
            shutil.rmtree(parent / leftover)
        if existing:
            out.mkdir()
        proc = subprocess.Popen([sys.executable, "-c", CHILD, "export", str(checkpoint), "--output", str(out)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "PAUSE_AT": str(pause_at)}, start_new_session=True)
        try:
            step = until_paused(proc)
            if step is None:
                proc.wait(timeout=120)
                assert proc.returncode == 0, proc.stderr.read()
                assert _tree(out) == reference and _temps(parent) == []
                break
            steps.append(step)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
        got = _tree(out) if out.exists() else None
        assert got in ((None, {}) if not existing else ({},)) or got == reference, \
            f"killed {steps[-1]}: --output holds {sorted(got)}, a part of the export"
        assert not [p for p in (out.iterdir() if out.exists() else ()) if p.name.startswith(".")], steps[-1]
        # the next export (over what the kill left) removes the orphaned sibling and writes it all
        if got == reference:
            shutil.rmtree(out)
            if existing:
                out.mkdir()
        assert main(["export", str(checkpoint), "--output", str(out)]) == 0, capsys.readouterr().err
        capsys.readouterr()
        assert _tree(out) == reference, steps[-1]
        assert _temps(parent) == [], f"a temporary sibling survived the next export (killed {steps[-1]})"
    else:
        pytest.fail("the export never finished")
    # the kill points include the middle of save_pretrained and the last steps of the writer
    assert "before safe_save_file" in steps and "after safe_save_file" in steps, steps
    assert "before _fsync_tree" in steps and sum(s == "before _fsync_dir" for s in steps) >= 2, steps
    if existing:
        assert "after _exchange" in steps, steps


def test_export_refuses_a_non_empty_output_and_keeps_it(tmp_path, checkpoint, capsys):
    out = tmp_path / "hf"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    assert main(["export", str(checkpoint), "--output", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert _tree(out) == {"notes.txt": b"mine\n"} and _temps(tmp_path) == []


@pytest.mark.parametrize("argv, code, words", [
    (["plan", TINY, "--hardware", "/dev/zero"], 1, "larger than 1 MiB"),
    (["import", "/dev/zero"], 2, "not a training config"),
    (["plan", "--from", "/dev/zero"], 2, "not a training config"),
])
def test_an_endless_file_is_refused_without_reading_it_all(argv, code, words, capsys):
    assert main(argv) == code
    err = capsys.readouterr().err
    assert "/dev/zero" in err and words in err and "fix:" in err, err
