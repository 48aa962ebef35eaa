"""Files a command writes (an export, a bench report): never over a database, never over
another file unless asked.

Every command that writes a file goes through check_output before it starts and through
write_atomically to write: a trace store (or any SQLite database, its write-ahead log or
journal) is refused even with overwrite=True, since replacing it loses every run in it;
any other existing file is replaced only with overwrite=True (the CLI's --force, a save
dialog's own confirmation)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from specscope.storage.errors import TraceStoreError

SQLITE_MAGIC = b"SQLite format 3\x00"
WAL_MAGICS = (b"\x37\x7f\x06\x82", b"\x37\x7f\x06\x83")
SIDE_FILES = ("-wal", "-shm", "-journal")  # SQLite's files beside a database


def is_database_file(path: str | os.PathLike[str]) -> bool:
    """An SQLite database, or a file SQLite keeps beside one (-wal, -shm, -journal)."""
    p = Path(path)
    try:
        with open(p, "rb") as fh:
            head = fh.read(len(SQLITE_MAGIC))
    except OSError:
        head = b""
    if head == SQLITE_MAGIC or head[:4] in WAL_MAGICS:
        return True
    name = os.fspath(p)
    return any(name.endswith(side) and is_database_file(name[: -len(side)]) for side in SIDE_FILES)


def check_output(path: str | os.PathLike[str], overwrite: bool = False) -> None:
    """Refuse to write `path` (TraceStoreError, one line) when it is a folder or a database,
    or when it exists and overwrite is False. Nothing is created."""
    p = Path(path)
    if p.is_dir():
        raise TraceStoreError(f"{os.fspath(path)} is a folder: give a file name to write")
    if not (p.exists() or p.is_symlink()):
        return
    if is_database_file(p):
        raise TraceStoreError(
            f"{os.fspath(path)} is an SQLite database (a trace store?): specscope never writes "
            f"over one, even with --force; choose another file"
        )
    if not overwrite:
        raise TraceStoreError(f"{os.fspath(path)} already exists; pass --force to replace it")


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def write_atomically(path: str | os.PathLike[str], overwrite: bool = False) -> Iterator[IO[str]]:
    """A text file object whose content replaces `path` when the block ends without an
    error (a failed or cancelled write leaves `path` as it was). check_output runs before
    and again at the end; without overwrite, a file that appeared meanwhile is kept."""
    check_output(path, overwrite)
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    try:
        os.chmod(tmp, 0o666 & ~_umask())
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            yield fh
        check_output(path, overwrite)
        if overwrite:
            os.replace(tmp, target)
        else:
            _link_new(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)


def _link_new(tmp: str, target: Path) -> None:
    """Put `tmp` at `target` only if nothing is there (a hard link fails on an existing
    name, so no other file is replaced even in a race)."""
    try:
        os.link(tmp, target)
    except FileExistsError:
        raise TraceStoreError(f"{target} already exists; pass --force to replace it") from None
    except OSError:  # a file system without hard links: checked just above
        os.replace(tmp, target)
