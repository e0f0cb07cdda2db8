"""Product QA of plan / generate / explain as a new user meets them: each test is a finding that
misled or silently changed what the user asked for (see the T4 report), checked on the real CLI.

- a LoRA run directory told the user to launch ds_config.json (and Megatron-LM) with no word that
  the script must add the adapters: without them every parameter trains and the plan's memory is
  wrong by 4x (Mistral-7B: 39 GiB planned, 163 GiB for the same layout as a full fine-tune);
- a nothing-fits suggestion offered a layout whose offload needs 7.4 TiB of host RAM per node
  without saying so, and the message did not say what fills the GPU;
- ``--gpus 16 --nodes 4`` silently planned 2 nodes;
- ``--gpu-memory-gib 24`` without ``--gpu`` planned an H100 with 24 GiB and did not say so;
- cross-field errors (``--zero 3 --pp 2``, a micro-batch that does not divide the batch) offered
  the field's description as the "fix";
- ``dstk explain`` showed "comm / compute 0.00x" for a TP layout whose TP all-reduces (0.8 s a
  step) sit inside "compute".
"""

from __future__ import annotations

import json

import pytest

from dstk import plan as planner
from dstk.cli import main
from dstk.intent import intent_from_dict

LORA = ["--model", "mistral-7b", "--gpus", "1", "--gpu", "a100-80gb", "--seq-len", "4096", "--global-batch", "16",
        "--lora-rank", "16"]


def _run(capsys, argv):
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_lora_run_directory_says_how_to_add_the_adapters(tmp_path, capsys):
    assert main(["generate", *LORA, "--output", str(tmp_path / "lora")]) == 0
    readme = (tmp_path / "lora" / "README.md").read_text()
    assert readme.startswith("# dstk run: mistral-7b on 1 GPU\n")
    # the peft call with the plan's own settings and the family's module paths, pasteable
    assert ("peft.LoraConfig(r=16, lora_alpha=32, lora_dropout=0, target_modules=['self_attn.q_proj', "
            "'self_attn.k_proj', 'self_attn.v_proj', 'self_attn.o_proj', 'mlp.gate_proj', 'mlp.up_proj', "
            "'mlp.down_proj'])") in readme
    assert "dstk finetune --plan ." in readme and "Without them every parameter trains" in readme
    plan = json.loads((tmp_path / "lora" / "plan.json").read_text())
    assert plan["training"]["lora"]["rank"] == 16
    # Megatron-LM has no LoRA: its launch line is not offered for this plan
    assert "pretrain_gpt.py" not in readme and "Not with Megatron-LM" in readme


def test_a_qlora_readme_names_the_4bit_base(tmp_path):
    assert main(["generate", *LORA, "--lora-bits", "4", "--lora-targets", "q,v", "--output", str(tmp_path / "q")]) == 0
    readme = (tmp_path / "q" / "README.md").read_text()
    assert "target_modules=['self_attn.q_proj', 'self_attn.v_proj']" in readme
    assert "BitsAndBytesConfig(load_in_4bit=True" in readme


def test_a_full_training_readme_keeps_the_megatron_launch(tmp_path):
    assert main(["generate", "--model", "llama-3-8b", "--gpus", "8", "--gpu", "h100-sxm", "--seq-len", "4096",
                 "--global-batch", "64", "--output", str(tmp_path / "full")]) == 0
    readme = (tmp_path / "full" / "README.md").read_text()
    assert "on 8 GPUs" in readme and "torchrun --nproc_per_node 8 pretrain_gpt.py" in readme
    assert "LoraConfig" not in readme


def _intent(**cluster):
    return intent_from_dict({"model": {"name": "llama-3.1-405b"},
                             "cluster": {"num_nodes": 1, "gpus_per_node": 8, "gpu": "a100-40gb", **cluster},
                             "training": {"seq_len": 8192, "global_batch": 64}})


def test_nothing_fits_says_what_fills_the_gpu_and_the_host_ram_a_fix_needs():
    intent = _intent()
    ctx = planner.resolve(intent)
    result = planner.plan_intent(ctx, top=1)
    assert not result.plans
    message = planner.nothing_fits_message(ctx, result)
    # 405B at seq 8192 on tp=8 without sequence parallelism: the checkpointed layer inputs fill it
    assert "(activations " in message and message.index("activations") < message.index("CUDA context")
    fixes = planner.suggest_fixes(intent)
    offloading = [f for f in fixes if "->cpu" in f.split(" fits,")[0]]
    assert offloading, fixes
    for fix in offloading:  # the host RAM that fix needs, not checked because the node's is unknown
        assert "of host RAM per node for its offload (unchecked: give --host-memory GIB)" in fix, fix
        need = float(fix.split(", and ")[-1].split(" GiB")[0])
        assert need > 4096  # 405B of offloaded states: terabytes, which the user must be told


def test_gpus_and_nodes_that_disagree_are_refused(capsys):
    code, _, err = _run(capsys, ["plan", "--model", "llama-3-8b", "--gpus", "16", "--gpus-per-node", "8",
                                 "--nodes", "4", "--format", "json"])
    assert code == 1 and "--gpus 16 disagrees with --nodes 4" in err and "fix:" in err  # values: exit 1
    code, _, err = _run(capsys, ["plan", "--model", "llama-3-8b", "--gpus", "16", "--nodes", "0"])
    assert code != 0 and "--nodes 0: expected a positive integer" in err


@pytest.mark.parametrize("argv, nodes, per_node", [
    (["--gpus", "16", "--nodes", "2"], 2, 8),
    (["--gpus", "2", "--nodes", "2"], 2, 1),  # two nodes of one GPU, not refused
    (["--gpus", "16", "--nodes", "4"], 4, 4),
    (["--gpus", "4"], 1, 4),
])
def test_gpus_with_nodes_agree(argv, nodes, per_node):
    from dstk.cli import build_parser
    from dstk.commands.plan import intent_from_args

    intent = intent_from_args(build_parser().parse_args(["plan", "--model", "llama-3-8b", *argv]))
    assert (intent.cluster.num_nodes, intent.cluster.gpus_per_node) == (nodes, per_node)


def test_an_overridden_gpu_says_what_is_still_the_catalog_entry(capsys):
    code, out, _ = _run(capsys, ["plan", *LORA[:4], "--gpu-memory-gib", "24", "--seq-len", "4096",
                                 "--global-batch", "16", "--lora-rank", "16", "--format", "json"])
    assert code == 0
    why = " ".join(json.loads(out)["plans"][0]["why"])
    assert "GPU: h100-sxm (NVIDIA H100 SXM5 80GB) with 24 GiB of memory" in why
    assert "HBM bandwidth and GEMM efficiency are still the h100-sxm's" in why and "--hardware FILE" in why
    code, out, _ = _run(capsys, ["plan", *LORA, "--format", "json"])
    assert "GPU: " not in " ".join(json.loads(out)["plans"][0]["why"])


@pytest.mark.parametrize("flags, fix", [
    (["--zero", "3", "--pp", "2"], "pin zero_stage 0 or 1 (--zero 1) with the pipeline"),
    (["--micro-batch", "3", "--global-batch", "128"], "divides 128 (1, 2, 4, 8, 16, 32, 64, 128)"),
    (["--dp", "8", "--global-batch", "100"], "make the global batch a multiple of 8"),
    (["--virtual-stages", "2"], "add --engine megatron (engine: megatron), or drop virtual_stages"),
])
def test_cross_field_errors_give_a_fix(capsys, flags, fix):
    code, _, err = _run(capsys, ["plan", "--model", "llama-3-8b", "--gpus", "8", *flags])
    assert code == 1
    hint = err.split("fix:", 1)[1]
    assert fix in hint and "Pin the" not in hint  # not the field's description


def test_explain_counts_tp_comm_inside_compute():
    from dstk.explain import time_table

    rep = {"time": {"step_seconds": 12.0, "compute_seconds": 11.98, "comm_seconds": 0.02, "comm_over_compute": 0.0,
                    "comm": {"dp": 0.67, "tp": 0.83}}}
    rows = dict(time_table(rep)[2])
    assert "compute (with TP comm)" in rows and "comm (exposed: DP, ZeRO, offload)" in rows
    assert "  comm tp (in compute)" in rows and "  comm dp (before overlap)" in rows
    plain = dict(time_table({"time": {"step_seconds": 1.0, "compute_seconds": 0.9, "comm_seconds": 0.1,
                                      "comm": {"dp": 0.3}}})[2])
    assert "compute" in plain and "comm (exposed)" in plain


def test_the_tp_run_directory_explains_with_tp_inside_compute(tmp_path, capsys):
    assert main(["generate", "--model", "llama-3-8b", "--gpus", "8", "--gpu", "h100-sxm", "--seq-len", "8192",
                 "--global-batch", "128", "--tp", "2", "--output", str(tmp_path / "tp")]) == 0
    capsys.readouterr()
    code, out, _ = _run(capsys, ["explain", str(tmp_path / "tp")])
    assert code == 0 and "compute (with TP comm)" in out and "comm tp (in compute)" in out



# megatron.args option -> megatron-core TransformerConfig field, as Megatron-LM's arguments.py maps them
_MEGATRON_VALUES = {"--num-layers": "num_layers", "--hidden-size": "hidden_size",
                    "--ffn-hidden-size": "ffn_hidden_size", "--num-attention-heads": "num_attention_heads",
                    "--num-query-groups": "num_query_groups",
                    "--kv-channels": "kv_channels", "--num-experts": "num_moe_experts",
                    "--moe-router-topk": "moe_router_topk"}
_MEGATRON_SWITCHES = {"--add-qkv-bias": "add_qkv_bias", "--qk-layernorm": "qk_layernorm",
                      "--swiglu": "gated_linear_unit"}


def _megatron_layer_params(config) -> int:
    """Parameters of one megatron-core GPT layer of ``config`` (RMSNorm, no linear biases but
    ``add_qkv_bias``): input norm, fused QKV (+ bias), QK-norm, output projection, MLP norm, then
    the MLP, or a router plus ``num_moe_experts`` MLPs."""
    h, d = config.hidden_size, config.kv_channels
    q, kv = config.num_attention_heads * d, config.num_query_groups * d
    attention = h * (q + 2 * kv) + q * h + (q + 2 * kv if config.add_qkv_bias else 0)
    attention += 2 * d if config.qk_layernorm else 0
    mlp = h * config.ffn_hidden_size * (2 if config.gated_linear_unit else 1) + config.ffn_hidden_size * h
    if config.num_moe_experts:
        mlp = config.num_moe_experts * mlp + h * config.num_moe_experts
    return 2 * h + attention + mlp


@pytest.mark.parametrize("name", ["mixtral-8x7b", "qwen2-7b", "qwen3-0.6b", "gemma-7b", "llama-3-8b"])
def test_megatron_args_build_the_same_layer_as_the_hf_model(tmp_path, name):
    """megatron.args must describe the preset's model, not a dense / bias-free / narrower-head one:
    megatron-core's TransformerConfig from the written options has a layer of exactly the HF
    layer's parameters (Mixtral: 8 experts, top-2; Qwen2: q/k/v biases; Qwen3: QK-norm; Gemma-7B
    and Qwen3-0.6B: a head width that is not hidden / heads) and RoPE's base is written."""
    import torch
    from megatron.core.transformer import TransformerConfig

    from dstk.models import get_model

    assert main(["generate", "--model", name, "--gpus", "8", "--gpu", "h100-sxm", "--seq-len", "2048",
                 "--global-batch", "64", "--output", str(tmp_path / "run")]) == 0
    opts = {}
    for line in (tmp_path / "run" / "megatron.args").read_text().splitlines():
        flag, _, value = line.partition(" ")
        opts[flag] = value
    kwargs = {field: int(opts[flag]) for flag, field in _MEGATRON_VALUES.items() if flag in opts}
    kwargs.update({field: flag in opts for flag, field in _MEGATRON_SWITCHES.items()})
    kwargs["gated_linear_unit"] |= "--quick-geglu" in opts  # Gemma's GeGLU (arguments.py: gated quick-GELU)
    config = TransformerConfig(**kwargs, add_bias_linear="--disable-bias-linear" not in opts,
                               normalization=opts["--normalization"], bf16=True, params_dtype=torch.bfloat16)
    spec = get_model(name)
    assert _megatron_layer_params(config) == sum(spec.layer_tensors)
    theta = spec.hf_config.get("rope_theta") or 10000
    assert int(opts.get("--rotary-base", 10000)) == theta
    assert opts["--min-lr"] == "3e-05"  # not 2.9999999999999997e-05


@pytest.mark.parametrize("seq_len, micro, verdict", [
    (4096, 1, ": fits"),
    (8000, 1, ": TIGHT: over the 71.7 GiB `dstk plan` keeps usable"),  # 78.4 of 79.6 GiB: not "fits"
    (4096, 2, ": DOES NOT FIT"),
])
def test_estimate_says_tight_where_plan_would_refuse(capsys, seq_len, micro, verdict):
    """`dstk estimate` called 78 GiB on an 80 GB H100 "fits" while `dstk plan` refuses anything over
    71.7 GiB (10% headroom): the same layout got two verdicts."""
    code, out, _ = _run(capsys, ["estimate", "--model", "llama-3-8b", "--gpus", "8", "--gpu", "h100-sxm", "--zero", "3",
                                 "--micro-batch", str(micro), "--global-batch", "512", "--seq-len", str(seq_len)])
    assert code == 0
    total = " ".join(line.strip() for line in out.split("\ntotal", 1)[1].split("peak in")[0].splitlines())
    assert verdict in total, total


def test_a_multi_node_run_directory_gives_commands_that_run(tmp_path, capsys):
    """The README and generate's `next:` line said `dstk launch DIR -- train.py`, which a 2-node
    plan refuses ("no hosts were given"); the path was not quoted for the shell either."""
    import shlex

    out_dir = tmp_path / "my run"
    code, out, _ = _run(capsys, ["generate", "--model", "qwen2-7b", "--nodes", "2", "--gpus-per-node", "8", "--gpu",
                                 "a100-40gb", "--seq-len", "4096", "--global-batch", "256", "--output", str(out_dir)])
    assert code == 0
    nxt = out.strip().splitlines()[-1]
    assert nxt.startswith("next: ")
    validate, launch = (shlex.split(part) for part in nxt[len("next: "):].split("; "))
    assert validate[:3] == ["dstk", "validate", str(out_dir / "ds_config.json")]
    assert validate[3:5] == ["--world-size", "16"]  # the triad checked (tests/test_audit_fast.py: with tp/pp)
    assert launch == ["dstk", "launch", str(out_dir), "--hosts", "HOST1:8,HOST2:8", "--", "train.py"]
    assert _run(capsys, validate[1:])[0] == 0
    assert _run(capsys, [*launch[1:2], *launch[2:3], "--dry-run", *launch[3:]])[0] == 0  # the hosts it needs
    code, _, err = _run(capsys, ["launch", str(out_dir), "--dry-run", "--", "train.py"])
    assert code != 0 and "no hosts were given" in err  # what the old line ran into
    readme = (out_dir / "README.md").read_text()
    assert "dstk launch . --hosts node0:8,node1:8 -- train.py" in readme
    assert "one `HOST slots=8` line for each of the 2 nodes" in readme


@pytest.mark.parametrize("top", ["0", "-3"])
def test_top_must_be_positive(capsys, top):
    """--top 0 was an internal error (max() of no rows), --top -3 silently dropped the last 3 plans."""
    code, out, err = _run(capsys, ["plan", "--model", "llama-3-8b", "--gpus", "8", "--top", top])
    assert code == 2 and f"--top {top}: expected a positive number of plans" in err and not out
    assert "internal error" not in err


def test_plan_shows_the_time_to_train_that_num_tokens_promises(capsys):
    """`--num-tokens` "sets the number of steps and the time-to-train figure" (its help), but the
    human output of `dstk plan` never showed that figure."""
    code, out, _ = _run(capsys, ["plan", "--model", "llama-3-8b", "--gpus", "8", "--num-tokens", "1e12", "--top", "1",
                                 "--format", "json"])
    seconds = json.loads(out)["plans"][0]["time"]["time_to_train_seconds"]
    code, out, _ = _run(capsys, ["plan", "--model", "llama-3-8b", "--gpus", "8", "--num-tokens", "1e12", "--top", "1"])
    assert code == 0 and f"time to train #1: {seconds / 86400:.1f} d for 1,000,000,000,000 tokens" in out
    code, out, _ = _run(capsys, ["plan", "--model", "llama-3-8b", "--gpus", "8", "--top", "1"])
    assert "time to train" not in out


@pytest.mark.parametrize("kind, hidden_word", [("tp", "(on the critical path)"),
                                               ("dp", "(partly hidden behind compute)")])
def test_a_why_line_does_not_call_tp_comm_hidden(kind, hidden_word):
    """The step time counts TP collectives inside compute (DeepSpeed's AutoTP all-reduces block), so
    the why line said "(partly hidden behind compute)" of TP whenever the exposed DP comm was small."""
    from types import SimpleNamespace

    from dstk.layout import Layout

    def candidate(layout, *, step, comm_by_kind, exposed):
        time = SimpleNamespace(step_seconds=step, compute_seconds=step - exposed, comm_seconds=exposed,
                               comm=comm_by_kind, bubble_fraction=0.0)
        memory = SimpleNamespace(per_gpu=SimpleNamespace(total_bytes=2**30))
        return planner.Candidate(layout=layout, estimate=SimpleNamespace(time=time, memory=memory))

    winner = candidate(Layout(dp=8, zero_stage=2, micro_batch=1, grad_accum=16), step=10.0, comm_by_kind={},
                       exposed=0.0)
    alt = candidate(Layout(dp=4, tp=2, zero_stage=2, micro_batch=1, grad_accum=32), step=12.0,
                    comm_by_kind={kind: 3.0}, exposed=0.05)
    line = planner.loss_reason(alt, winner)
    assert "take 0.3x the compute" in line and line.endswith(hidden_word), line


def test_models_family_filter_forgives_case_and_suggests(capsys):
    code, out, _ = _run(capsys, ["models", "--family", "Mixtral"])
    assert code == 0 and "mixtral-8x7b" in out
    assert "mixtral-8x7b: 12.88B active per token (2 of 8 experts)" in out  # the total alone misleads on MoE
    code, _, err = _run(capsys, ["models", "--family", "qwen"])
    assert code == 2 and "did you mean qwen2 or qwen3?" in err


@pytest.mark.parametrize("model, seq_len, expect", [
    ("gpt2-xl", 4096, "its pretrained weights have only 1,024 learned positions and fail on a longer batch: "
                      "keep --seq-len 1024"),
    ("llama-2-7b", 32768, "from its pretrained weights RoPE runs past the length they were trained at"),
    ("llama-2-7b", 4096, None),
])
def test_a_sequence_longer_than_the_model_is_said(capsys, model, seq_len, expect):
    """GPT-2 XL at seq 4096 was planned without a word, though its 1,024 learned positions make the
    pretrained model fail on the first batch (HF's wpe lookup goes past the table)."""
    code, out, _ = _run(capsys, ["plan", "--model", model, "--gpus", "4", "--gpu", "a100-80gb", "--seq-len",
                                 str(seq_len), "--global-batch", "64", "--top", "1", "--format", "json"])
    assert code == 0
    why = [line for line in json.loads(out)["plans"][0]["why"] if line.startswith("seq_len")]
    if expect is None:
        assert not why
    else:
        assert len(why) == 1 and expect in why[0], why
