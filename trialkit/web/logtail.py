"""Reading a growing log from where the reader left it."""
from __future__ import annotations

import os
from typing import Any, Dict, Optional

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
