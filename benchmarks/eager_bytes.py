"""Memory traffic of one HF transformers decoder layer run eagerly, measured op by op, next to
dstk's formula (``dstk.estimate.timing.eager_elementwise_bytes_per_token``) and the fused bytes
(``timing.elementwise_bytes_per_token``).

    .venv/bin/python benchmarks/eager_bytes.py [--breakdown] [--trace]

One real layer (``LlamaDecoderLayer``, ``GPT2Block``, ``MistralDecoderLayer``) in bf16, train mode,
forward + backward, under a ``TorchDispatchMode`` that adds up, for every aten op, the bytes of its
tensor inputs (read) and outputs (written). What is excluded, and why:

- the GEMMs (``mm``, ``addmm``, ``bmm``, ``baddbmm``): ``steptime.layer_seconds`` prices them by FLOPs;
- the attention kernel (``_scaled_dot_product_*`` forward and backward): priced as flash/eager
  attention; the layer runs SDPA with ``is_causal`` and no mask, as HF does in training without padding;
- views (``OpOverload.is_view``: view, transpose, expand, slice; and ``_unsafe_view``) and ``detach``:
  they move no data; a broadcast input (stride 0, e.g. ``cos`` over the heads) counts its distinct
  elements once;
- the rotary ``cos``/``sin`` tables: ``LlamaRotaryEmbedding`` runs once per model forward, not per
  layer (they are inputs here).

What differs on a GPU: ``torch.nn.functional.dropout`` on CPU decomposes into ``bernoulli_``,
``div_`` and ``mul`` (``at::native::dropout``'s ``_dropout_impl``), whereas on CUDA it calls the
fused ``native_dropout`` (``is_fused_kernel_acceptable``): forward reads x, writes y and a 1-byte
mask; backward (``native_dropout_backward``) reads the gradient and the mask and writes the
gradient. The script routes dropout through ``torch.native_dropout`` so the count is the CUDA
path's. SDPA's attention dropout stays inside the (excluded) attention kernel (the GPT-2 layer
runs with ``attn_pdrop=0``: on CPU a dropout probability sends SDPA to its math path, on CUDA it
stays in the flash kernel). ``slice_backward`` (rotary's backward) zero-fills its output and copies
the slice in, on both devices: counted as output + 2 x input.
"""

from __future__ import annotations

import argparse
import collections
import sys

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

GEMMS = {"mm", "addmm", "bmm", "baddbmm", "addbmm", "linear", "matmul"}
FREE = {"detach", "alias", "lift_fresh", "_unsafe_view"}


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
    """Sums the bytes read and written by the counted ops (``_counted``); ``by_op`` keeps them per op."""

    def __init__(self):
        super().__init__()
        self.total = 0
        self.by_op = collections.Counter()
        self.trace: list[tuple[str, int, str]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if _counted(func):
            read = sum(_nbytes(a) for a in tree_flatten((args, kwargs))[0])
            written = sum(_nbytes(o) for o in tree_flatten(out)[0])
            if func.overloadpacket.__name__ == "slice_backward":  # zero-fill, then copy the slice in
                written += read
            self.total += read + written
            self.by_op[func.overloadpacket.__name__] += read + written
            shapes = [f"{tuple(a.shape)}{str(a.dtype)[6:]}" for a in tree_flatten((args, kwargs))[0]
                      if isinstance(a, torch.Tensor)]
            self.trace.append((func.overloadpacket.__name__, read + written, " ".join(shapes)))
        return out


def _cuda_dropout(input, p=0.5, training=True, inplace=False):
    """What ``F.dropout`` runs on CUDA: the fused ``native_dropout`` (see the module docstring)."""
    if not training or p == 0.0:
        return input
    return torch.native_dropout(input, p, True)[0]


def _llama_like(family: str, *, hidden: int, heads: int, kv_heads: int, ffn: int):
    from transformers import AutoConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg = AutoConfig.for_model(family, hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=kv_heads,
                               intermediate_size=ffn, num_hidden_layers=1, vocab_size=128, head_dim=hidden // heads,
                               max_position_embeddings=4096)
    cfg._attn_implementation = "sdpa"
    mod = __import__(f"transformers.models.{family}.modeling_{family}", fromlist=["x"])
    layer = getattr(mod, f"{family.capitalize()}DecoderLayer")(cfg, layer_idx=0)
    rotary = LlamaRotaryEmbedding(cfg)
    return cfg, layer, rotary


def measure(*, family: str, hidden: int, heads: int, kv_heads: int, ffn: int, batch: int, seq_len: int,
            dropout: float = 0.1) -> tuple[float, ByteCounter]:
    """(bytes per token, the counter) of one layer's forward + backward in bf16, train mode."""
    torch.manual_seed(0)
    x = torch.randn(batch, seq_len, hidden, dtype=torch.bfloat16, requires_grad=True)
    if family == "gpt2":
        from transformers import GPT2Config
        from transformers.models.gpt2.modeling_gpt2 import GPT2Block

        cfg = GPT2Config(n_embd=hidden, n_head=heads, n_inner=ffn, n_layer=1, vocab_size=128,
                         resid_pdrop=dropout, attn_pdrop=0.0, embd_pdrop=dropout, bos_token_id=0, eos_token_id=0)
        cfg._attn_implementation = "sdpa"
        layer = GPT2Block(cfg, layer_idx=0).to(torch.bfloat16).train()

        def run():
            return layer(x)
    else:
        cfg, layer, rotary = _llama_like(family, hidden=hidden, heads=heads, kv_heads=kv_heads, ffn=ffn)
        layer = layer.to(torch.bfloat16).train()
        pos = torch.arange(seq_len)[None].expand(batch, -1)
        cos, sin = rotary(x, pos)

        def run():
            return layer(x, position_embeddings=(cos, sin), attention_mask=None)
    grad = torch.randn(batch, seq_len, hidden, dtype=torch.bfloat16)
    plain = F.dropout
    F.dropout = _cuda_dropout
    try:
        counter = ByteCounter()
        with counter:
            out = run()
            out = out[0] if isinstance(out, tuple) else out
            out.backward(grad)
    finally:
        F.dropout = plain
    return counter.total / (batch * seq_len), counter


CASES = (
    # family, hidden, heads, kv_heads, ffn, batch, seq_len
    ("llama", 256, 8, 2, 704, 2, 128),
    ("llama", 512, 8, 8, 1376, 1, 256),
    ("mistral", 256, 8, 2, 704, 2, 128),
    ("qwen3", 256, 8, 2, 704, 2, 128),
    ("gpt2", 256, 8, 8, 1024, 2, 128),
    ("gpt2", 512, 8, 8, 2048, 1, 256),
)


def formula(*, family: str, hidden: int, heads: int, kv_heads: int, ffn: int) -> tuple[float, float]:
    """(eager forward + backward, fused forward + backward) bytes per token from dstk's formulas."""
    from dstk.estimate import timing as tm

    head_dim = hidden // heads
    gpt2 = family == "gpt2"
    kw = dict(hidden=hidden, q_width=hidden, kv_width=kv_heads * head_dim, ffn=ffn, act_bytes=2)
    fused = 3 * tm.elementwise_bytes_per_token(**kw, sp=1, gated=not gpt2, rotary=not gpt2, dropout=gpt2)
    eager = tm.eager_elementwise_bytes_per_token(**kw, head_dim=head_dim, norm="layernorm" if gpt2 else "rmsnorm",
                                                 activation="gelu_new" if gpt2 else "silu", gated=not gpt2,
                                                 rotary=not gpt2, dropout=gpt2, bias=gpt2, fused_qkv=gpt2,
                                                 qk_norm=family == "qwen3")
    return eager.forward + eager.backward, fused


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--breakdown", action="store_true", help="print the bytes per token of each op")
    parser.add_argument("--trace", action="store_true", help="print every counted op with its input shapes")
    args = parser.parse_args(argv)
    print(f"{'layer':<34} {'measured':>10} {'dstk eager':>10} {'err':>7} {'fused':>8}  (bytes/token/layer, fwd+bwd)")
    for family, h, a, kv, f, b, s in CASES:
        measured, counter = measure(family=family, hidden=h, heads=a, kv_heads=kv, ffn=f, batch=b, seq_len=s)
        eager, fused = formula(family=family, hidden=h, heads=a, kv_heads=kv, ffn=f)
        name = f"{family} h={h} a={a} kv={kv} f={f} b={b} s={s}"
        print(f"{name:<34} {measured:>10.0f} {eager:>10.0f} {(eager / measured - 1) * 100:>+6.1f}% {fused:>8.0f}")
        if args.breakdown:
            for op, n in counter.by_op.most_common():
                print(f"    {op:<40} {n / (b * s):>10.0f}")
        if args.trace:
            for op, n, shapes in counter.trace:
                print(f"    {op:<28} {n / (b * s):>9.1f}  {shapes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
