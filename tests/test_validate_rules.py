"""Cross-field rules and the position scanner, case by case (the corpus covers the rest)."""

from __future__ import annotations

import pytest

from dstk.validate import parse_text, validate_config, validate_document

B = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1}


def found(config, **options):
    return {(f.severity, f.code, f.pointer) for f in validate_config(config, **options)}


@pytest.mark.parametrize("config, options, expected", [
    (B, {"world_size": 6, "tensor_parallel": 4}, ("error", "DS203", "")),
    ({**B, "tensor_parallel": {"autotp_size": 2, "tp": {"tp_size": 4}}}, {"world_size": 4},
     ("error", "DS228", "/tensor_parallel/tp/tp_size")),
    ({**B, "managed_gradient_accumulation": False}, {"world_size": 4, "pipeline_stages": 2},
     ("error", "DS230", "/managed_gradient_accumulation")),
    ({**B, "fp16": {"enabled": True, "loss_scale": 128}, "optimizer": {"type": "Lamb", "params": {"lr": 1e-3}}}, {},
     ("error", "DS225", "/fp16/loss_scale")),
    ({**B, "fp16": {"enabled": True, "loss_scale_window": 0}}, {}, ("error", "DS221", "/fp16/loss_scale_window")),
    ({**B, "pipeline": {"stages": 4}}, {}, ("warning", "DS231", "/pipeline/stages")),
    ({**B, "aio": {"use_gds": True}}, {}, ("warning", "DS234", "/aio/use_gds")),
    ({**B, "zero_optimization": True}, {}, ("warning", "DS106", "/zero_optimization")),
    ({**B, "zero_optimization": {"stage": 2, "cpu_offload": True}}, {},
     ("warning", "DS106", "/zero_optimization/cpu_offload")),
    ({**B, "zero_optimization": {"stage": "auto"}}, {"hf": True}, ("warning", "DS109", "/zero_optimization/stage")),
    ({**B, "zero_optimization": {"stage": 2, "stage3_prefetch_bucket_size": "auto"}}, {"hf": True},
     ("warning", "DS108", "/zero_optimization/stage3_prefetch_bucket_size")),
    ({**B, "bf16": {"enabled": True, "bf16_optimizer_states": True}, "zero_optimization": {"stage": 1}}, {},
     ("error", "DS215", "/bf16/bf16_optimizer_states")),
    ({**B, "tensor_parallel": {"dtype": "bf16"}}, {}, ("error", "DS102", "/tensor_parallel/dtype")),
    ({**B, "offload_optimizer": {"device": "cpu"}}, {}, ("error", "DS101", "/offload_optimizer")),
])
def test_rule(config, options, expected):
    assert expected in found(config, **options)


def test_unknown_key_hint_names_the_section_it_belongs_to():
    (f,) = [f for f in validate_config({**B, "offload_optimizer": {"device": "cpu"}}) if f.code == "DS101"]
    assert "/zero_optimization" in f.hint


def test_triad_without_world_size_checks_only_consistency():
    assert found({"train_batch_size": 12, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}) == {
        ("error", "DS201", "/train_batch_size")}
    assert found({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}) == set()


def test_hf_auto_triad_is_filled_consistently_so_not_checked():
    config = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": "auto"}
    assert found(config, world_size=7, hf=True) == set()


def test_native_auto_values_are_not_placeholders():
    assert found({**B, "pipeline": {"activation_checkpoint_interval": 0},
                  "data_types": {"keep_in_fp32_modules": "auto"}}) == set()


def test_findings_do_not_depend_on_wrong_types_elsewhere():
    # every rule reads through type guards: a config full of wrong types gives schema findings, no crash
    config = {"train_batch_size": "x", "zero_optimization": {"stage": [], "offload_optimizer": "cpu"},
              "optimizer": {"type": 3, "params": []}, "scheduler": "WarmupLR", "fp16": {"enabled": "yes"},
              "tensor_parallel": {"autotp_size": "two"}, "bf16": [], "data_types": {"param_dtype": 1}}
    codes = {f.code for f in validate_config(config, world_size=4, pipeline_stages=2)}
    assert codes <= {"DS102", "DS103", "DS202"} and "DS102" in codes


def test_hjson_positions_braceless_root_quoteless_keys_multiline_strings():
    text = ("# braceless hjson root\ntrain_micro_batch_size_per_gpu: 2\nzero_optimization: {\n  stage: 3\n"
            "  overlap_com: true\n  offload_param: {\n    device: nvme\n  }\n}\nnote: '''\n  multi\n  line'''\n"
            "optimizer: {\n  type: AdamW\n  params: {\n    lr: 1e-3\n    weight_decy: 0.1\n  }\n}\n")
    got = [(f.code, f.pointer, f.line, f.column) for f in validate_document(parse_text(text))]
    assert got == [("DS008", "", 1, 1), ("DS101", "/zero_optimization/overlap_com", 5, 3),
                   ("DS206", "/zero_optimization/offload_param/nvme_path", 6, 3), ("DS101", "/note", 10, 1),
                   ("DS101", "/optimizer/params/weight_decy", 17, 5)]


def test_keys_with_slashes_and_tildes_are_escaped_in_pointers():
    (f,) = [f for f in validate_config({**B, "a/b~c": 1})]
    assert f.pointer == "/a~1b~0c"
