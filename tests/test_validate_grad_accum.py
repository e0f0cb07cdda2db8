"""DS235: ``data_types.grad_accum_dtype`` other than the model's dtype without ZeRO. DeepSpeed's parser
accepts it; the real ``deepspeed.initialize`` then raises NotImplementedError (``engine.py``,
``_do_optimizer_sanity_check``). Each case runs through both: the validator's verdict must match what
initialize does, so a rule that flags too much or too little fails here."""

from __future__ import annotations

import json

import pytest
from test_generate_oracles import ds_parse  # noqa: F401  (a fixture: DeepSpeed's own config parser)

from dstk.validate import validate_config

CASES = [  # (precision, stage, grad_accum_dtype, initialize raises)
    ("bf16", 0, "fp32", True),
    ("bf16", 0, "float32", True),
    (None, 0, "bf16", True),
    ("bf16", 0, "bfloat16", False),
    ("bf16", 0, "torch.bfloat16", False),
    ("bf16", 1, "fp32", False),
    ("bf16", 2, "fp32", False),
    (None, 0, "fp32", False),
]


def _config(precision: str | None, stage: int, accum: str) -> dict:
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
              "zero_optimization": {"stage": stage}, "data_types": {"grad_accum_dtype": accum}}
    if precision:
        config[precision] = {"enabled": True}
    return config


@pytest.mark.parametrize("precision, stage, accum, raises", CASES)
def test_ds235_matches_what_deepspeed_initialize_does(precision, stage, accum, raises, ds_parse):
    import deepspeed
    import torch

    config = _config(precision, stage, accum)
    ds_parse(config, dp=1)  # the parser lets every case through: the trap is at initialize
    codes = [f.code for f in validate_config(json.loads(json.dumps(config))) if f.severity == "error"]
    assert ("DS235" in codes) is raises, codes
    model = torch.nn.Linear(4, 4)
    if raises:
        with pytest.raises(NotImplementedError, match="unsupported mix"):
            deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    else:
        deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)


def test_ds235_names_the_key_and_the_fix():
    finding = next(f for f in validate_config(_config("bf16", 0, "fp32")) if f.code == "DS235")
    assert finding.pointer == "/data_types/grad_accum_dtype"
    assert "NotImplementedError" in finding.message and "bf16" in finding.message
    assert "stage to 1" in finding.hint and "remove grad_accum_dtype" in finding.hint
