"""Frames on the pipes between a recording process and its writer process.

A frame is a list of messages (tuples) pickled with protocol 5. Contiguous buffers (the
rounds' numpy vectors) travel out of band, written straight from the arrays, so the
recording process copies nothing while it holds the GIL:

    header   ">II" pickle length, buffer count; then ">Q" per buffer length
    body     the pickle, then each buffer's bytes
"""

from __future__ import annotations

import os
import pickle
import struct
from typing import IO, Any, Literal, Protocol, overload

_HEAD = struct.Struct(">II")
_IOV_MAX = 512


class Reader(Protocol):
    """What read_frame reads from: a buffered binary stream (a pipe, sys.stdin.buffer, BytesIO)."""

    def readinto(self, buffer: memoryview, /) -> int | None: ...


def write_frame(stream: IO[bytes], messages: list[Any]) -> None:
    buffers: list[memoryview] = []

    def out_of_band(buffer: pickle.PickleBuffer) -> bool:
        try:
            buffers.append(buffer.raw())
            return False
        except BufferError:  # not contiguous: pickled in band instead
            return True

    data = pickle.dumps(messages, protocol=5, buffer_callback=out_of_band)
    parts: list[bytes | memoryview] = [
        _HEAD.pack(len(data), len(buffers)) + struct.pack(f">{len(buffers)}Q", *(b.nbytes for b in buffers)),
        data,
        *buffers,
    ]
    fd = _fileno(stream)
    if fd is None:
        for part in parts:
            stream.write(part)
        stream.flush()
        return
    # one system call (one release of the GIL) for the whole frame, straight from the arrays
    stream.flush()
    total = sum(len(p) if isinstance(p, bytes) else p.nbytes for p in parts)
    views = [memoryview(p).cast("B") for p in parts]
    sent = 0
    while sent < total:
        n = os.writev(fd, views[:_IOV_MAX])
        sent += n
        while views and n >= views[0].nbytes:
            n -= views[0].nbytes
            views.pop(0)
        if n:
            views[0] = views[0][n:]


def _fileno(stream: IO[bytes]) -> int | None:
    if not hasattr(os, "writev"):
        return None
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):  # BytesIO and friends
        return None


def read_frame(stream: Reader) -> list[Any] | None:
    """The next frame's messages; None at end of stream."""
    head = _read_exact(stream, _HEAD.size)
    if head is None:
        return None
    size, count = _HEAD.unpack(head)
    lengths = struct.unpack(f">{count}Q", _read_exact(stream, 8 * count, required=True)) if count else ()
    data = _read_exact(stream, size, required=True)
    buffers = [_read_exact(stream, n, required=True) for n in lengths]
    messages: list[Any] = pickle.loads(data, buffers=buffers)
    return messages


@overload
def _read_exact(stream: Reader, n: int, required: Literal[True]) -> bytearray: ...
@overload
def _read_exact(stream: Reader, n: int, required: bool = False) -> bytearray | None: ...
def _read_exact(stream: Reader, n: int, required: bool = False) -> bytearray | None:
    out = bytearray(n)
    view = memoryview(out)
    got = 0
    while got < n:
        k = stream.readinto(view[got:])
        if not k:
            if got == 0 and not required:
                return None
            raise EOFError(f"stream ended inside a frame ({got} of {n} bytes)")
        got += k
    return out
