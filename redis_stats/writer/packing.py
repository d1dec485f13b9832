"""How the blocking writer's own client packs a command: :class:`SlicedPacker`, hiredis' packing
a slice of arguments at a time, so that a large flush does not hold the GIL (installed by
:class:`~redis_stats.writer.blocking.StatsWriter` when hiredis is there)."""

from __future__ import annotations

import time
from typing import Any

__all__ = ["SlicedPacker"]


class SlicedPacker:
    """Packs a command as hiredis does, a slice of arguments at a time.

    hiredis packs a whole command in one C call that holds the GIL: a flush of 100,000 series
    (400,000 arguments) held it for ~100 ms, and every record call of the host waited that long.
    Between slices other threads run; the bytes on the wire are the same.
    """

    SLICE = 2048  # about 0.5 ms of packing

    def pack(self, *args: Any) -> list[bytes | memoryview]:
        """The RESP encoding of *args*, as a list of chunks to send in order."""
        import hiredis

        # As redis-py's HiredisRespSerializer: "SCRIPT LOAD" is two words, buffers become bytes.
        if isinstance(args[0], str):
            args = (*args[0].encode().split(), *args[1:])
        elif b" " in args[0]:
            args = (*args[0].split(), *args[1:])
        args = tuple(bytes(a) if isinstance(a, (bytearray, memoryview)) else a for a in args)
        if len(args) <= self.SLICE:
            return [hiredis.pack_command(args)]
        out: list[bytes | memoryview] = [b"*%d\r\n" % len(args)]
        for i in range(0, len(args), self.SLICE):
            part = hiredis.pack_command(args[i : i + self.SLICE])
            out.append(memoryview(part)[part.index(b"\r\n") + 2 :])  # without the slice's own header
            time.sleep(0)  # give the GIL to the host's threads between slices
        return out
