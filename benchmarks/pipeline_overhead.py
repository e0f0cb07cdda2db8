"""Forward+backward time of the pp=1 pipeline wrapper vs the bare HF model, same inputs.

    OMP_NUM_THREADS=1 python benchmarks/pipeline_overhead.py [--family llama] [--padded]

Starts a 1-rank gloo group (the PipelineModule needs one), builds a small random model from a
config, and times ``loss_fn(pipe(inputs), labels).backward()`` against
``model(input_ids, attention_mask, labels=labels).loss.backward()`` on the same batch,
interleaving the two so that machine noise hits both alike. Prints the median of each and the
ratio (goal: <= 1.05).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="llama", choices=["llama", "gpt2"])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--padded", action="store_true", help="left-pad half the rows (4-D masks are built)")
    args = parser.parse_args()

    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])

    import deepspeed
    import torch
    import transformers as tf

    from dstk.pipeline import to_pipeline

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    if args.family == "llama":
        cfg = tf.LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                             num_hidden_layers=args.layers, num_attention_heads=8, num_key_value_heads=4,
                             max_position_embeddings=args.seq)
    else:
        cfg = tf.GPT2Config(vocab_size=args.vocab, n_embd=args.hidden, n_layer=args.layers, n_head=8,
                            n_positions=args.seq, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = tf.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).train()
    pipe = to_pipeline(model, num_stages=1)  # shares the model's parameters

    ids = torch.randint(0, args.vocab, (args.batch, args.seq))
    mask = torch.ones_like(ids)
    if args.padded:
        mask[: args.batch // 2, : args.seq // 4] = 0
    labels = ids.masked_fill(mask == 0, -100)

    def bare():
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()

    def wrapped():
        pipe.loss_fn(pipe((ids, mask)), labels).backward()

    for fn in (bare, wrapped, bare, wrapped):  # warm-up
        fn()
    times = {"bare": [], "wrapped": []}
    for _ in range(args.repeats):
        for name, fn in (("bare", bare), ("wrapped", wrapped)):
            model.zero_grad(set_to_none=True)
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    b, w = statistics.median(times["bare"]), statistics.median(times["wrapped"])
    print(f"family={args.family} layers={args.layers} hidden={args.hidden} vocab={args.vocab} "
          f"batch={args.batch} seq={args.seq} padded={args.padded} threads={torch.get_num_threads()}")
    print(f"bare HF fwd+bwd:   {b * 1e3:8.2f} ms (median of {args.repeats})")
    print(f"pp=1 wrapper:      {w * 1e3:8.2f} ms")
    print(f"ratio wrapper/bare: {w / b:.3f}")
    from dstk.launch.rank import exit_rank

    exit_rank()


if __name__ == "__main__":
    main()
