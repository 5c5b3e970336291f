"""Rank prefixes on a byte stream: pure, no I/O, fast on large chunks.

A line starts the stream, follows a "\\n", or follows a "\\r" that is not part
of a "\\r\\n" (progress bars redraw with a bare CR: each redraw is a line).
Bytes are never decoded, so invalid UTF-8 passes untouched, and a stream is
only cut right after a line end, which is never inside a UTF-8 character.
Whole chunks go through bytes.replace instead of a Python loop per line: that
is what keeps wrap_rank ahead of `sed 's/^/[rank=0] /'`. A line is held until
it ends, up to MAX_LINE: beyond that (a binary stream with no line end would
otherwise fill memory) it goes out in pieces, cut between characters, and only
the first piece carries the prefix.
"""
from __future__ import annotations

TYPE_CHECKING = False  # no typing at run time: it costs every start 1.6 ms (tests/test_start_imports.py)
if TYPE_CHECKING:
    from typing import List, Union

    Buffer = Union[bytes, memoryview]

MAX_LINE = 64 << 20


class LinePrefixer:
    """Feed it chunks; it hands back whole lines with the prefix, keeping the unfinished one."""

    def __init__(self, prefix: bytes):
        self.prefix = prefix
        self._nl = b"\n" + prefix
        self._cr = b"\r" + prefix
        self._cr_then_nl = b"\r" + prefix + b"\n"
        self._partial: List[bytes] = []  # the current line so far; it holds no line end
        self._held = 0  # bytes in _partial
        self._continued = False  # the current line outgrew MAX_LINE: its start went out already
        self._after_cr = False  # the last chunk ended on a CR: a "\n" first would finish a CRLF

    def feed(self, data: bytes) -> List[Buffer]:
        """The buffers to write now, in order; together they hold only whole lines."""
        out: List[Buffer] = []
        if self._after_cr and data[:1] == b"\n":
            out.append(b"\n")  # the CRLF's second half: that line went out already
            data = data[1:]
        self._after_cr = False
        has_cr = b"\r" in data
        cut = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1 if has_cr else data.rfind(b"\n") + 1
        if cut == 0:
            if data:
                self._partial.append(data)
                self._held += len(data)
            return out + self._spill() if self._held > MAX_LINE else out
        tail = len(data) - cut  # the unfinished line after the last line end
        # Every line end gains the prefix after it; the one after the last line
        # end belongs to a line that has not come yet, so it is cut off below.
        body = data.replace(b"\n", self._nl)
        if has_cr:
            body = body.replace(b"\r", self._cr).replace(self._cr_then_nl, b"\r\n")
            self._after_cr = not tail and data.endswith(b"\r")
        if not self._continued:
            out.append(self.prefix)
        if self._partial:  # the held start of the first line: its own buffer, not copied into the chunk
            out.append(self._partial[0] if len(self._partial) == 1 else b"".join(self._partial))
        out.append(memoryview(body)[: len(body) - tail - len(self.prefix)])
        self._partial = [data[cut:]] if tail else []
        self._held = tail
        self._continued = False
        return out

    def finish(self) -> List[Buffer]:
        """At end of stream: the unfinished line, prefixed, without inventing a line end."""
        if not self._partial:
            return []
        line = b"".join(self._partial)
        self._partial = []
        return [line] if self._continued else [self.prefix, line]

    def _spill(self) -> List[Buffer]:
        """Write out the held part of an over-long line, keeping a cut character's first bytes."""
        line = b"".join(self._partial)
        keep = _unfinished_character(line)
        out: List[Buffer] = [] if self._continued else [self.prefix]
        out.append(memoryview(line)[: len(line) - keep])
        self._partial = [line[len(line) - keep :]] if keep else []
        self._held = keep
        self._continued = True
        return out


def _unfinished_character(data: bytes) -> int:
    """How many bytes at the end begin a UTF-8 character that is not complete yet."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80:
            return 0
        if byte >= 0xC0:  # a lead byte: how long its character is
            length = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return back if length > back else 0
    return 0
