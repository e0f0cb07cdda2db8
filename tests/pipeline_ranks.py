"""One rank of the pipeline checks (started by tests/test_pipeline_dist.py through tests/dist.py).

Every family is checked in the same process, one after another, so DeepSpeed starts once per
pipeline size: ``pp1`` (1 rank: pp=1 checks and the reference runs of DeepSpeed on the unwrapped
HF model at dp=1), ``pp2`` (2 ranks), ``pp4`` (4 ranks). Each rank writes what it measured to
``OUT/<mode>-rank<r>.json``; the test compares.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path

import deepspeed
import torch
import transformers as tf

deepspeed.init_distributed(dist_backend="gloo")
import deepspeed.comm as dist  # noqa: E402

from dstk.errors import DstkError  # noqa: E402
from dstk.pipeline import export_hf, pipeline_from_pretrained, to_pipeline  # noqa: E402

VOCAB, SEQ, MICRO, GAS, STEPS = 128, 8, 2, 2, 5
COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=64)


def config(family: str, num_layers: int):
    """Tiny random configs; dropout off so that runs are comparable step by step."""
    if family == "llama":
        return tf.LlamaConfig(**COMMON, num_hidden_layers=num_layers)
    if family == "mistral":  # a window shorter than the sequence: the sliding mask matters
        return tf.MistralConfig(**COMMON, num_hidden_layers=num_layers, sliding_window=4)
    if family == "qwen2":  # layer 0 full attention, layer 1 sliding: per-layer masks
        return tf.Qwen2Config(**COMMON, num_hidden_layers=num_layers, use_sliding_window=True, sliding_window=4,
                              max_window_layers=1)
    if family == "qwen3":
        return tf.Qwen3Config(**COMMON, num_hidden_layers=num_layers, head_dim=8)
    if family == "gemma":  # tied, scaled embedding
        return tf.GemmaConfig(**COMMON, num_hidden_layers=num_layers, head_dim=8)
    if family == "gpt2":  # tied, learned positions, Conv1D
        return tf.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=num_layers, n_head=4, n_positions=64,
                             resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    if family == "gpt_neox":  # partial rotary, parallel residual, lm_head saved as embed_out
        return tf.GPTNeoXConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=num_layers,
                                num_attention_heads=4, max_position_embeddings=64, rotary_pct=0.5,
                                hidden_dropout=0.0, attention_dropout=0.0)
    if family == "opt":  # tied, positions over real tokens only, project_in/out
        return tf.OPTConfig(vocab_size=VOCAB, hidden_size=32, ffn_dim=64, num_hidden_layers=num_layers,
                            num_attention_heads=4, max_position_embeddings=64, word_embed_proj_dim=16,
                            dropout=0.0, attention_dropout=0.0, layerdrop=0.0)
    if family == "phi3":  # no adapter in its family file: found by the generic Llama-like discovery
        return tf.Phi3Config(**COMMON, num_hidden_layers=num_layers, pad_token_id=0)
    if family == "mixtral":  # mixture of experts, generic discovery
        return tf.MixtralConfig(**COMMON, num_hidden_layers=num_layers, num_local_experts=4, num_experts_per_tok=2)
    if family == "gemma2":  # logit soft-capping after the head, eager attention, generic discovery
        return tf.Gemma2Config(**COMMON, num_hidden_layers=num_layers, head_dim=8, attn_implementation="eager")
    raise ValueError(family)


def make_model(family: str, num_layers: int):
    torch.manual_seed(1234)
    return tf.AutoModelForCausalLM.from_config(config(family, num_layers), dtype=torch.float32).eval()


def batches(n: int, *, padded: bool, seed: int = 0):
    """``n`` micro-batches ``((ids, mask), labels)``; padded ones are left-padded with -100 labels."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(0, VOCAB, (MICRO, SEQ), generator=g)
        mask = torch.ones_like(ids)
        if padded:
            mask[0, :3] = 0
            mask[1, :1] = 0
        labels = ids.masked_fill(mask == 0, -100)
        out.append(((ids, mask), labels))
    return out


def ds_config(lr: float, optimizer: str = "SGD") -> dict:
    params = {"lr": lr} if optimizer == "SGD" else {"lr": lr, "torch_adam": True, "weight_decay": 0.01}
    return {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": GAS, "gradient_clipping": 0.0,
            "optimizer": {"type": optimizer, "params": params}, "steps_per_print": 10**9}


def engine_for(pipe, cfg):
    engine, *_ = deepspeed.initialize(model=pipe, config=cfg, model_parameters=[p for p in pipe.parameters()])
    return engine


def hf_params(pipe, model) -> dict[str, torch.Tensor]:
    """This rank's pipeline parameters under their HF names (the model the pipe wraps shares them)."""
    by_id = {id(p): name for name, p in model.named_parameters(remove_duplicate=False)}
    out = {}
    for p in pipe.parameters():
        out.setdefault(by_id[id(p)], p)
    return out


def check_family(family: str, pp: int, result: dict, work: Path) -> None:
    num_layers = 4 if family in ("llama", "gpt2") else 2
    model = make_model(family, num_layers)
    ref = copy.deepcopy(model)
    pipe = to_pipeline(model, num_stages=pp, partition="uniform" if pp == 4 else "balanced")
    result["stages"] = [[list(s.layer_names), s.num_params, s.load] for s in pipe.dstk_stages]
    lr = 1000.0  # large, so that (before - after) / lr is the gradient to fp32 precision
    engine = engine_for(pipe, ds_config(lr))

    # 1. losses equal HF's, with and without padding (eval_batch: no step)
    for padded in (False, True):
        data = batches(GAS, padded=padded, seed=1)
        loss = engine.eval_batch(iter(data), num_micro_batches=GAS).item()
        with torch.no_grad():
            ref_loss = sum(ref(input_ids=i, attention_mask=m, labels=lab).loss.item() for (i, m), lab in data) / GAS
        result[f"loss_padded={padded}"] = [loss, ref_loss]

    # 2. gradient of every parameter: one SGD step, (before - after) / lr vs HF's gradient
    data = batches(GAS, padded=True, seed=2)
    before = {n: p.detach().clone() for n, p in hf_params(pipe, model).items()}
    engine.train_batch(iter(data))
    ref.zero_grad()
    for (i, m), lab in data:
        (ref(input_ids=i, attention_mask=m, labels=lab).loss / GAS).backward()
    ref_grads = dict(ref.named_parameters(remove_duplicate=False))
    worst = 0.0
    for name, p in hf_params(pipe, model).items():
        g = (before[name] - p.detach()) / lr
        rg = ref_grads[name].grad
        worst = max(worst, ((g - rg).abs().max() / (rg.abs().max() + 1e-12)).item())
    result["grad_rel_err"] = worst
    result["num_params_checked"] = len(before)
    result["num_hf_params"] = len(dict(model.named_parameters()))

    # 3. tied weights identical across first and last stage after steps
    if pipe.tied_comms:
        w = pipe.tied_modules["embed"].tokens.weight.detach().clone()
        first = w.clone()
        dist.broadcast(first, src=min(pipe.tied_comms["embed"]["ranks"]), group=pipe.tied_comms["embed"]["group"])
        result["tied_max_diff"] = (first - w).abs().max().item()

    # 4. five AdamW steps from the same start as the dp=1 reference run
    fresh = make_model(family, num_layers)
    pipe2 = to_pipeline(fresh, num_stages=pp, partition="uniform" if pp == 4 else "balanced")
    engine2 = engine_for(pipe2, ds_config(1e-2, "AdamW"))
    result["train_losses"] = [engine2.train_batch(iter(batches(GAS, padded=True, seed=10 + s))).item()
                              for s in range(STEPS)]

    # 5. the same steps with every decoder layer checkpointed (recomputed in backward)
    if family in ("llama", "gpt2"):
        pipe3 = to_pipeline(make_model(family, num_layers), num_stages=pp,
                            partition="uniform" if pp == 4 else "balanced", activation_checkpoint_interval=1)
        engine3 = engine_for(pipe3, ds_config(1e-2, "AdamW"))
        calls = []
        inner = pipe3.activation_checkpoint_func

        def counting(*args, **kwargs):
            calls.append(1)
            return inner(*args, **kwargs)

        pipe3.activation_checkpoint_func = counting
        result["train_losses_checkpointed"] = [
            engine3.train_batch(iter(batches(GAS, padded=True, seed=10 + s))).item() for s in range(STEPS)]
        result["checkpoint_calls"] = len(calls)


def check_dp(family: str, result: dict) -> None:
    """pp=2 x dp=2 on 4 ranks: the loss train_batch reports and every parameter's update equal
    HF's on all four micro-batches (DeepSpeed averages over data-parallel ranks)."""
    model = make_model(family, 4)
    ref = copy.deepcopy(model)
    pipe = to_pipeline(model, num_stages=2)
    lr = 1000.0
    engine = engine_for(pipe, ds_config(lr))
    dp_rank, dp_size = pipe._grid.data_parallel_id, pipe._grid.data_parallel_size
    data = {d: batches(GAS, padded=True, seed=20 + d) for d in range(dp_size)}
    before = {n: p.detach().clone() for n, p in hf_params(pipe, model).items()}
    loss = engine.train_batch(iter(data[dp_rank])).item()
    ref.zero_grad()
    ref_loss = 0.0
    for d in range(dp_size):
        for (i, m), lab in data[d]:
            step = ref(input_ids=i, attention_mask=m, labels=lab).loss / (GAS * dp_size)
            step.backward()
            ref_loss += step.item()
    grads = dict(ref.named_parameters(remove_duplicate=False))
    result["dp_loss"] = [loss, ref_loss]
    result["dp_grad_rel_err"] = max(
        (((before[n] - p.detach()) / lr - grads[n].grad).abs().max() / (grads[n].grad.abs().max() + 1e-12)).item()
        for n, p in hf_params(pipe, model).items())


def reference_losses(family: str) -> list[float]:
    """DeepSpeed on the unwrapped HF model, dp=1, the same data and optimizer."""
    num_layers = 4 if family in ("llama", "gpt2") else 2
    model = make_model(family, num_layers).train()
    engine, *_ = deepspeed.initialize(model=model, config=ds_config(1e-2, "AdamW"), model_parameters=model.parameters())
    losses = []
    for s in range(STEPS):
        total = 0.0
        for (i, m), lab in batches(GAS, padded=True, seed=10 + s):
            loss = engine(input_ids=i, attention_mask=m, labels=lab).loss
            engine.backward(loss)
            engine.step()
            total += loss.item()
        losses.append(total / GAS)
    return losses


def zero_export(family: str, stage: int, work: Path, result: dict) -> None:
    """A ZeRO checkpoint of the unwrapped model -> export_hf -> from_pretrained: same logits."""
    model = make_model(family, 4 if family in ("llama", "gpt2") else 2).train()
    cfg = ds_config(1e-2, "AdamW") | {"zero_optimization": {"stage": stage}}
    engine, *_ = deepspeed.initialize(model=model, config=cfg, model_parameters=model.parameters())
    for (i, m), lab in batches(GAS, padded=True, seed=5):
        engine.backward(engine(input_ids=i, attention_mask=m, labels=lab).loss)
        engine.step()
    ckpt = work / f"{family}-zero{stage}"
    engine.save_checkpoint(str(ckpt))
    model.config.save_pretrained(ckpt)  # export_hf finds the architecture beside the checkpoint
    out = work / f"{family}-zero{stage}-export"
    export_hf(ckpt, out)
    back = tf.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    (ids, mask), _ = batches(1, padded=False, seed=6)[0]
    engine.eval()
    with torch.no_grad():  # under ZeRO-3 the engine gathers the partitioned weights for its forward
        result[f"zero{stage}_export_logits_max_diff"] = (back(input_ids=ids).logits - engine(input_ids=ids).logits
                                                        ).abs().max().item()


def dynamic_shapes(family: str, pp: int, result: dict) -> None:
    """Micro-batches of different lengths need ``dynamic_shape=True``; then losses match HF."""
    model = make_model(family, 4)
    pipe = to_pipeline(copy.deepcopy(model), num_stages=pp, dynamic_shape=True)
    engine = engine_for(pipe, ds_config(0.0))
    g = torch.Generator().manual_seed(8)
    data = []
    for seq in (8, 5):
        ids = torch.randint(0, VOCAB, (MICRO, seq), generator=g)
        data.append(((ids, torch.ones_like(ids)), ids))
    loss = engine.eval_batch(iter(data), num_micro_batches=2).item()
    with torch.no_grad():
        ref = sum(model(input_ids=i, attention_mask=m, labels=lab).loss.item() for (i, m), lab in data) / 2
    result["dynamic_shape_losses"] = [loss, ref]


def roundtrip(family: str, pp: int, work: Path, result: dict) -> None:
    """HF dir -> pipeline (each rank reads its stage) -> 1 step -> pipeline checkpoint -> export ->
    from_pretrained: logits equal the pipeline's."""
    num_layers = 4 if family in ("llama", "gpt2") else 2
    src = work / f"{family}-hf"
    if dist.get_rank() == 0:
        # sharded, so that stages can read different files
        make_model(family, num_layers).save_pretrained(src, max_shard_size="20KB")
    dist.barrier()
    if family == "mixtral":  # its checkpoint names differ from the modules' (fused experts)
        try:
            pipeline_from_pretrained(src, num_stages=pp)
        except DstkError as exc:
            result["from_pretrained_error"] = exc.message
        pipe = to_pipeline(tf.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32), num_stages=pp)
        pipe.dstk_tensors_read, pipe.dstk_files_read = [], []
    else:
        pipe = pipeline_from_pretrained(src, num_stages=pp)
    result["tensors_read"] = sorted(pipe.dstk_tensors_read)
    result["files_read"] = pipe.dstk_files_read
    result["num_files"] = len(list(src.glob("*.safetensors")))
    engine = engine_for(pipe, ds_config(0.5))
    engine.train_batch(iter(batches(GAS, padded=True, seed=3)))
    ckpt = work / f"{family}-ckpt"
    engine.save_checkpoint(str(ckpt), tag="step1")
    data = batches(1, padded=True, seed=4)
    _, logits = engine.eval_batch(iter(data), return_logits=True, num_micro_batches=1)
    dist.barrier()
    out = work / f"{family}-export"
    if dist.get_rank() == 0:  # save_pretrained writes only on rank 0
        export_hf(ckpt, out, config=src)
    dist.barrier()
    if pipe.stage_id == pp - 1:  # the last stage has the pipeline's logits
        back = tf.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
        (ids, mask), _ = data[0]
        with torch.no_grad():
            hf_logits = back(input_ids=ids, attention_mask=mask).logits
        keep = mask.bool()
        result["export_logits_max_diff"] = (hf_logits[keep] - logits[keep]).abs().max().item()
        result["export_files"] = sorted(p.name for p in out.iterdir())
    dist.barrier()


def main() -> None:
    mode, out_dir = sys.argv[1], Path(sys.argv[2])
    families = sys.argv[3].split(",")
    work = out_dir / "work"
    work.mkdir(parents=True, exist_ok=True)
    rank = dist.get_rank()
    results: dict = {}
    pp = {"pp1": 1, "pp2": 2, "pp4": 4}[mode]
    for family in families:
        r: dict = {}
        check_family(family, pp, r, work)
        if mode == "pp1":
            r["reference_losses"] = reference_losses(family)
            if family in ("llama", "gpt2"):
                zero_export(family, 1, work, r)
            if family == "llama":
                zero_export(family, 3, work, r)
        if mode == "pp4":
            check_dp(family, r)
        if mode == "pp2":
            roundtrip(family, pp, work, r)
            if family == "llama":
                dynamic_shapes(family, pp, r)
        results[family] = r
    (out_dir / f"{mode}-rank{rank}.json").write_text(json.dumps(results, indent=1))
    from dstk.launch.rank import exit_rank

    exit_rank()


if __name__ == "__main__":
    main()
