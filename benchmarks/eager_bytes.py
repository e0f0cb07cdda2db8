"""Memory traffic of one HF transformers decoder layer run eagerly, measured op by op, next to
dstk's formula (``dstk.estimate.timing.eager_elementwise_bytes_per_token``, called the way the
estimator calls it for the family's ``ModelSpec``) and the fused bytes
(``timing.elementwise_bytes_per_token``).

    .venv/bin/python benchmarks/eager_bytes.py [--family gemma ...] [--breakdown] [--trace]

One layer is what a real ``AutoModelForCausalLM`` with two decoder layers moves beyond the same
model with one (so each family runs its own layer code, masks, rotary tables and MoE dispatch as
in training): bf16, train mode, forward + backward of the loss, ``use_cache=False``, under a
``TorchDispatchMode`` that adds up, for every aten op, the bytes of its tensor inputs (read) and
outputs (written). What is excluded, and why:

- the GEMMs (``mm``, ``addmm``, ``bmm``, ``baddbmm``, ``grouped_mm``): ``steptime.layer_seconds``
  prices them by FLOPs;
- the attention kernel (``_scaled_dot_product_*`` forward and backward) and any op on a tensor
  shaped like the scores (``[..., s, s]``: BLOOM's eager softmax, the masks): priced as
  flash/eager attention; SDPA runs with ``is_causal`` and no mask, as HF does without padding;
- views (``OpOverload.is_view``: view, transpose, expand, slice; and ``_unsafe_view``) and ``detach``:
  they move no data; a broadcast input (stride 0, e.g. ``cos`` over the heads) counts its distinct
  elements once; the inputs of ``new_zeros``/``empty_like``-style factories (shape only).

What differs on a GPU: ``torch.nn.functional.dropout`` on CPU decomposes into ``bernoulli_``,
``div_`` and ``mul`` (``at::native::dropout``'s ``_dropout_impl``), whereas on CUDA it calls the
fused ``native_dropout`` (``is_fused_kernel_acceptable``): forward reads x, writes y and a 1-byte
mask; backward (``native_dropout_backward``) reads the gradient and the mask and writes the
gradient. The script routes dropout through ``torch.native_dropout`` so the count is the CUDA
path's. Attention dropout is set to 0 (on CPU a dropout probability sends SDPA to its math path;
on CUDA it stays in the flash kernel). ``slice_backward`` zero-fills its output and copies the
slice in, on both devices: counted as output + 2 x input. MoE layers run transformers' default
``grouped_mm`` experts (what a GPU runs; its byte count does not depend on the routing).

Not counted here and not in the formula: HF's training forward with the default ``use_cache=True``
also copies each layer's k and v into a ``DynamicCache`` (``cat`` with an empty tensor: ``4w kv``
bytes per token forward); dstk's worker runs it that way, the ``--cache`` flag shows it.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import sys

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

GEMMS = {"mm", "addmm", "bmm", "baddbmm", "addbmm", "linear", "matmul", "_grouped_mm", "grouped_mm"}
FREE = {"detach", "alias", "lift_fresh", "_unsafe_view"}
FACTORIES = {"new_zeros", "new_empty", "new_ones", "new_full", "empty_like", "zeros_like", "ones_like", "full_like"}


def _counted(func) -> bool:
    name = func.overloadpacket.__name__
    if name in GEMMS or "scaled_dot_product" in name or "flash_attention" in name:
        return False
    return not (func.is_view or name in FREE)


def _nbytes(x) -> int:
    """Bytes of the distinct elements a tensor holds: a broadcast (stride-0) dimension is read once."""
    if not isinstance(x, torch.Tensor):
        return 0
    n = 1
    for size, stride in zip(x.shape, x.stride()):
        n *= size if stride else 1
    return n * x.element_size()


class ByteCounter(TorchDispatchMode):
    """Sums the bytes read and written by the counted ops (``_counted``), ops on score-shaped
    tensors (last two dimensions ``seq_len``) left out; ``by_op`` keeps them per op."""

    def __init__(self, *, seq_len: int):
        super().__init__()
        self.seq_len = seq_len
        self.total = 0
        self.by_op = collections.Counter()
        self.trace: list[tuple[str, int, str]] = []

    def _scores(self, tensors) -> bool:
        return any(t.dim() >= 2 and t.shape[-1] == t.shape[-2] == self.seq_len for t in tensors)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not _counted(func):
            return out
        inputs = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        outputs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
        if self._scores(inputs + outputs):
            return out
        name = func.overloadpacket.__name__
        if name in FACTORIES:  # shape and dtype only
            read = 0
        elif name == "index":  # a gather reads the rows it picks (and the indices)
            read = sum(_nbytes(o) for o in outputs) + sum(_nbytes(a) for a in inputs[1:])
        else:
            read = sum(_nbytes(a) for a in inputs)
        written = sum(_nbytes(o) for o in outputs)
        if name in ("slice_backward", "select_backward"):  # zero-fill, then copy the slice in
            written += read
        self.total += read + written
        self.by_op[name] += read + written
        self.trace.append((name, read + written, " ".join(f"{tuple(a.shape)}{str(a.dtype)[6:]}" for a in inputs)))
        return out


def _cuda_dropout(input, p=0.5, training=True, inplace=False):
    """What ``F.dropout`` runs on CUDA: the fused ``native_dropout`` (see the module docstring)."""
    if not training or p == 0.0:
        return input
    return torch.native_dropout(input, p, True)[0]


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class Case:
    label: str
    model_type: str
    keys: dict
    """HF config keys of the layer (vocabulary, positions and layer count are added)."""
    batch: int = 2
    seq_len: int = 128


def _cfg(case: Case, *, num_layers: int) -> dict:
    layers = {"n_layer": num_layers} if case.model_type == "bloom" else {"num_hidden_layers": num_layers}
    return {"vocab_size": 128, "max_position_embeddings": 4096, "pad_token_id": 0, "bos_token_id": 0,
            "eos_token_id": 0, **case.keys, **layers}


def _sdpa_gqa(query, key, value, *args, **kwargs):
    """SDPA with ``enable_gqa`` when k/v have fewer heads than q (Falcon-7B's multi-query layer
    hands it one k/v head without it): on a CPU the fused kernel then runs, as for every other
    layer here, instead of the math path whose ops would be counted as the layer's."""
    if key.dim() == 4 and key.shape[1] != query.shape[1]:
        kwargs["enable_gqa"] = True
    return _PLAIN_SDPA(query, key, value, *args, **kwargs)


_PLAIN_SDPA = F.scaled_dot_product_attention


def _run(case: Case, *, num_layers: int, use_cache: bool) -> ByteCounter:
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    keys = _cfg(case, num_layers=num_layers)
    keys.update({key: 0.0 for key in ("attn_pdrop", "attention_dropout") if key in keys})
    cfg = AutoConfig.for_model(case.model_type, **keys)
    try:
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    except ValueError:  # BLOOM: eager attention only
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    model = model.to(torch.bfloat16).train()
    ids = torch.randint(0, cfg.vocab_size, (case.batch, case.seq_len))
    plain = F.dropout
    F.dropout, F.scaled_dot_product_attention = _cuda_dropout, _sdpa_gqa
    try:
        counter = ByteCounter(seq_len=case.seq_len)
        with counter:
            model(input_ids=ids, labels=ids, use_cache=use_cache).loss.backward()
    finally:
        F.dropout, F.scaled_dot_product_attention = plain, _PLAIN_SDPA
    return counter


def measure(case: Case, *, use_cache: bool = False) -> tuple[float, dict[str, float], list[str]]:
    """(bytes per token, bytes per token by op, the extra ops) of one layer: a two-layer model's
    forward + backward minus a one-layer model's, bf16, train mode."""
    one, two = (_run(case, num_layers=n, use_cache=use_cache) for n in (1, 2))
    tokens = case.batch * case.seq_len
    ops = {op: (two.by_op[op] - one.by_op[op]) / tokens for op in two.by_op | one.by_op}
    extra = collections.Counter(f"{op:<26} {n / tokens:>9.1f}  {shapes}" for op, n, shapes in two.trace)
    extra.subtract(f"{op:<26} {n / tokens:>9.1f}  {shapes}" for op, n, shapes in one.trace)
    return (two.total - one.total) / tokens, ops, [line for line, n in extra.items() for _ in range(max(n, 0))]


def spec_of(case: Case):
    from dstk.models import family_module

    cfg = {"model_type": case.model_type, **_cfg(case, num_layers=1)}
    return family_module(case.model_type).read(cfg, name=case.label)


def formula(case: Case) -> tuple[float, float]:
    """(eager, fused) forward + backward bytes per token of the layer as ``steptime.layer_seconds``
    prices it for the family's spec (one token, TP 1, bf16, at 1 byte/s: its seconds are bytes)."""
    from dstk.estimate import _model_facts
    from dstk.estimate import steptime as st
    from dstk.hardware import get_gpu

    gpu = dataclasses.replace(get_gpu("h100-sxm"), hbm_bytes_per_s=1.0)
    kw = dict(facts=_model_facts(spec_of(case)), tokens=1, seq_len=case.seq_len, tp=1, sp=1, act_bytes=2,
              attention="sdpa", gpu=gpu, peak_flops=gpu.peak_flops("bf16"))  # what the measured model runs
    eager, fused = st.layer_seconds(**kw, fused=False), st.layer_seconds(**kw, fused=True)
    return eager.elementwise + eager.backward_elementwise, 3 * fused.elementwise


def _llama(model_type, h=256, heads=8, kv=2, ffn=704, **extra):
    return {"hidden_size": h, "num_attention_heads": heads, "num_key_value_heads": kv, "intermediate_size": ffn,
            "head_dim": h // heads, **extra}


CASES = (
    Case(label="llama h=256 kv=64 f=704", model_type="llama", keys=_llama("llama")),
    Case(label="llama h=512 kv=512 f=1376", model_type="llama", keys=_llama("llama", 512, 8, 8, 1376),
         batch=1, seq_len=256),
    Case(label="mistral h=256 kv=64 f=704", model_type="mistral", keys=_llama("mistral")),
    Case(label="qwen3 h=256 kv=64 (QK-norm)", model_type="qwen3", keys=_llama("qwen3")),
    Case(label="qwen2 h=256 kv=64 (QKV bias)", model_type="qwen2", keys=_llama("qwen2")),
    Case(label="gemma h=256 kv=64 (GeGLU)", model_type="gemma",
         keys=_llama("gemma", hidden_act="gelu_pytorch_tanh")),
    Case(label="phi3 h=256 kv=64 (fused)", model_type="phi3", keys=_llama("phi3")),
    Case(label="mixtral h=256 f=704 8e top-2", model_type="mixtral",
         keys=_llama("mixtral", num_local_experts=8, num_experts_per_tok=2)),
    Case(label="mixtral h=384 f=512 4e top-1", model_type="mixtral",
         keys=_llama("mixtral", 384, 6, 2, 512, num_local_experts=4, num_experts_per_tok=1), batch=1, seq_len=256),
    Case(label="gpt2 h=256 f=1024", model_type="gpt2",
         keys={"n_embd": 256, "n_head": 8, "n_inner": 1024, "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1}),
    Case(label="gpt2 h=512 f=2048", model_type="gpt2",
         keys={"n_embd": 512, "n_head": 8, "n_inner": 2048, "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1},
         batch=1, seq_len=256),
    Case(label="gpt_neox h=256 (rotary 0.25)", model_type="gpt_neox",
         keys={"hidden_size": 256, "num_attention_heads": 8, "intermediate_size": 1024, "use_parallel_residual": True}),
    Case(label="opt h=256 f=1024 (dropout)", model_type="opt",
         keys={"hidden_size": 256, "num_attention_heads": 8, "ffn_dim": 1024, "word_embed_proj_dim": 256,
               "dropout": 0.1, "attention_dropout": 0.0}),
    # Falcon's layers are the smallest here (no gated MLP, one norm), so the rotary cos/sin reads, which
    # the formula counts per token as at micro-batch 1 (a batch of b reads each table row once per b
    # tokens), would be 0.3-0.4% of them at batch 2: they run at batch 1, as the formula counts (and
    # 512 positions: a 256-token sequence would make [..., 256, 256] activations look like scores).
    Case(label="falcon h=256 kv=64 (new arch)", model_type="falcon",
         keys={"hidden_size": 256, "num_attention_heads": 8, "num_kv_heads": 2, "new_decoder_architecture": True},
         batch=1, seq_len=512),
    Case(label="falcon h=256 MQA (7B-style)", model_type="falcon",
         keys={"hidden_size": 256, "num_attention_heads": 8, "multi_query": True, "new_decoder_architecture": False,
               "parallel_attn": True}, batch=1, seq_len=512),
    Case(label="falcon h=256 MHA (classic)", model_type="falcon",
         keys={"hidden_size": 256, "num_attention_heads": 8, "multi_query": False, "new_decoder_architecture": False,
               "parallel_attn": True}, batch=1, seq_len=512),
    Case(label="bloom h=256 (ALiBi)", model_type="bloom", keys={"hidden_size": 256, "n_head": 8}),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", action="append", help="only these model types (repeatable)")
    parser.add_argument("--breakdown", action="store_true", help="print the bytes per token of each op")
    parser.add_argument("--trace", action="store_true", help="print the layer's counted ops with their input shapes")
    parser.add_argument("--cache", action="store_true", help="run with use_cache=True (the DynamicCache copies)")
    args = parser.parse_args(argv)
    print(f"{'layer (bf16, b x s tokens)':<40} {'measured':>9} {'dstk eager':>10} {'err':>7} {'fused':>7}"
          "  (bytes/token/layer, fwd+bwd)")
    for case in CASES:
        if args.family and case.model_type not in args.family:
            continue
        measured, ops, extra = measure(case, use_cache=args.cache)
        eager, fused = formula(case)
        name = f"{case.label} {case.batch}x{case.seq_len}"
        print(f"{name:<40} {measured:>9.0f} {eager:>10.0f} {(eager / measured - 1) * 100:>+6.1f}% {fused:>7.0f}",
              flush=True)
        if args.breakdown:
            for op, n in sorted(ops.items(), key=lambda kv: -abs(kv[1])):
                if round(n):
                    print(f"    {op:<40} {n:>10.0f}")
        if args.trace:
            for line in extra:
                print(f"    {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
