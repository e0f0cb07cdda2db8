"""The shipped presets: found recursively, counted, up to date with the renderer, and accepted by
DeepSpeed's own parser (plain) or by transformers' filler followed by DeepSpeed's parser (hf)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_generate_oracles import ds_parse  # noqa: F401  (fixture)

from dstk import render

ROOT = Path(__file__).resolve().parent.parent
PRESETS = ROOT / "templates" / "presets"
DS_FILES = sorted((PRESETS / "deepspeed").rglob("*.json"))
HF_FILES = sorted((PRESETS / "hf").rglob("*.json"))


def test_presets_are_all_there_and_counted():
    # 11 presets x (deepspeed, hf): a non-recursive glob or a lost file would change the count.
    assert len(render.PRESETS) == 11
    assert len(list(PRESETS.rglob("*.json"))) == 22
    assert len(DS_FILES) == len(HF_FILES) == 11
    names = {p.stem for p in DS_FILES}
    assert {"zero0-bf16", "zero1-bf16", "zero2-bf16", "zero3-bf16", "zero2-offload-cpu", "zero3-offload-cpu",
            "zero3-offload-nvme", "zero1-fp16", "pipeline-pp2", "autotp2"} <= names


def test_presets_are_up_to_date_with_the_renderer():
    assert render.stale_presets() == [], "run `python -m dstk.render --write-presets`"


def test_stale_presets_notices_an_edit(tmp_path):
    render.write_presets(tmp_path)
    assert render.stale_presets(tmp_path) == []
    target = tmp_path / "deepspeed" / "zero1-bf16.json"
    target.write_text(target.read_text().replace('"stage": 1', '"stage": 2'))
    (tmp_path / "hf" / "extra.json").write_text("{}")
    assert render.stale_presets(tmp_path) == ["deepspeed/zero1-bf16.json", "hf/extra.json"]


def test_preset_readme_lists_every_preset():
    text = (PRESETS / "README.md").read_text()
    for preset in render.PRESETS:
        assert f"`{preset.name}`" in text


@pytest.mark.parametrize("path", DS_FILES, ids=lambda p: p.stem)
def test_deepspeed_preset_parses_at_several_dp_sizes(path, ds_parse):
    config = json.loads(path.read_text())
    assert '"auto"' not in path.read_text()
    for dp in (1, 2, 8):
        parsed = ds_parse(config, dp=dp)
        micro = config["train_micro_batch_size_per_gpu"]
        assert parsed.train_batch_size == micro * config["gradient_accumulation_steps"] * dp
        assert parsed.zero_optimization_stage == {"zero0": 0, "zero1": 1, "zero2": 2, "zero3": 3}.get(
            path.stem[:5], 1
        )


@pytest.mark.parametrize("path", HF_FILES, ids=lambda p: p.stem)
def test_hf_preset_is_filled_by_transformers_then_parsed_by_deepspeed(path, ds_parse):
    from transformers import TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    config = json.loads(path.read_text())
    hf = HfTrainerDeepSpeedConfig(config)
    args = TrainingArguments(
        output_dir=str(path.parent), per_device_train_batch_size=2, gradient_accumulation_steps=3,
        learning_rate=1e-4, bf16="bf16" in config, use_cpu=True, report_to=[],
    )
    hf.trainer_config_process(args)

    class Tiny:  # what HF reads from the model: config.hidden_size for the bucket sizes
        config = type("Config", (), {"hidden_size": 64})()

    hf.trainer_config_finalize(args, Tiny(), 100)
    assert '"auto"' not in json.dumps(hf.config), "HF left an 'auto' that DeepSpeed would crash on"
    parsed = ds_parse(hf.config, dp=args.world_size)
    assert parsed.train_batch_size == 6
    # the Trainer builds its own, except the optimizer under offload (DeepSpeed refuses a client one there)
    offload = "offload_optimizer" in config["zero_optimization"]
    assert ("optimizer" in hf.config) == offload and "scheduler" not in hf.config
    if offload:
        assert hf.config["optimizer"]["params"]["lr"] == 1e-4


def test_deepspeed_rejects_a_broken_triad(ds_parse):
    """The oracle can fail: a triad that does not multiply out is refused."""
    config = json.loads((PRESETS / "deepspeed" / "zero1-bf16.json").read_text())
    config["train_batch_size"] = 3
    with pytest.raises(AssertionError):
        ds_parse(config, dp=4)


@pytest.mark.parametrize("path", DS_FILES + HF_FILES, ids=lambda p: f"{p.parent.name}-{p.stem}")
def test_presets_have_no_findings_from_dstk_validate(path):
    from dstk.validate import validate_config

    config = json.loads(path.read_text())
    tp = config.get("tensor_parallel", {}).get("autotp_size", 1)
    pp = 2 if "pipeline" in config else 1
    findings = validate_config(config, world_size=8, tensor_parallel=tp, pipeline_stages=pp, hf=path.parent.name == "hf")
    assert findings == []
