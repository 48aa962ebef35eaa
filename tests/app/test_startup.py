"""Issue 32 item 8: start-up and the platform."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_help_imports_no_torch():
    """`specscope --help` spent 5 of its 9 s importing torch (the run parser's list of
    proposer kinds, and the bench package)."""
    code = (
        "import sys\nfrom specscope.app.cli.entry import main\ntry:\n    main(['--help'])\n"
        "except SystemExit:\n    pass\nprint('TORCH', 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
    assert "usage: specscope" in out and "TORCH False" in out


def _imports_torch(argv: list[str]) -> tuple[bool, str]:
    """Run `specscope ARGV` in a fresh interpreter: (whether torch got imported, its output)."""
    code = (
        "import sys\nfrom specscope.app.cli.entry import main\ntry:\n    code = main(sys.argv[1:])\n"
        "except SystemExit:\n    pass\nprint('TORCH', 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120)
    return "TORCH True" in done.stdout, done.stdout + done.stderr


def test_trace_commands_import_no_torch(tmp_path):
    """Item 8: `specscope check` and `runs` read a trace and need no model; they spent most of
    their time importing torch (the checker reached it through the verifiers)."""
    from specscope.storage import TraceStore, TraceWriter
    from tests.storage.helpers import synthetic_config, synthetic_rounds

    path = tmp_path / "store.sqlite"
    config = synthetic_config()
    with TraceStore(path) as store, TraceWriter(store, config) as writer:
        for rnd in synthetic_rounds(config, 12):
            writer.write(rnd)
    jsonl = tmp_path / "run.jsonl"
    for argv in (
        ["check", str(path)],
        ["runs", str(path)],
        ["show", str(path), "last"],
        ["export", str(path), "last", "-o", str(jsonl)],
    ):
        torch_imported, out = _imports_torch(argv)
        assert "TORCH" in out and not torch_imported, (argv, out)
    assert config.run_id in _imports_torch(["check", str(path)])[1]  # it did check the run
    assert jsonl.stat().st_size > 0  # and export did export it


def test_run_help_still_lists_the_proposer_kinds(capsys):
    from specscope.app.cli.entry import main

    with pytest.raises(SystemExit):
        main(["run", "--help"])
    assert "proposer kinds (--proposer" in capsys.readouterr().out


def test_a_missing_libxcb_cursor_is_named_with_its_apt_command(monkeypatch, capsys):
    """A fresh Debian failed with Qt's "Could not load the Qt platform plugin xcb"."""
    import ctypes

    from specscope.app import gui

    def no_library(name, *args, **kwargs):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.delenv("QT_QPA_PLATFORM", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.setenv("DISPLAY", ":0")
    monkeypatch.setattr(ctypes, "CDLL", no_library)
    assert gui.missing_xcb_cursor()
    assert gui.launch() == 1
    assert "sudo apt-get install libxcb-cursor0" in capsys.readouterr().err
    monkeypatch.setenv("QT_QPA_PLATFORM", "offscreen")
    assert not gui.missing_xcb_cursor()


def test_every_missing_xcb_library_is_named_in_one_apt_command(monkeypatch, capsys):
    """With libxcb-cursor0 installed but libxcb-icccm4 and libxcb-keysyms1 missing (a minimal
    Debian), Qt still says it needs libxcb-cursor0 and fails; specscope said nothing."""
    import ctypes

    from specscope.app import gui

    absent = {"libxcb-icccm.so.4", "libxcb-keysyms.so.1"}

    def some_libraries(name, *args, **kwargs):
        if name in absent:
            raise OSError(f"{name}: cannot open shared object file")
        return object()

    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.delenv("QT_QPA_PLATFORM", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.setenv("DISPLAY", ":0")
    monkeypatch.setattr(ctypes, "CDLL", some_libraries)
    assert gui.missing_xcb_packages() == ["libxcb-icccm4", "libxcb-keysyms1"]
    assert gui.launch() == 1
    err = capsys.readouterr().err
    assert "sudo apt-get install libxcb-icccm4 libxcb-keysyms1" in err and err.count("\n") == 1


def test_quitting_hides_the_window_before_stopping_the_decoder(qtbot, window, monkeypatch):
    """Quitting took 3-8 s: the worker finishes the model load or round in progress first."""
    seen = []
    real = window.live.close
    monkeypatch.setattr(window.live, "close", lambda: (seen.append(window.isVisible()), real()))
    window.close()
    assert seen == [False]
