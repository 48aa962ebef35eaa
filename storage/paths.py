"""Where the trace store lives by default."""

from __future__ import annotations

import os
import sys
from pathlib import Path

APP_NAME = "specscope"
DB_FILENAME = "traces.sqlite"
ENV_DB = "SPECSCOPE_DB"  # overrides the default location (a path or an SQLAlchemy URL)


def user_data_dir() -> Path:
    """The platform's per-user data directory for specscope (not created here).

    Linux/BSD: $XDG_DATA_HOME/specscope, default ~/.local/share/specscope
    macOS:     ~/Library/Application Support/specscope
    Windows:   %LOCALAPPDATA%\\specscope (falls back to %APPDATA%, then the home folder)
    """
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or os.environ.get("APPDATA") or str(Path.home() / "AppData" / "Local")
        return Path(base) / APP_NAME
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / APP_NAME
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".local" / "share"
    return base / APP_NAME


def default_db_location() -> str:
    """$SPECSCOPE_DB if set, else <user data dir>/traces.sqlite."""
    env = os.environ.get(ENV_DB)
    if env:
        return env
    return str(user_data_dir() / DB_FILENAME)
