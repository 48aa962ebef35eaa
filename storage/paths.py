"""Where the trace store lives by default."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from specscope.storage.errors import TraceStoreError

APP_NAME = "specscope"
DB_FILENAME = "traces.sqlite"
ENV_DB = "SPECSCOPE_DB"  # overrides the default location (a path or an SQLAlchemy URL)


def home() -> Path:
    """The user's home folder; a TraceStoreError (one line) when there is none (HOME unset
    and no passwd entry for this user): only what needs the default store fails."""
    try:
        return Path.home()
    except (RuntimeError, KeyError):
        raise TraceStoreError(
            f"no home directory (HOME is unset and user {os.getuid() if hasattr(os, 'getuid') else '?'} "
            f"has no passwd entry), so there is no default trace store: pass --db or set "
            f"{ENV_DB} (or XDG_DATA_HOME)"
        ) from None


def user_data_dir() -> Path:
    """The platform's per-user data directory for specscope (not created here).

    Linux/BSD: $XDG_DATA_HOME/specscope, default ~/.local/share/specscope
    macOS:     ~/Library/Application Support/specscope
    Windows:   %LOCALAPPDATA%\\specscope (falls back to %APPDATA%, then the home folder)
    """
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or os.environ.get("APPDATA") or str(home() / "AppData" / "Local")
        return Path(base) / APP_NAME
    if sys.platform == "darwin":
        return home() / "Library" / "Application Support" / APP_NAME
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else home() / ".local" / "share"
    return base / APP_NAME


def default_db_location() -> str:
    """$SPECSCOPE_DB if set, else <user data dir>/traces.sqlite (TraceStoreError without a home)."""
    env = os.environ.get(ENV_DB)
    if env:
        return env
    return str(user_data_dir() / DB_FILENAME)


def describe_default_location() -> str:
    """The default store for help texts: never fails (a missing home is said, not raised)."""
    try:
        return default_db_location()
    except TraceStoreError:
        return f"${ENV_DB}; none is set and there is no home directory"
