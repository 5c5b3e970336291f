"""Reading a growing log from where the reader left it: a file on this machine, or
what the trial's keeper shipped to the manager (LOG records; every platform)."""
from __future__ import annotations

import os
from typing import Any, Dict, Iterable, Optional, Tuple

TAIL_BYTES = 64 << 10  # the most one answer carries: the last lines at first, then what was added


def read(path: Optional[str], offset: Optional[int]) -> Dict[str, Any]:
    """Text from `offset` (None: the last TAIL_BYTES, from a line start) and the offset to ask from next.

    A file shorter than `offset` was replaced: it is read again from the top.
    """
    try:
        with open(path or "", "rb") as f:
            size = os.fstat(f.fileno()).st_size
            start = max(0, size - TAIL_BYTES) if offset is None else (offset if offset <= size else 0)
            f.seek(start)
            data = f.read(min(TAIL_BYTES, size - start))
    except OSError:
        return {"exists": False, "text": "", "start": 0, "end": 0, "size": 0}
    if offset is None and start > 0 and b"\n" in data:
        cut = data.index(b"\n") + 1  # begin at a whole line
        data, start = data[cut:], start + cut
    end = start + len(data)
    if end < size and b"\n" in data:
        data = data[: data.rindex(b"\n") + 1]  # more is coming: stop at a whole line (and a whole character)
        end = start + len(data)
    return {"exists": True, "text": data.decode("utf-8", "replace"), "start": start, "end": end, "size": size}


def read_shipped(chunks: Iterable[Tuple[int, str]], offset: Optional[int]) -> Dict[str, Any]:
    """The same answer over shipped chunks, (seq, text) in order after `offset`: offsets are seqs.
    At first (offset None) the last TAIL_BYTES' worth of chunks."""
    chunks = list(chunks)
    if offset is None:
        kept, size = [], 0
        for seq, text in reversed(chunks):
            if kept and size + len(text) > TAIL_BYTES:
                break
            kept.append((seq, text))
            size += len(text)
        chunks = kept[::-1]
    else:
        taken, size = [], 0
        for seq, text in chunks:
            if taken and size + len(text) > TAIL_BYTES:
                break
            taken.append((seq, text))
            size += len(text)
        chunks = taken
    if not chunks:
        return {"exists": offset is not None, "text": "", "start": offset or 0, "end": offset or 0,
                "size": offset or 0}
    start, end = chunks[0][0], chunks[-1][0]
    return {"exists": True, "text": "".join(text for _, text in chunks), "start": start, "end": end, "size": end}


def only_rank(text: str, rank: int) -> str:
    """The lines of one distributed worker (wrap_rank starts each with `[rank=N] `)."""
    prefix = f"[rank={rank}] "
    return "".join(line for line in text.splitlines(keepends=True) if line.startswith(prefix))
