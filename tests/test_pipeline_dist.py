"""HF models as DeepSpeed pipelines, checked against the HF models themselves on the real
pipeline engine (gloo, CPU ranks). Each pipeline size starts its ranks once and checks every
family (tests/pipeline_ranks.py); the tests below read what the ranks measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dist import run_ranks

pytestmark = pytest.mark.distributed

SCRIPT = Path(__file__).with_name("pipeline_ranks.py")
# the last three have no adapter in their family file: the generic Llama-like discovery finds them
FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "gemma", "gpt2", "gpt_neox", "opt", "phi3", "mixtral", "gemma2"]
PP4_FAMILIES = ["llama", "gpt2"]
TIED = {"gemma", "gpt2", "opt", "gemma2"}
LOSS_RTOL = 1e-5
OUT_DIRS: dict[str, Path] = {}


def _run(tmp_path_factory, mode: str, world_size: int, families: list[str]) -> list[dict]:
    out = tmp_path_factory.mktemp(mode)
    run_ranks(SCRIPT, mode, str(out), ",".join(families), world_size=world_size, timeout=300)
    ranks = [json.loads((out / f"{mode}-rank{r}.json").read_text()) for r in range(world_size)]
    assert all(set(r) == set(families) for r in ranks), "a rank skipped a family"
    OUT_DIRS[mode] = out
    return ranks


@pytest.fixture(scope="module")
def pp1(tmp_path_factory):
    return _run(tmp_path_factory, "pp1", 1, FAMILIES)


@pytest.fixture(scope="module")
def pp2(tmp_path_factory):
    return _run(tmp_path_factory, "pp2", 2, FAMILIES)


@pytest.fixture(scope="module")
def pp4(tmp_path_factory):
    return _run(tmp_path_factory, "pp4", 4, PP4_FAMILIES)


def _rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


def _check_equal_to_hf(ranks: list[dict], family: str, num_stages: int) -> None:
    last = ranks[-1][family]
    for padded in (False, True):
        loss, ref = last[f"loss_padded={padded}"]
        assert _rel(loss, ref) <= LOSS_RTOL, f"{family} pp={num_stages} padded={padded}: {loss} vs HF {ref}"
    for r, result in enumerate(ranks):
        assert result[family]["grad_rel_err"] <= 1e-5, f"{family} pp={num_stages} rank {r} gradients differ"
        assert len(result[family]["stages"]) == num_stages
    # every parameter was compared somewhere (tied embeddings once per owning stage)
    assert sum(r[family]["num_params_checked"] for r in ranks) >= ranks[0][family]["num_hf_params"]
    if family in TIED and num_stages > 1:
        assert last["tied_max_diff"] == 0.0, "tied embedding differs between first and last stage"


@pytest.mark.parametrize("family", FAMILIES)
def test_pp1_loss_and_grads_equal_hf(pp1, family):
    _check_equal_to_hf(pp1, family, 1)


@pytest.mark.parametrize("family", FAMILIES)
def test_pp2_loss_and_grads_equal_hf(pp2, family):
    _check_equal_to_hf(pp2, family, 2)


@pytest.mark.parametrize("family", PP4_FAMILIES)
def test_pp4_loss_and_grads_equal_hf(pp4, family):
    _check_equal_to_hf(pp4, family, 4)
    stages = pp4[0][family]["stages"]
    assert [sum(n.startswith("layer.") for n in names) for names, _, _ in stages] == [1, 1, 1, 1]


@pytest.mark.parametrize("family", PP4_FAMILIES)
def test_pp2_dp2_loss_and_updates_equal_hf(pp4, family):
    for r in pp4:
        loss, ref = r[family]["dp_loss"]
        assert _rel(loss, ref) <= LOSS_RTOL, (loss, ref)
        assert r[family]["dp_grad_rel_err"] <= 1e-5


@pytest.mark.parametrize("family", FAMILIES)
def test_pp2_training_matches_deepspeed_on_unwrapped_model(pp1, pp2, family):
    reference = pp1[0][family]["reference_losses"]
    for r in pp2:
        losses = r[family]["train_losses"]
        assert len(losses) == len(reference) == 5
        assert max(abs(a - b) for a, b in zip(losses, reference)) <= 1e-4, (losses, reference)


@pytest.mark.parametrize("family", PP4_FAMILIES)
def test_activation_checkpointing_gives_same_training(pp1, pp2, family):
    for ranks in (pp1, pp2):
        for r in ranks:
            res = r[family]
            assert res["checkpoint_calls"] > 0, "no block was checkpointed"
            assert max(abs(a - b) for a, b in zip(res["train_losses_checkpointed"], res["train_losses"])) <= 1e-6


@pytest.mark.parametrize("family", FAMILIES)
def test_load_train_export_reload(pp2, family):
    first, last = pp2[0][family], pp2[-1][family]
    assert last["export_logits_max_diff"] <= 1e-5
    assert "model.safetensors" in last["export_files"] and "config.json" in last["export_files"]
    if family == "mixtral":
        assert "converts their tensors" in first["from_pretrained_error"]
        return
    # each stage read only its own tensors: no tensor was read by both ranks, except the
    # embedding matrix that the last stage of a tied model shares
    both = set(first["tensors_read"]) & set(last["tensors_read"])
    assert len(both) == (1 if family in TIED else 0), both
    assert len(set(first["tensors_read"]) | set(last["tensors_read"])) >= 10
    assert len(first["files_read"]) < first["num_files"] and len(last["files_read"]) < last["num_files"]


@pytest.mark.parametrize(("family", "stage"), [("llama", 1), ("gpt2", 1), ("llama", 3)])
def test_zero_checkpoint_export(pp1, family, stage):
    assert pp1[0][family][f"zero{stage}_export_logits_max_diff"] <= 1e-6


def test_micro_batches_of_different_lengths_with_dynamic_shape(pp2):
    loss, ref = pp2[-1]["llama"]["dynamic_shape_losses"]
    assert _rel(loss, ref) <= LOSS_RTOL


@pytest.mark.parametrize("family", ["gpt_neox", "gpt2"])
def test_export_command_writes_what_the_library_writes(pp2, family, tmp_path, capsys):
    from safetensors.torch import load_file

    from dstk.cli import main

    work = OUT_DIRS["pp2"] / "work"
    out = tmp_path / "cli-export"
    code = main(["export", str(work / f"{family}-ckpt"), "--output", str(out), "--config", str(work / f"{family}-hf"),
                 "--format", "json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kind"] == "pipeline" and report["tag_dir"].endswith("step1")
    ours, library = load_file(out / "model.safetensors"), load_file(work / f"{family}-export" / "model.safetensors")
    assert sorted(ours) == sorted(library) and all((ours[k] == library[k]).all() for k in ours)
    if family == "gpt_neox":  # transformers' own checkpoint names, as the hub has them
        assert "embed_out.weight" in ours


MEMORY_CASES = [("llama", 0, "bf16"), ("llama", 1, "bf16"), ("gpt2", 1, "fp32")]  # (family, ZeRO stage, precision)


@pytest.mark.timeout(200)
def test_pp2_rank_holds_only_its_stage():
    """After ``to_pipeline(model)`` and ``del model``, each rank of a 2-stage run keeps alive only
    its stage's parameters and what DeepSpeed builds on them (tests/pipeline_memory_ranks.py):
    no ``nn.Parameter`` outside the engine's module, no storage the engine does not reach
    (a few bytes: the batch and one micro-batch's activations), and the module holds exactly
    the stage's parameter count."""
    from test_estimate_deepspeed import GPT2, LLAMA

    from dstk.estimate import rank_params
    from dstk.layout import Layout
    from dstk.models import family_module

    configs = {"llama": LLAMA, "gpt2": GPT2}
    cases = [{"config": configs[f], "stage": z, "precision": prec} for f, z, prec in MEMORY_CASES]
    ranks = run_ranks(Path(__file__).with_name("pipeline_memory_ranks.py"), json.dumps(cases), timeout=180)
    checked = 0
    for r in ranks:
        line = next(x for x in r.output.splitlines() if x.startswith("RESULT "))
        for (family, z, prec), got in zip(MEMORY_CASES, json.loads(line.split(" ", 2)[2])):
            spec = family_module(family).read(configs[family], name="t")
            where = f"{family} ZeRO-{z} {prec} stage {got['stage_id']}"
            assert got["stage_params"] == rank_params(spec, Layout(pp=2, zero_stage=z), stage=got["stage_id"]), where
            for point in ("init", "step"):
                assert got[f"{point}_foreign"] == 0, f"{where} {point}: parameters outside the engine are alive"
                stray = sum(got[f"{point}_unreached"])
                assert stray <= 0.01 * got[point], f"{where} {point}: {got[f'{point}_unreached']} not the engine's"
            checked += 1
    assert checked == 2 * len(MEMORY_CASES)
