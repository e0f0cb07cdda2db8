"""One pipeline split everywhere: the decoder layers per stage that the estimator prices are the
ones the engines build, for layer counts that do not divide by pp.

- DeepSpeed: ``dstk.models.to_pipeline`` cuts the ``PipelineModule`` itself (``partition="balanced"``,
  ``dstk.pipeline.partition``); 4 real gloo ranks build it and report the decoder layers they hold.
- Megatron: ``megatron.args`` parsed back by megatron-core 0.16.1 (``TransformerConfig`` and
  ``get_num_layers_to_build`` / ``PipelineParallelLayerLayout``).
- ``dstk generate``: plan.json's per-stage memory is the memory of that split.

Run as a script, this file is one rank of the DeepSpeed check (through tests/dist.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SEQ = 16
WORLD = 4
COMMON = {"hidden_size": 32, "num_attention_heads": 4, "max_position_embeddings": 64}
# (name, HF config.json, pp): layers that do not divide by pp, small and large vocabularies (the
# output layer weighs like layers), a tied GPT-2 with learned positions, and one that divides.
CASES = [
    ("llama-5-pp2", {"model_type": "llama", **COMMON, "num_hidden_layers": 5, "num_key_value_heads": 2,
                     "intermediate_size": 64, "vocab_size": 128}, 2),
    ("llama-7-pp2-vocab2048", {"model_type": "llama", **COMMON, "num_hidden_layers": 7, "num_key_value_heads": 2,
                               "intermediate_size": 64, "vocab_size": 2048}, 2),
    ("llama-7-pp4", {"model_type": "llama", **COMMON, "num_hidden_layers": 7, "num_key_value_heads": 2,
                     "intermediate_size": 64, "vocab_size": 128}, 4),
    ("llama-10-pp4-vocab512", {"model_type": "llama", **COMMON, "num_hidden_layers": 10, "num_key_value_heads": 2,
                               "intermediate_size": 64, "vocab_size": 512}, 4),
    ("llama-8-pp4-vocab4096", {"model_type": "llama", **COMMON, "num_hidden_layers": 8, "num_key_value_heads": 2,
                               "intermediate_size": 64, "vocab_size": 4096}, 4),
    ("gpt2-9-pp4", {"model_type": "gpt2", "n_embd": 32, "n_layer": 9, "n_head": 4, "n_positions": 64,
                    "vocab_size": 128}, 4),
]


def _write_configs(root: Path) -> dict[str, Path]:
    out = {}
    for name, cfg, _ in CASES:
        (root / name).mkdir(parents=True, exist_ok=True)
        (root / name / "config.json").write_text(json.dumps(cfg))
        out[name] = root / name
    return out


def _rank_main(argv: list[str]) -> None:
    """One rank: build every case's pipeline with ``to_pipeline`` and write the decoder layers it holds."""
    import deepspeed
    import deepspeed.comm as dist
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    deepspeed.init_distributed(dist_backend="gloo")
    from dstk.pipeline import to_pipeline
    from dstk.pipeline.stages import DecoderPipe

    root = Path(argv[0])
    rank = dist.get_rank()
    report = {}
    for name, _, pp in CASES:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(root / name))
        pipe = to_pipeline(model, num_stages=pp, seq_len=SEQ)
        built = [m for m in pipe.forward_funcs if isinstance(m, DecoderPipe)]
        report[name] = {"stage": pipe.stage_id, "decoders": len(built),
                        "layer_idx": [m._layer_idx for m in built],
                        "parts": list(pipe.parts)}
        del pipe, model
    (root / f"rank{rank}.json").write_text(json.dumps(report))
    from dstk.launch.rank import exit_rank

    exit_rank()


if __name__ == "__main__":
    _rank_main(sys.argv[1:])


import pytest  # noqa: E402

from dstk.cli import main  # noqa: E402
from dstk.estimate import estimate, stage_layers  # noqa: E402
from dstk.hardware import Cluster, get_gpu  # noqa: E402
from dstk.layout import Layout, Training  # noqa: E402
from dstk.models import ModelSpec, get_model  # noqa: E402
from dstk.render import ModelDims, megatron_args, read_megatron_args  # noqa: E402


def _estimated_split(spec, pp: int, *, seq_len: int, engine: str = "deepspeed", layout: Layout | None = None,
                     gpu: str = "cpu") -> list[int]:
    """Decoder layers per stage in the estimate's per-stage memory (what plan.json carries)."""
    layout = layout or Layout(dp=1, pp=pp, grad_accum=4 * pp)
    cluster = Cluster(num_nodes=1, gpus_per_node=layout.world_size, gpu=get_gpu(gpu))
    est = estimate(model=spec, layout=layout, training=Training(seq_len=seq_len, global_batch=layout.global_batch),
                   cluster=cluster, engine=engine)
    return [s.num_layers for s in est.memory.per_stage]


def _megatron_split(args: list[str]) -> list[int]:
    """Decoder layers per pipeline rank, as megatron-core 0.16.1 builds them from the arguments."""
    import test_generate_oracles as oracles
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    config, _ = oracles.megatron_config(args)
    pp = config.pipeline_model_parallel_size
    layout = config.pipeline_model_parallel_layout
    if layout is not None:  # the transformer block asks parallel_state for the rank; the layout takes it
        return [layout.get_num_layers_to_build(pp_rank=r) for r in range(pp)]
    return [get_num_layers_to_build(config, pp_rank=r) for r in range(pp)]


# --- DeepSpeed: the real PipelineModule -------------------------------------------------------------


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from dist import run_ranks

    root = tmp_path_factory.mktemp("stage-split")
    _write_configs(root)
    run_ranks(Path(__file__), str(root), world_size=WORLD, timeout=400)
    ranks = [json.loads((root / f"rank{r}.json").read_text()) for r in range(WORLD)]
    return root, ranks


@pytest.mark.distributed
@pytest.mark.parametrize("name, pp", [(name, pp) for name, _, pp in CASES])
def test_estimator_prices_the_stages_deepspeed_builds(built, name, pp):
    root, ranks = built
    per_stage: dict[int, int] = {}
    layers_seen: dict[int, list[int]] = {}
    for rep in ranks:
        case = rep[name]
        assert per_stage.setdefault(case["stage"], case["decoders"]) == case["decoders"]  # same on every dp rank
        layers_seen[case["stage"]] = case["layer_idx"]
    real = [per_stage[s] for s in range(pp)]
    spec = get_model(str(root / name))
    assert sum(real) == spec.num_layers
    assert [i for s in range(pp) for i in layers_seen[s]] == list(range(spec.num_layers))  # contiguous, in order
    assert _estimated_split(spec, pp, seq_len=SEQ) == real, (name, real)


@pytest.mark.distributed
def test_the_real_splits_are_uneven_where_the_even_split_would_be_wrong(built):
    """The check can fail: with a large vocabulary the engine gives the last stage fewer layers
    than an even split, remainder first, would (8 layers on 4 stages are not 2 each)."""
    _, ranks = built
    real = {}
    for rep in ranks:
        case = rep["llama-8-pp4-vocab4096"]
        real[case["stage"]] = case["decoders"]
    split = [real[s] for s in range(4)]
    assert split != [2, 2, 2, 2] and split[-1] < max(split)


@pytest.mark.parametrize("slug", ["gpt2", "opt-125m", "pythia-70m", "qwen3-0.6b", "gemma-2b", "phi-3-mini",
                                  "falcon-7b", "mixtral-8x7b"])
def test_estimator_split_is_to_pipelines_for_every_family(slug):
    """``to_pipeline``'s cut of the real HF model (meta tensors: the same partition code the ranks
    above run, on transformers' own parameter counts) is the estimator's, catalog family by family."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from dstk.estimate import _model_facts
    from dstk.pipeline import plan_for

    spec = get_model(slug)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**spec.hf_config))
    for pp in (3, 5):
        _, stages, _ = plan_for(model, num_stages=pp, seq_len=2048)
        real = [sum(1 for n in st.layer_names if n.startswith("layer.")) for st in stages]
        assert stage_layers(spec.num_layers, pp, facts=_model_facts(spec), seq_len=2048) == real, (slug, pp)


# --- Megatron: the arguments dstk writes, parsed by megatron-core ------------------------------------

SPLITS = [(30, 4), (13, 5), (12, 8), (7, 2), (10, 3), (81, 8), (32, 4)]


def _dims(spec: ModelSpec) -> ModelDims:
    return ModelDims(num_layers=spec.num_layers, hidden_size=spec.hidden_size, num_heads=spec.num_heads,
                     num_kv_heads=spec.num_kv_heads, ffn_hidden_size=spec.ffn_hidden_size,
                     vocab_size=spec.vocab_size)


@pytest.mark.parametrize("layers, pp", SPLITS)
@pytest.mark.parametrize("vocab", [32000, 256000])
def test_megatron_args_build_the_split_the_deepspeed_plan_priced(layers, pp, vocab):
    from dstk.intent import TrainingIntent

    spec = ModelSpec.generic(num_layers=layers, hidden_size=1024, num_heads=16, vocab_size=vocab)
    split = _estimated_split(spec, pp, seq_len=2048, gpu="h100-sxm")
    layout = Layout(dp=1, pp=pp, grad_accum=4 * pp)
    args = megatron_args(layout=layout, training=TrainingIntent(seq_len=2048), model=_dims(spec), split=tuple(split))
    assert _megatron_split(args) == split


@pytest.mark.parametrize("layers, pp", SPLITS)
def test_megatron_engine_estimate_prices_what_megatron_builds(layers, pp):
    from dstk.intent import TrainingIntent

    spec = ModelSpec.generic(num_layers=layers, hidden_size=1024, num_heads=16, vocab_size=32000)
    layout = Layout(dp=1, pp=pp, grad_accum=4 * pp)
    split = _estimated_split(spec, pp, seq_len=2048, engine="megatron", layout=layout, gpu="h100-sxm")
    args = megatron_args(layout=layout, training=TrainingIntent(seq_len=2048), model=_dims(spec))
    assert _megatron_split(args) == split


def test_megatron_core_refuses_what_the_layout_text_must_not_say():
    """The oracle can fail: a layout one layer short is refused by megatron-core."""
    from dstk.intent import TrainingIntent

    spec = ModelSpec.generic(num_layers=12, hidden_size=1024, num_heads=16, vocab_size=256000)
    layout = Layout(dp=1, pp=8, grad_accum=32)
    args = megatron_args(layout=layout, training=TrainingIntent(seq_len=2048), model=_dims(spec),
                         split=(1, 1, 1, 2, 2, 2, 2, 1))
    assert "--pipeline-model-parallel-layout Et|t|t|tt|tt|tt|tt|tL" in args
    with pytest.raises(AssertionError):
        _megatron_split([a.replace("|tL", "|L") for a in args])
    with pytest.raises(ValueError, match="^split:"):
        megatron_args(layout=layout, training=TrainingIntent(seq_len=2048), model=_dims(spec), split=(2,) * 8)


def test_stage_layers_follows_the_engine_without_a_model():
    """A bare parameter count has no layers to weigh: an even split, the remainder first; Megatron
    without first/last stages gets the split its arguments say."""
    assert stage_layers(30, 4) == [8, 8, 7, 7]
    assert stage_layers(30, 4, engine="megatron") == [7, 8, 8, 7]
    assert stage_layers(30, 4, layout=Layout(dp=1, pp=4, first_stage_layers=6)) == [6, 8, 8, 8]


# --- dstk generate: plan.json and megatron.args of one run directory ---------------------------------


@pytest.mark.parametrize("pp", [5, 8])
def test_generated_run_dir_prices_and_renders_the_engine_split(tmp_path, capsys, pp):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from dstk.pipeline import plan_for

    out = tmp_path / "run"
    assert main(["generate", "--model", "gpt2", "--gpus", str(pp), "--pp", str(pp), "--seq-len", "1024",
                 "--global-batch", str(8 * pp), "--output", str(out)]) == 0
    plan = json.loads((out / "plan.json").read_text())
    priced = [s["num_layers"] for s in plan["memory"]["per_stage"]]
    # The cut to_pipeline makes for the real HF GPT-2 at the plan's sequence length.
    spec = get_model("gpt2")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**spec.hf_config))
    _, stages, _ = plan_for(model, num_stages=pp, seq_len=1024)
    real = [sum(1 for n in st.layer_names if n.startswith("layer.")) for st in stages]
    assert priced == real and len(set(real)) > 1  # 12 layers on 5 or 8 stages: uneven
    text = (out / "megatron.args").read_text()
    assert _megatron_split(text.strip().splitlines()) == real
    argv = read_megatron_args(text)  # what $(cat megatron.args) hands pretrain_gpt.py: one word per value
    if "--pipeline-model-parallel-layout" in argv:
        value = argv[argv.index("--pipeline-model-parallel-layout") + 1]
        assert value.count("|") == pp - 1 and "*" not in value
    readme = (out / "README.md").read_text()
    assert f"decoder layers {real} per stage" in readme and "seq_len=1024" in readme
    capsys.readouterr()
    assert main(["explain", str(out)]) == 0
    assert f"Stage balance: layers {real}" in capsys.readouterr().out


def test_generated_stage_memory_is_the_memory_of_that_split(tmp_path):
    """plan.json's per-stage memory equals an estimate pinned to the engine's split (as Megatron's
    first/last stages) and differs from the even split's."""
    out = tmp_path / "run"
    # ZeRO-0 pinned: the estimate below uses DeepSpeed's default buckets, which a ZeRO-1 plan tunes.
    assert main(["generate", "--model", "gpt2", "--gpus", "5", "--pp", "5", "--zero", "0", "--seq-len", "1024",
                 "--global-batch", "40", "--output", str(out)]) == 0
    plan = json.loads((out / "plan.json").read_text())
    priced = [s["num_layers"] for s in plan["memory"]["per_stage"]]
    assert len(set(priced[1:-1])) == 1  # expressible as first/last stages
    layout = Layout.from_dict(plan["layout"])
    spec = get_model("gpt2")
    cluster = Cluster(num_nodes=1, gpus_per_node=5, gpu=get_gpu(plan["cluster"]["gpu"]))
    training = Training(**{k: plan["training"][k] for k in ("seq_len", "global_batch", "precision", "optimizer",
                                                              "attention")})
    import dataclasses

    def per_stage(first: int, last: int) -> list[int]:
        pinned = dataclasses.replace(layout, first_stage_layers=first, last_stage_layers=last)
        est = estimate(model=spec, layout=pinned, training=training, cluster=cluster)
        return [s.total_bytes for s in est.memory.per_stage]

    assert [s["total_bytes"] for s in plan["memory"]["per_stage"]] == per_stage(priced[0], priced[-1])
    assert priced != [3, 2, 2, 2, 3]  # another split Megatron can express: other stage memory
    assert per_stage(3, 3) != [s["total_bytes"] for s in plan["memory"]["per_stage"]]
