"""The finding codes of ``dstk validate``: severity and what each means, one line each.

This table is the one place the text lives: docs/validate.md's codes table repeats it word for word
(tests/test_validate_cli.py checks that), and ``--format sarif`` turns it into the SARIF rules.
"""

from __future__ import annotations

CODES: dict[str, tuple[str, str]] = {
    'DS001': ('error', 'not parseable as JSON or hjson'),
    'DS002': ('error', 'empty file'),
    'DS003': ('error', 'top level is not an object (array, string, ...)'),
    'DS004': ('error', 'binary or not UTF-8'),
    'DS005': ('error', 'file over 8 MiB'),
    'DS006': ('error', 'nested deeper than 64 levels'),
    'DS007': ('error', 'duplicate key (DeepSpeed rejects the file; json.load keeps the last)'),
    'DS008': ('warning', 'hjson-only syntax (HF/accelerate read the file with json.load)'),
    'DS009': ('error', "`NaN`, `Infinity`, a number too large for a float (`1e400`) or an integer of more than 4300 digits (DeepSpeed's reader rejects them)"),
    'DS010': ('warning', "the DeepSpeed release asked for has no shipped schema (0.14-0.19): the nearest one is used"),
    'DS101': ('error', 'unknown key, at any level (did-you-mean, or the section it belongs to); unknown optimizer/scheduler parameter'),
    'DS102': ('error', 'wrong type (`"1e-3"` for a learning rate, `"true"` for a bool, a Python-only field)'),
    'DS103': ('error', 'value not in the allowed set (did-you-mean)'),
    'DS104': ('error', 'value out of range'),
    'DS105': ('error', 'key removed in DeepSpeed 0.19.8 (`elasticity`, `amp`, `sparse_attention`, `mics_shard_size`, ...)'),
    'DS106': ('warning', 'deprecated key or legacy form (`cpu_offload`, `bfloat16`, `"zero_optimization": true`)'),
    'DS107': ('error', '`"auto"` without `--hf`'),
    'DS108': ('error/warning', '`"auto"` that HF\'s Trainer does not fill'),
    'DS109': ('warning', '`"auto"` that only accelerate\'s plugin fills'),
    'DS110': ('error', 'required parameter missing (e.g. `total_num_steps` of WarmupDecayLR)'),
    'DS111': ('error/warning', 'a `_comment`-style key: a warning where DeepSpeed ignores unknown keys, an error in pydantic sections and optimizer/scheduler params, which reject it'),
    'DS199': ('error', 'other schema violation'),
    'DS201': ('error', 'batch triad does not match the data-parallel size (arithmetic and nearest valid choices)'),
    'DS202': ('error', 'neither `train_batch_size` nor `train_micro_batch_size_per_gpu`'),
    'DS203': ('error', 'world size not divisible by TP x PP'),
    'DS204': ('error', 'fp16 and bf16 both enabled'),
    'DS205': ('error', 'offload device vs ZeRO stage (param offload below stage 3 is ignored; optimizer offload at stage 0; nvme at stage 1/2 is CPU)'),
    'DS206': ('error', 'nvme offload without `nvme_path`'),
    'DS207': ('error', 'ZeRO-2/3 with pipeline stages'),
    'DS208': ('error', '`autotp_size` does not divide the world size, or disagrees with `--tensor-parallel`'),
    'DS209': ('error', "optimizer that is neither DeepSpeed's nor `torch.optim`'s (torch names are case-sensitive)"),
    'DS211': ('error', 'scheduler not in `deepspeed.runtime.lr_schedules` or `torch.optim.lr_scheduler`'),
    'DS213': ('error', '`max_grad_norm` in optimizer params (use `gradient_clipping`)'),
    'DS214': ('error', '`compute_grad_norm: false` outside stage 1/2, with clipping, or with offload'),
    'DS215': ('error', 'master weights / bf16 optimizer states without ZeRO 1-3'),
    'DS216': ('error', '`offload_optimizer.ratio < 1` without ZeRO-3'),
    'DS217': ('error', '`gradient_allreduce_op: "sum"` with ZeRO-3'),
    'DS218': ('warning', '`comms_logger` present but not enabled (DeepSpeed logs anyway)'),
    'DS219': ('error', 'torch optimizer ZeRO was not tested with, without `zero_allow_untested_optimizer`'),
    'DS220': ('error', '`data_types.param_dtype` disagrees with fp16/bf16'),
    'DS221': ('error', 'fp16 dynamic loss-scale window or minimum not positive'),
    'DS222': ('error', 'curriculum learning without `curriculum_metrics`, dynamic batching without `max_tokens`'),
    'DS225': ('error', 'Lamb with static fp16 loss scaling'),
    'DS226': ('error', 'both `bf16` and `bfloat16` (the legacy block is ignored)'),
    'DS228': ('error', '`tensor_parallel.tp.tp_size` neither 1 nor `autotp_size`'),
    'DS230': ('error', '`managed_gradient_accumulation: false` with the pipeline or overlap_comm outside stage 2'),
    'DS231': ('warning', '`pipeline.stages/partition/seed_layers`: never read from the config (PipelineModule arguments)'),
    'DS233': ('error', '`train_batch_size` under AutoTP (initialize checks it against all ranks, not the DP ranks)'),
    'DS234': ('warning', '`aio.use_gds` (asserts a CUDA accelerator at parse time)'),
    'DS235': ('error', '`data_types.grad_accum_dtype` other than the model dtype without ZeRO (initialize raises)'),
    'DS240': ('error', 'an explicit value disagrees with `--training-args` (the Trainer\'s mismatch error at `deepspeed.initialize`)'),
    'DS241': ('warning', '`optimizer` / `scheduler` block replaces `--training-args`\' `optim` / `lr_scheduler_type`'),
    'DS242': ('warning', '`--hf --deepspeed`: an `"auto"` the Trainer fills from something not given (a training argument, the world size, the model\'s hidden size), so DeepSpeed checked the file without it'),
    'DS250': ('error/warning', 'precision the `--gpu` lacks: bf16 on a GPU without bf16 (V100), fp16 on CPU ranks'),
    'DS301': ('error', "DeepSpeed's own parser (`--deepspeed`) rejects the file"),
}
"""code -> (severity: "error", "warning" or "error/warning", description in Markdown)."""

DOCS_URL = "docs/validate.md#finding-codes"
"""Where the codes are documented, relative to the repository root."""


def is_code(text: str) -> bool:
    return text in CODES
