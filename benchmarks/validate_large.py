"""How long does `dstk validate` take on a huge config (fuzzing found quadratic steps)?

Writes three ~3.5 MB files with 200,000 keys each and times `dstk.validate.validate_file` on each
(in process, one run each, after a warm-up on a small config):
  * flat-unknown: 200,000 unknown top-level keys (one DS101 finding and one did-you-mean per key);
  * user-map: 200,000 keys inside `autotuning.arg_mappings` (a map with user keys: valid, positions only);
  * comments: 200,000 `_comment_N` keys (DS111 warnings).

Usage: .venv/bin/python benchmarks/validate_large.py [--keys 200000]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time


def _files(num_keys: int) -> dict[str, dict]:
    flat = {"train_micro_batch_size_per_gpu": 1}
    flat.update({f"k{i:07d}": i for i in range(num_keys)})
    user_map = {"train_micro_batch_size_per_gpu": 1,
                "autotuning": {"arg_mappings": {f"key{i:07d}": f"--a{i}" for i in range(num_keys)}}}
    comments = {"train_micro_batch_size_per_gpu": 1}
    comments.update({f"_c{i:07d}": i for i in range(num_keys)})
    return {"flat-unknown": flat, "user-map": user_map, "comments": comments}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=200_000)
    args = parser.parse_args()

    from dstk.validate import validate_config, validate_file

    validate_config({"train_micro_batch_size_per_gpu": 1})  # load the schema and build the validator
    with tempfile.TemporaryDirectory() as tmp:
        for name, config in _files(args.keys).items():
            path = os.path.join(tmp, f"{name}.json")
            with open(path, "w") as fh:
                json.dump(config, fh, indent=1)
            size = os.path.getsize(path)
            start = time.perf_counter()
            findings = validate_file(path)
            seconds = time.perf_counter() - start
            print(f"{name}: {size / 1e6:.1f} MB, {args.keys} keys: {seconds:.2f} s, {len(findings)} findings")
    return 0


if __name__ == "__main__":
    sys.exit(main())
