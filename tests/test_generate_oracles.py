"""The real parsers as oracles for generated files: DeepSpeed's ``DeepSpeedConfig`` at a chosen
data-parallel size, and megatron-core's ``TransformerConfig`` for ``megatron.args``.

``ds_parse`` is a fixture other generate tests import. DeepSpeedConfig ignores its ``mpu`` unless
``deepspeed.comm`` is initialised, so we start a 1-rank gloo group once and hand it an mpu that
reports the target data-parallel size (see /work/shared/ENVIRONMENT.md).
"""

from __future__ import annotations

import os
import socket

import pytest


class _MPU:
    def __init__(self, dp: int):
        self.dp = dp

    def get_data_parallel_world_size(self):
        return self.dp

    def get_data_parallel_rank(self):
        return 0

    def get_model_parallel_world_size(self):
        return 1

    def get_model_parallel_rank(self):
        return 0


@pytest.fixture(scope="session")
def ds_parse():
    import torch.distributed

    import deepspeed
    from deepspeed.runtime.config import DeepSpeedConfig

    if not torch.distributed.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        for key, value in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                               MASTER_PORT=str(port)).items():
            os.environ.setdefault(key, value)
        deepspeed.init_distributed(dist_backend="gloo")

    def parse(config: dict, *, dp: int):
        return DeepSpeedConfig(dict(config), mpu=_MPU(dp))

    return parse


MEGATRON_FIELDS = {  # megatron.args option -> TransformerConfig field (as Megatron-LM's arguments.py maps them)
    "--num-layers": "num_layers",
    "--hidden-size": "hidden_size",
    "--ffn-hidden-size": "ffn_hidden_size",
    "--num-attention-heads": "num_attention_heads",
    "--num-query-groups": "num_query_groups",
    "--tensor-model-parallel-size": "tensor_model_parallel_size",
    "--pipeline-model-parallel-size": "pipeline_model_parallel_size",
    "--decoder-first-pipeline-num-layers": "num_layers_in_first_pipeline_stage",
    "--decoder-last-pipeline-num-layers": "num_layers_in_last_pipeline_stage",
    "--pipeline-model-parallel-layout": "pipeline_model_parallel_layout",
    "--recompute-granularity": "recompute_granularity",
    "--recompute-method": "recompute_method",
    "--recompute-num-layers": "recompute_num_layers",
}


def megatron_config(args: list[str]):
    """Build megatron-core's TransformerConfig (a ModelParallelConfig) from rendered arguments."""
    import torch
    from megatron.core.transformer import TransformerConfig

    opts: dict[str, str | None] = {}
    for item in args:
        name, _, value = item.partition(" ")
        assert name not in opts, f"duplicate option {name}"
        opts[name] = value or None
    kwargs: dict = {}
    for name, field in MEGATRON_FIELDS.items():
        if name in opts:
            value = opts[name]
            kwargs[field] = int(value) if value.lstrip("-").isdigit() else value
    if "--num-layers-per-virtual-pipeline-stage" in opts:
        per_chunk = int(opts["--num-layers-per-virtual-pipeline-stage"])
        kwargs["virtual_pipeline_model_parallel_size"] = kwargs["num_layers"] // (
            per_chunk * kwargs["pipeline_model_parallel_size"])
    if "--num-virtual-stages-per-pipeline-rank" in opts:  # Megatron-LM's form for uneven stages
        kwargs["virtual_pipeline_model_parallel_size"] = int(opts["--num-virtual-stages-per-pipeline-rank"])
    if "--attention-backend" in opts:  # Megatron-LM's arguments.py: type=lambda attn_backend: AttnBackend[attn_backend]
        from megatron.core.transformer.enums import AttnBackend

        kwargs["attention_backend"] = AttnBackend[opts["--attention-backend"]]
    dtype = torch.bfloat16 if "--bf16" in opts else torch.float16 if "--fp16" in opts else torch.float32
    kwargs.update(
        sequence_parallel="--sequence-parallel" in opts,
        bf16="--bf16" in opts,
        fp16="--fp16" in opts,
        params_dtype=dtype,
        pipeline_dtype=dtype if kwargs.get("pipeline_model_parallel_size", 1) > 1 else None,
        gated_linear_unit="--swiglu" in opts or "--quick-geglu" in opts,
        add_bias_linear="--disable-bias-linear" not in opts,
        normalization=opts.get("--normalization", "LayerNorm"),
    )
    return TransformerConfig(**kwargs), opts
