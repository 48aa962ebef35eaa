"""Plain values the read API hands out: a run's header and a per-round timeline summary."""

from __future__ import annotations

import dataclasses
import functools
import platform
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from specscope.core.records import Round, RunConfig, RunEnd

_LIBRARIES = ("specscope", "torch", "transformers", "numpy", "sqlalchemy")


def library_versions(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Versions of Python and the libraries that shape a run (read from package metadata)."""
    versions = dict(_installed_versions())
    versions.update(extra or {})
    return versions


@functools.lru_cache(maxsize=1)
def _installed_versions() -> tuple[tuple[str, str], ...]:
    versions = {"python": platform.python_version()}
    for name in _LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    versions["platform"] = sys.platform
    return tuple(versions.items())


@dataclass(frozen=True)
class ModelInfo:
    """Model identities. Names default to the RunConfig's; hashes are whatever the caller
    computed (e.g. sha256 of the weights file), stored as given."""

    target_name: str | None = None
    target_hash: str | None = None
    draft_name: str | None = None
    draft_hash: str | None = None
    tokenizer_name: str | None = None
    tokenizer_hash: str | None = None

    @classmethod
    def coerce(cls, value: ModelInfo | Mapping[str, Any] | None) -> ModelInfo:
        if value is None:
            return cls()
        if isinstance(value, ModelInfo):
            return value
        unknown = set(value) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown model_info keys: {sorted(unknown)}")
        return cls(**{k: (None if v is None else str(v)) for k, v in value.items()})


@dataclass(frozen=True)
class RunInfo:
    run_id: str
    status: str  # running | completed | interrupted | failed
    stop_reason: str | None  # eos | stop | budget | cancelled (from the GenerationResult)
    error: str | None
    started_at: float  # UTC unix seconds
    ended_at: float | None
    heartbeat_at: float | None
    writer_host: str | None
    writer_pid: int | None
    config: RunConfig
    prompt_text: str | None
    models: ModelInfo
    library_versions: dict[str, Any]
    extra: dict[str, Any]
    top_n: int
    full_vectors: bool
    full_dtype: str
    n_rounds: int
    drafted: int
    accepted: int
    n_new_tokens: int  # the tokens themselves: TraceStore.new_tokens(run_id)
    wall_s: float | None

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def end(self) -> RunEnd | None:
        """The end record, for the checker (None while the run is still being written)."""
        if self.status == "running":
            return None
        return RunEnd(self.status, self.stop_reason, self.n_new_tokens)

    @property
    def mean_accepted_length(self) -> float:
        return (self.accepted + self.n_rounds) / self.n_rounds if self.n_rounds else 0.0


def _summary_fields() -> list[tuple[str, Any, Any]]:
    """Round's fields without the draft tree and the distributions, with the tree's counts
    in their place (the stored columns n_drafted, n_accepted, draft_tokens)."""
    out: list[tuple[str, Any, Any]] = []
    for f in dataclasses.fields(Round):
        if f.name == "nodes":
            out += [
                ("drafted", int, dataclasses.field()),
                ("accepted", int, dataclasses.field()),
                ("draft_tokens", "tuple[int, ...]", dataclasses.field()),
            ]
        elif f.name not in ("bonus_p", "residual"):
            out.append((f.name, f.type, dataclasses.field()))
    return out


# A round without its distributions: what a timeline needs (read from one table). Its
# fields are Round's (declared once, in core.records), so a new round field shows up here.
RoundSummary = dataclasses.make_dataclass(
    "RoundSummary",
    _summary_fields(),
    frozen=True,
    namespace={
        "__module__": __name__,
        "__doc__": "A round without its distributions: Round's fields but nodes, bonus_p and residual, "
        "with drafted, accepted and draft_tokens instead of the nodes.",
        "tokens": Round.tokens,
        "accepted_length": Round.accepted_length,
        "repair": Round.repair,
        "bonus": Round.bonus,
    },
)
