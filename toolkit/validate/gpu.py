"""``dstk validate --gpu SLUG``: the precision a config asks for against what the GPU has.

DeepSpeed checks precision only at ``deepspeed.initialize`` (``runtime/engine.py`` ``_do_sanity_check``,
0.19.8 lines 2003-2007: "Type fp16/bf16 is not supported on your device"), on the training machine, after
the job queued and loaded the model. And on a V100 it does not even stop there: the CUDA accelerator asks
``torch.cuda.is_bf16_supported()`` (``accelerator/cuda_accelerator.py:204``), whose default
``including_emulation=True`` answers yes on any GPU that can hold a bf16 tensor (torch ``cuda/__init__.py``
``is_bf16_supported``). A V100 has no bf16 tensor cores (NVIDIA V100 datasheet: fp16 tensor cores only),
so the run starts and its matmuls are emulated, slower than fp32, and bf16-only kernels (FlashAttention 2)
refuse the GPU. On CPU ranks, DeepSpeed's CPU accelerator reports fp16 only where oneDNN has fp16
(``accelerator/cpu_accelerator.py:228``: AVX512-FP16 / AMX-FP16 CPUs), so elsewhere initialize fails.

The catalog (``dstk.hardware``: no torch) says which GPU has what: ``bf16_flops is None`` means no bf16.
"""

from __future__ import annotations

from dstk.findings import Finding


def resolve_gpu(slug: str, *, where: str = "--gpu"):
    """The catalog entry for ``slug``; a unique prefix is enough (``v100`` is ``v100-32gb``).
    An unknown or ambiguous slug is a usage error that lists the choices."""
    from dstk.errors import UsageError
    from dstk.hardware import GPUS

    key = slug.strip().lower()
    if key in GPUS:
        return GPUS[key]
    matches = [s for s in GPUS if s.startswith(key)] if key else []
    if len(matches) == 1:
        return GPUS[matches[0]]
    known = ", ".join(GPUS)
    if matches:
        raise UsageError(f"{where} {slug}: more than one GPU starts so ({', '.join(matches)})",
                         hint=f"name one of them (`dstk gpus` lists the catalog: {known})")
    raise UsageError(f"{where} {slug}: not a GPU of the catalog", hint=f"one of {known} (`dstk gpus` lists them)")


def _enabled(config: dict, section: str) -> bool:
    block = config.get(section)
    return isinstance(block, dict) and block.get("enabled") is True


def gpu_findings(config: dict, *, gpu, training_args: dict | None = None) -> list[Finding]:
    """DS250 for each precision setting ``gpu`` (a ``dstk.hardware.GPU``) cannot run: bf16 (the ``bf16``
    block, its legacy ``bfloat16`` name, ``torch_autocast`` with a bfloat16 dtype) on a GPU without bf16 is
    an error; fp16 on CPU ranks a warning (it depends on the CPU). An ``"auto"`` ``enabled`` counts when
    ``training_args`` (``--training-args``) turn it on, as the Trainer would fill it."""
    if not isinstance(config, dict):
        return []
    args = training_args or {}
    findings = []
    if gpu.bf16_flops is None:
        for section in ("bf16", "bfloat16"):
            block = config.get(section)
            auto_on = isinstance(block, dict) and block.get("enabled") == "auto" and \
                bool(args.get("bf16") or args.get("bf16_full_eval"))
            if _enabled(config, section) or auto_on:
                why = " (the training arguments' bf16 fills the \"auto\")" if auto_on else ""
                findings.append(Finding(
                    severity="error", code="DS250", pointer=f"/{section}/enabled",
                    message=f"bf16 on {gpu.name}{why}, which has no bf16 tensor cores: DeepSpeed does not stop it "
                            "(torch emulates bf16 there), so the matmuls run without tensor cores, at fp32 speed at "
                            f"best ({gpu.fp32_flops / 1e12:.3g} TFLOP/s against {gpu.fp16_flops / 1e12:.3g} in fp16)",
                    hint='train in fp16: "fp16": {"enabled": true} (with its dynamic loss scaling) and remove '
                         f'"{section}"' + (", and set fp16 instead of bf16 in the training arguments" if auto_on
                                           else "")))
        autocast = config.get("torch_autocast")
        if isinstance(autocast, dict) and autocast.get("enabled") is True and \
                str(autocast.get("dtype", "bfloat16")).removeprefix("torch.") in ("bfloat16", "bf16"):
            findings.append(Finding(
                severity="error", code="DS250", pointer="/torch_autocast/dtype",
                message=f"torch_autocast in bfloat16 (its default dtype) on {gpu.name}, which has no bf16 "
                        "tensor cores: the autocast matmuls run emulated",
                hint='set "dtype": "torch.float16" in torch_autocast'))
    if gpu.is_cpu:
        block = config.get("fp16")
        auto_on = isinstance(block, dict) and block.get("enabled") == "auto" and \
            bool(args.get("fp16") or args.get("fp16_full_eval"))
        if _enabled(config, "fp16") or auto_on:
            findings.append(Finding(
                severity="warning", code="DS250", pointer="/fp16/enabled",
                message="fp16 on CPU ranks: DeepSpeed's CPU accelerator has fp16 only where oneDNN does "
                        "(AVX512-FP16 / AMX-FP16 CPUs); elsewhere initialize stops with \"Type fp16 is not "
                        "supported on your device\"",
                hint='train in bf16 ("bf16": {"enabled": true}) or fp32 on CPU ranks'))
    return findings
