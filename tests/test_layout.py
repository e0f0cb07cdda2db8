import pytest

from dstk.layout import Layout, Training


def test_world_size_and_global_batch():
    layout = Layout(dp=4, tp=2, pp=2, micro_batch=2, grad_accum=8)
    assert layout.world_size == 16
    assert layout.global_batch == 64


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"dp": 0}, "dp"),
        ({"zero_stage": 4}, "zero_stage"),
        ({"offload_optimizer": "gpu", "zero_stage": 2}, "offload_optimizer"),
        ({"offload_optimizer": "cpu"}, "offload_optimizer"),
        ({"offload_params": "cpu", "zero_stage": 2}, "offload_params"),
        ({"pp": 2, "zero_stage": 2}, "zero_stage"),
        ({"virtual_stages": 2}, "virtual_stages"),
        ({"sequence_parallel": True}, "sequence_parallel"),
        ({"recompute": "all"}, "recompute"),
        ({"first_stage_layers": 2}, "first_stage_layers"),
        ({"pp": 4, "virtual_stages": 2, "last_stage_layers": 3}, "last_stage_layers"),
    ],
)
def test_invalid_layouts_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        Layout(**kwargs)


def test_training_rejects_bad_precision():
    with pytest.raises(ValueError, match="^precision:"):
        Training(seq_len=128, global_batch=8, precision="fp8")
    assert Training(seq_len=128, global_batch=8).tokens_per_step == 1024
