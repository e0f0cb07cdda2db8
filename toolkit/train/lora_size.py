"""How many parameters LoRA adds to a model: pure arithmetic over a ``dstk.models.ModelSpec``
(no torch), for the estimator and the planner.

An adapted linear ``fan_in -> fan_out`` gets ``A: r x fan_in`` and ``B: fan_out x r``, so
``r * (fan_in + fan_out)`` parameters (Hu et al. 2021, section 4; peft's ``lora.Linear`` creates
exactly these two bias-free matrices). The shapes of each family's linear modules follow its
transformers module (the same tensors ``dstk.models.<family>`` counts):

- Llama-shaped (llama, mistral, qwen2, qwen3, gemma, generic; Mixtral's attention):
  ``q: h -> heads*d``, ``k, v: h -> kv*d``, ``o: heads*d -> h``, ``gate, up: h -> ffn``, ``down: ffn -> h``;
- fused QKV (phi3 ``qkv_proj``, gpt2 ``c_attn``, gpt_neox/bloom/falcon ``query_key_value``):
  ``h -> (heads + 2*kv)*d``; phi3's ``gate_up_proj``: ``h -> 2*ffn``;
- two-matrix MLPs (gpt2, gpt_neox, bloom, falcon, opt): ``h -> ffn`` and ``ffn -> h``.

``tests/test_finetune_lora.py`` checks the count against peft's on the real transformers models.
"""

from __future__ import annotations

from dstk.models.spec import ModelSpec
from dstk.train.lora import lora_modules, resolve_targets


def linear_shapes(model: ModelSpec) -> dict[str, tuple[int, int]]:
    """``{path inside a layer: (fan_in, fan_out)}`` for every module LoRA can adapt in ``model``."""
    h, d = model.hidden_size, model.head_dim
    q_width, kv_width = model.num_heads * d, model.num_kv_heads * d
    groups = lora_modules(model.family)
    attention, mlp = groups["attention"], groups["mlp"]
    shapes: dict[str, tuple[int, int]] = {}
    if len(attention) == 4:  # q, k, v, o
        for path, shape in zip(attention, ((h, q_width), (h, kv_width), (h, kv_width), (q_width, h))):
            shapes[path] = shape
    elif len(attention) == 2:  # fused qkv, o
        shapes[attention[0]] = (h, q_width + 2 * kv_width)
        shapes[attention[1]] = (q_width, h)
    else:
        raise ValueError(f"{model.family}: no LoRA shapes for attention modules {attention}")
    ffn = model.ffn_hidden_size
    if len(mlp) == 3:  # gate, up, down
        shapes.update(zip(mlp, ((h, ffn), (h, ffn), (ffn, h))))
    elif len(mlp) == 2:  # up (phi3: gate and up fused), down
        shapes[mlp[0]] = (h, 2 * ffn if model.gated_mlp else ffn)
        shapes[mlp[1]] = (ffn, h)
    elif mlp:
        raise ValueError(f"{model.family}: no LoRA shapes for MLP modules {mlp}")
    return shapes


def num_lora_params(*, model: ModelSpec, rank: int, targets: str | tuple[str, ...] | None = None) -> int:
    """Adapter parameters: ``num_layers * sum over targeted modules of rank * (fan_in + fan_out)``.

    ``targets``: ``--lora-targets`` text (``"q,v"``, ``"all-linear"``; None is all-linear) or the
    resolved module paths (``LoraSettings.targets``)."""
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise ValueError(f"rank: expected an integer >= 1, got {rank!r}")
    paths = targets if isinstance(targets, tuple) else resolve_targets(family=model.family, targets=targets)
    shapes = linear_shapes(model)
    missing = [p for p in paths if p not in shapes]
    if missing:
        raise ValueError(f"{model.family}: not a LoRA target: {missing}")
    return model.num_layers * sum(rank * (shapes[p][0] + shapes[p][1]) for p in paths)
