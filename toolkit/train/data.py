"""Local data files -> packed token blocks -> a deterministic split and a deterministic order.

Files are read with ``datasets`` (json/jsonl/csv/parquet/text by extension). A record is plain
text (``text_field``) or a prompt/response pair, rendered with the tokenizer's chat template when
it has one. Documents are tokenized, joined with EOS and cut into blocks of ``seq_len`` tokens
(the tail that does not fill a block is dropped), as in GPT-2/Llama pre-training. The eval split
and the training order are functions of the seed alone, so a resumed run sees the same batches.
"""

from __future__ import annotations

import os
from pathlib import Path

from dstk.errors import DstkError, UsageError

LOADERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet", ".txt": "text",
           ".text": "text", ".md": "text"}


def loader_for(path: str | os.PathLike) -> str:
    suffix = Path(path).suffix.lower()
    if suffix not in LOADERS:
        raise UsageError(f"{path}: unknown data file type {suffix or '(none)'!r}",
                         hint=f"use one of {', '.join(sorted(LOADERS))}")
    return LOADERS[suffix]


def check_files(files: list[str]) -> None:
    """Missing, unreadable or empty files, and mixed types: all before anything is loaded."""
    if not files:
        raise UsageError("no data files given", hint="pass --data FILE (json, jsonl, csv, parquet or txt)")
    kinds = set()
    for f in files:
        p = Path(f)
        if p.is_dir():
            raise UsageError(f"{f}: a directory, not a data file",
                             hint=f"give the files in it, e.g. --data {f.rstrip('/')}/*.jsonl")
        if not p.is_file():
            raise UsageError(f"{f}: data file not found", hint="check the path given to --data")
        if p.stat().st_size == 0:
            raise DstkError(f"{f}: data file is empty", hint="give a file with at least one record")
        kinds.add(loader_for(f))
    if len(kinds) > 1:
        raise UsageError(f"--data mixes file types ({', '.join(sorted(kinds))})",
                         hint="convert them to one type, or fine-tune on one kind at a time")


def json_problem(path: str | os.PathLike) -> str | None:
    """``FILE:LINE:COLUMN: what is wrong`` for the first line of a .json/.jsonl data file that is not a JSON
    object, as ``datasets``' json loader reads it (JSON lines; a .json file may also be one JSON document);
    None when it parses or is of another type."""
    import json

    path = Path(path)
    if loader_for(path) != "json":
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return f"{path}: cannot be read as UTF-8 text ({exc})"
    if path.suffix.lower() == ".json":
        try:
            json.loads(text)
            return None
        except ValueError as exc:
            whole = exc
        if not text.lstrip().startswith("{"):  # one document (an array) that does not parse
            return f"{path}:{whole.lineno}:{whole.colno}: not valid JSON ({whole.msg})"
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            return f"{path}:{number}:{exc.colno}: not a JSON object ({exc.msg})"
        if not isinstance(record, dict):
            return f"{path}:{number}: a JSON {type(record).__name__}, not an object with a text field"
    return None


def load_records(files: list[str], *, text_field: str = "text", prompt_field: str | None = None,
                 response_field: str | None = None):
    """The ``datasets.Dataset`` of all files, with the columns checked."""
    import datasets

    check_files(files)
    datasets.disable_progress_bars()
    # datasets logs its loader's failure ("Failed to load JSON from file ...") before raising; the error
    # below says it, with the file and line
    verbosity = datasets.logging.get_verbosity()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    try:
        ds = datasets.load_dataset(loader_for(files[0]), data_files=[str(Path(f).resolve()) for f in files],
                                   split="train")
    except Exception as exc:  # datasets raises many kinds; all mean the file cannot be parsed
        where = next((w for f in files if (w := json_problem(f)) is not None), None)
        if where is not None:  # datasets names neither the file nor the line (DatasetGenerationError)
            raise DstkError(where, hint="fix that line: one JSON object per line in .jsonl, a JSON array or "
                                        "JSON lines in .json") from None
        raise DstkError(f"cannot read {', '.join(files)}: {type(exc).__name__}: {exc}",
                        hint="check that the file is valid for its extension") from None
    finally:
        datasets.logging.set_verbosity(verbosity)
    if len(ds) == 0:
        raise DstkError(f"{', '.join(files)}: no records", hint="give a file with at least one record")
    wanted = [prompt_field, response_field] if prompt_field or response_field else [text_field]
    if prompt_field and not response_field or response_field and not prompt_field:
        raise UsageError("--prompt-field and --response-field go together", hint="give both, or --text-field")
    for col in wanted:
        if col not in ds.column_names:
            raise DstkError(f"{files[0]}: no column {col!r} (columns: {', '.join(ds.column_names)})",
                            hint="name an existing column with --text-field, or --prompt-field/--response-field")
    return ds


def render(record: dict, *, tokenizer, text_field: str, prompt_field: str | None,
           response_field: str | None) -> str:
    """One record as training text: the chat template when the tokenizer has one."""
    if not prompt_field:
        value = record[text_field]
        return "" if value is None else str(value)
    prompt, response = str(record[prompt_field] or ""), str(record[response_field] or "")
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}], tokenize=False)
    return f"{prompt}\n\n{response}"


def pack(token_lists: list[list[int]], *, seq_len: int, eos_id: int | None) -> list[list[int]]:
    """Concatenate documents (EOS after each) and cut blocks of exactly ``seq_len`` tokens."""
    stream: list[int] = []
    for ids in token_lists:
        if not ids:
            continue
        stream.extend(ids)
        if eos_id is not None:
            stream.append(eos_id)
    return [stream[i:i + seq_len] for i in range(0, len(stream) - seq_len + 1, seq_len)]


def split_indices(num_blocks: int, *, eval_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(train, eval) block indices: a seeded permutation, the first ceil(fraction * n) for eval.

    At least one block each when there are two or more blocks and the fraction is positive."""
    import math
    import random

    if not 0 <= eval_fraction < 1:
        raise UsageError(f"--eval-split {eval_fraction}: expected 0 <= fraction < 1", hint="e.g. --eval-split 0.05")
    order = list(range(num_blocks))
    random.Random(seed).shuffle(order)
    n_eval = math.ceil(eval_fraction * num_blocks) if eval_fraction > 0 and num_blocks > 1 else 0
    n_eval = min(n_eval, num_blocks - 1)
    return sorted(order[n_eval:]), sorted(order[:n_eval])


def epoch_order(num_blocks: int, *, epoch: int, seed: int) -> list[int]:
    """The training order of one epoch: a permutation that depends only on (seed, epoch)."""
    import random

    order = list(range(num_blocks))
    random.Random(f"{seed}:{epoch}").shuffle(order)
    return order


def step_blocks(step: int, *, num_blocks: int, global_batch: int, seed: int) -> list[int]:
    """Block indices of optimizer step ``step`` (0-based), over all ranks and micro-batches.

    The stream of epochs is cut into consecutive global batches; a batch may span two epochs. A
    pure function of the step, so resuming at step k needs no data-loader state."""
    out = []
    for i in range(step * global_batch, (step + 1) * global_batch):
        epoch, pos = divmod(i, num_blocks)
        out.append(epoch_order(num_blocks, epoch=epoch, seed=seed)[pos])
    return out


def rank_micro_batches(blocks: list[int], *, dp_rank: int, dp: int, micro_batch: int,
                       grad_accum: int) -> list[list[int]]:
    """This data-parallel rank's micro-batches of one step: micro ``k`` of rank ``r`` is the slice
    ``(k * dp + r) * micro_batch`` of the step's blocks."""
    assert len(blocks) == dp * micro_batch * grad_accum, (len(blocks), dp, micro_batch, grad_accum)
    return [blocks[(k * dp + dp_rank) * micro_batch:(k * dp + dp_rank + 1) * micro_batch] for k in range(grad_accum)]


def tokenize_dataset(ds, *, tokenizer, seq_len: int, text_field: str = "text", prompt_field: str | None = None,
                     response_field: str | None = None) -> list[list[int]]:
    """Render, tokenize and pack every record; refuse data too small for one block."""
    texts = [render(r, tokenizer=tokenizer, text_field=text_field, prompt_field=prompt_field,
                    response_field=response_field) for r in ds]
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    blocks = pack(ids, seq_len=seq_len, eos_id=tokenizer.eos_token_id)
    if not blocks:
        total = sum(len(x) + 1 for x in ids)
        raise DstkError(f"the data has {total} tokens, fewer than one sequence of {seq_len}",
                        hint="give more data, or plan a shorter --seq-len")
    return blocks


def bundled_corpus() -> Path:
    """The small original corpus shipped with dstk (``templates/corpus/harbour-notes.txt``), for
    the demo: works from a checkout and from an installed wheel."""
    from importlib.resources import files

    return Path(str(files("dstk.templates") / "corpus" / "harbour-notes.txt"))
