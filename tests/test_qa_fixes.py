"""Small truthfulness fixes: what megatron.args says of the MLP activation and the linear biases,
`dstk estimate`'s precision on a GPU without bf16, the offload wording on CPU ranks, and
`dstk estimate --config` of a file DeepSpeed refuses."""

from __future__ import annotations

import json
import re

import pytest
from test_generate_oracles import ds_parse  # noqa: F401  (a fixture: DeepSpeed's own config parser)

from dstk.cli import main


def _run(capsys, argv):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


# --- 1. the MLP activation: never --swiglu for a GeGLU model -------------------------------------


def test_gemma_is_not_rendered_as_swiglu_and_the_run_says_what_megatron_cannot_build(tmp_path, capsys):
    """Gemma's MLP is GeGLU (``hidden_act: gelu_pytorch_tanh``); megatron.args said --swiglu (a SiLU
    gate). Megatron-LM has no flag for a tanh-GELU gate: the file says --quick-geglu (the same
    matrices) and the README and generate's stderr say what differs and how to build it exactly."""
    code, _, err = _run(capsys, ["generate", "--model", "gemma-2b", "--gpus", "8", "--gpu", "h100-sxm",
                                 "--seq-len", "2048", "--global-batch", "64", "-o", str(tmp_path / "gemma")])
    assert code == 0
    args = (tmp_path / "gemma" / "megatron.args").read_text().splitlines()
    assert "--swiglu" not in args and "--quick-geglu" in args
    readme = (tmp_path / "gemma" / "README.md").read_text()
    for text in (readme, err):
        assert "Megatron-LM cannot build this model exactly" in text and "GeGLU (gelu_pytorch_tanh)" in text, text
        assert 'approximate="tanh"' in text  # what to do to build it exactly
    code, out, _ = _run(capsys, ["import", str(tmp_path / "gemma" / "megatron.args")])
    assert code == 0 and "ffn_hidden_size: 16384 " in out  # a gated MLP, read back at its width (not 2/3 of it)
    code, _, err = _run(capsys, ["generate", "--model", "llama-3-8b", "--gpus", "8", "--gpu", "h100-sxm",
                                 "--seq-len", "2048", "--global-batch", "64", "-o", str(tmp_path / "llama")])
    assert code == 0 and "--swiglu" in (tmp_path / "llama" / "megatron.args").read_text().splitlines()
    assert "cannot build" not in err + (tmp_path / "llama" / "README.md").read_text()


def test_the_figures_in_the_geglu_note_are_megatron_cores_functions():
    """The note says quick-GELU is within 0.021 of the tanh GELU, and the README keeps the tanh/erf
    difference (< 5e-4) silent: both measured on megatron-core's own ``quick_gelu``."""
    import torch
    from megatron.core.fusions.fused_bias_geglu import quick_gelu

    x = torch.linspace(-10, 10, 200001, dtype=torch.float64)
    tanh = torch.nn.functional.gelu(x, approximate="tanh")
    assert 0.020 < (quick_gelu(x) - tanh).abs().max().item() <= 0.021
    assert (tanh - torch.nn.functional.gelu(x)).abs().max().item() < 5e-4


# --- 2. the linear biases, against the real HF module --------------------------------------------

_TINY = {
    "llama": {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
              "num_key_value_heads": 4, "intermediate_size": 128, "vocab_size": 128},
    "qwen2": {"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
              "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 128},
    "gpt2": {"model_type": "gpt2", "n_embd": 64, "n_layer": 1, "n_head": 4, "vocab_size": 128, "n_positions": 64},
    "falcon": {"model_type": "falcon", "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
               "vocab_size": 128, "multi_query": True, "parallel_attn": True, "new_decoder_architecture": False,
               "alibi": False},
    "opt": {"model_type": "opt", "hidden_size": 64, "ffn_dim": 128, "num_hidden_layers": 1, "num_attention_heads": 4,
            "vocab_size": 128, "word_embed_proj_dim": 64, "max_position_embeddings": 64},
    "gpt_neox": {"model_type": "gpt_neox", "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
                 "intermediate_size": 128, "vocab_size": 128},
    "bloom": {"model_type": "bloom", "hidden_size": 64, "n_layer": 1, "n_head": 4, "vocab_size": 128},
}
_QKV = {"q_proj", "k_proj", "v_proj", "query_key_value", "c_attn"}


def _hf_biases(model) -> tuple[bool, bool, bool]:
    """(q/k/v, o, MLP) biases of the real transformers module's first layer, norms left out."""
    found = set()
    for name, _ in model.named_parameters():
        m = re.search(r"\.0\.(.+)\.bias$", name)
        if not m or re.search(r"norm|ln_", m.group(1)):
            continue
        path = m.group(1).split(".")
        found.add("mlp" if path[0] == "mlp" or path[-1] in ("fc1", "fc2") else "qkv" if path[-1] in _QKV else "o")
    return "qkv" in found, "o" in found, "mlp" in found


@pytest.mark.parametrize("family, keys", [
    ("llama", {}), ("llama", {"attention_bias": True}), ("llama", {"mlp_bias": True}),
    ("llama", {"attention_bias": True, "mlp_bias": True}), ("qwen2", {}), ("gpt2", {}),
    ("falcon", {"bias": False}), ("falcon", {"bias": True}), ("opt", {}), ("opt", {"enable_bias": False}),
    ("gpt_neox", {}), ("gpt_neox", {"attention_bias": False}), ("bloom", {}),
], ids=lambda v: v if isinstance(v, str) else "-".join(f"{k}={v}" for k, v in v.items()) or "default")
def test_megatron_biases_are_the_hf_models_or_said_to_differ(tmp_path, family, keys):
    """--disable-bias-linear was written for Llama with ``attention_bias: true`` (q/k/v/o biases) and
    for nothing in Falcon-7B's family (no biases, and none written): megatron.args must give
    Megatron-LM the HF module's biases, on q/k/v always (``--add-qkv-bias``), and where it cannot
    (an o_proj or MLP bias alone), a note that names it."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from dstk import render
    from dstk.layout import Layout
    from dstk.models import get_model
    from dstk.plan import model_dims, model_facts

    cfg = {**_TINY[family], **keys}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec = get_model(str(tmp_path))
    dims = model_dims(model_facts(spec), spec)
    args = render.megatron_args(layout=Layout(dp=1), training=render.TrainingIntent(seq_len=64), model=dims)
    every = "--disable-bias-linear" not in args
    megatron = (every or "--add-qkv-bias" in args, every, every)
    hf = _hf_biases(AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg)))
    assert megatron[0] == hf[0], (args, hf)  # q/k/v biases Megatron-LM can always say
    notes = " ".join(render.megatron_notes(dims))
    for what, ours, theirs in (("o_proj", megatron[1], hf[1]), ("the MLP", megatron[2], hf[2])):
        assert ours == theirs or f"biases on {what}" in notes and not ours, (what, args, hf, notes)
    if all(hf) or not any(hf):
        assert every == all(hf) and "--add-qkv-bias" not in args and "bias" not in notes


# --- 3. estimate on a GPU without bf16: plan's rule and message -----------------------------------

V100 = ["--model", "llama-3-8b", "--gpus", "8", "--gpu", "v100-32gb", "--seq-len", "2048"]


def test_estimate_refuses_bf16_on_v100_as_plan_does(capsys):
    """`dstk estimate --gpu-tflops ...` on a V100 priced bf16 at the given peak (and without it at
    the fp32 peak), while `dstk plan` refuses bf16 there: the same refusal, message and fix now."""
    for extra in ([], ["--gpu-tflops", "100"]):
        code_plan, _, plan_err = _run(capsys, ["plan", *V100, "--global-batch", "64", "--precision", "bf16", *extra])
        code, out, err = _run(capsys, ["estimate", *V100, "--zero", "3", "--precision", "bf16", *extra])
        assert code == code_plan == 1 and not out
        assert err == plan_err and "no bf16" in err and "fix: use --precision fp16" in err, err
    code, out, _ = _run(capsys, ["estimate", *V100, "--zero", "3", "--gpu-tflops", "100", "--format", "json"])
    assert code == 0 and json.loads(out)["training"]["precision"] == "fp16"  # plan's default on this GPU
    code, out, _ = _run(capsys, ["plan", *V100, "--global-batch", "64", "--format", "json"])
    assert any(line.startswith("precision fp16 (the default)") for line in json.loads(out)["plans"][0]["why"])


def test_estimate_of_a_bf16_config_on_v100_is_refused_with_the_files_fix(tmp_path, capsys):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
                                "zero_optimization": {"stage": 2}}))
    code, out, err = _run(capsys, ["estimate", "--config", str(path), *V100])
    assert code == 1 and not out and "no bf16" in err and '"fp16": {"enabled": true}' in err, err
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": True},
                                "zero_optimization": {"stage": 2}}))
    assert _run(capsys, ["estimate", "--config", str(path), *V100])[0] == 0


# --- 4. offload on CPU ranks: host memory, not PCIe -----------------------------------------------


def test_cpu_ranks_offload_is_not_worded_as_pcie_traffic(capsys):
    code, out, _ = _run(capsys, ["plan", "examples/intents/tiny-llama-cpu.yaml", "--format", "json"])
    assert code == 0
    lines = [line for plan in json.loads(out)["plans"] for line in plan["why"]]
    offload = [line for line in lines if "opt->cpu" in line and "x the winner" in line]
    assert offload, lines
    assert all("PCIe" not in line.replace("has no PCIe link", "") for line in lines), offload
    assert any("share host memory" in line for line in offload), offload
    code, out, _ = _run(capsys, ["plan", "--model", "llama-3-8b", "--gpus", "8", "--gpu", "h100-sxm",
                                 "--seq-len", "8192", "--global-batch", "256", "--offload-optimizer", "cpu",
                                 "--top", "3", "--format", "json"])
    why = " ".join(line for plan in json.loads(out)["plans"] for line in plan["why"])
    assert code == 0 and "side of PCIe" in why and "share host memory" not in why


# --- 5. estimate --config of a file DeepSpeed refuses ---------------------------------------------

TYPO = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
        "zero_optimization": {"stage": 2, "use_multi_rank_bucket_alreduce": True}}


def test_a_misspelt_zero_key_is_exit_1_with_the_finding_and_its_fix(tmp_path, capsys, ds_parse):
    """DeepSpeed parses zero_optimization with a pydantic model that forbids unknown keys
    (``DeepSpeedConfigModel``, ``extra="forbid"``): the file fails at ``deepspeed.initialize``, so
    the estimate (still printed) exits 1 with the finding and its fix. A top-level typo, which
    DeepSpeed ignores, stays a note and exit 0 (tests/test_estimate_config.py)."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="use_multi_rank_bucket_alreduce"):
        ds_parse(TYPO, dp=8)
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(TYPO, indent=1))
    code, out, err = _run(capsys, ["estimate", "--config", str(path), "--model", "llama-3-8b", "--gpus", "8"])
    assert code == 1 and "time per step" in out, (code, err)
    assert "DeepSpeed refuses" in err and "/zero_optimization/use_multi_rank_bucket_alreduce" in err
    assert "fix: did you mean 'use_multi_rank_bucket_allreduce'?" in err and f"{path}:" in err
    code, out, err = _run(capsys, ["estimate", "--config", str(path), "--model", "llama-3-8b", "--gpus", "8",
                                   "--format", "json"])
    refused = json.loads(out)["config"]["deepspeed_refuses"]
    assert code == 1 and [f["code"] for f in refused] == ["DS101"]
    fixed = {**TYPO, "zero_optimization": {"stage": 2, "use_multi_rank_bucket_allreduce": True}}
    ds_parse(fixed, dp=8)
    path.write_text(json.dumps(fixed))
    assert _run(capsys, ["estimate", "--config", str(path), "--model", "llama-3-8b", "--gpus", "8"])[0] == 0
    for ignored, word in (({"zero_optimisation": {"stage": 3}}, "zero_optimisation"),
                          ({"activation_checkpointing": {"partition_activation": True}}, "partition_activation")):
        ds_parse({**fixed, **ignored}, dp=8)  # a top-level key or a plain-dict section: DeepSpeed ignores it
        path.write_text(json.dumps({**fixed, **ignored}))
        code, out, err = _run(capsys, ["estimate", "--config", str(path), "--model", "llama-3-8b", "--gpus", "8"])
        assert code == 0 and word in out and "refuses" not in err, err


def test_an_optimizer_parameter_its_constructor_does_not_take_is_exit_1(tmp_path, capsys, ds_parse):
    """``"weight_decy"`` in AdamW's params: the real ``deepspeed.initialize`` raises TypeError (the
    optimizer's constructor), so the estimate exits 1 naming it; ``weight_decay`` runs, and exits 0."""
    import deepspeed
    import torch

    params = {"lr": 1e-3, "weight_decy": 0.1, "torch_adam": True}
    config = {"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW", "params": params},
              "zero_optimization": {"stage": 1}}
    with pytest.raises(TypeError, match="weight_decy"):
        deepspeed.initialize(model=torch.nn.Linear(4, 4), config=json.loads(json.dumps(config)))
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config))
    code, out, err = _run(capsys, ["estimate", "--config", str(path), "--model", "llama-3-8b", "--gpus", "8"])
    assert code == 1 and "time per step" in out and "/optimizer/params/weight_decy" in err
    assert "fix: did you mean 'weight_decay'?" in err
    params["weight_decay"] = params.pop("weight_decy")
    deepspeed.initialize(model=torch.nn.Linear(4, 4), config=json.loads(json.dumps(config)))
    path.write_text(json.dumps(config))
    assert _run(capsys, ["estimate", "--config", str(path), "--model", "llama-3-8b", "--gpus", "8"])[0] == 0
