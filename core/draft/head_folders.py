"""A draft head's checkpoint folder and its config.json, read without torch: the settings
check (which runs before the window has imported torch) refuses a missing folder or a bad
config with the same words the loader uses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class HeadFormatError(ValueError):
    """A head checkpoint that is not in the format its kind reads; one line says why."""


def head_folder(path: str | Path, kind: str) -> Path:
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise HeadFormatError(
            f"{kind}: {path} is not a folder (a {kind} head is a folder: config.json and its weights)"
        )
    return folder


def read_config(folder: Path, kind: str) -> dict[str, Any]:
    file = folder / "config.json"
    if not file.is_file():
        raise HeadFormatError(f"{kind}: {folder} has no config.json")
    try:
        config = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise HeadFormatError(f"{kind}: {file} is not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise HeadFormatError(f"{kind}: {file} does not hold a JSON object")
    return config


def tree_too_deep(depth: int, heads: int) -> str:
    """Why a Medusa tree deeper than its heads is refused (the loader and the settings check say it alike)."""
    return (
        f"a tree {depth} deep needs {depth} Medusa heads, this checkpoint has {heads} "
        f"(head d drafts depth d + 1: cut the tree to depth {heads})"
    )
