"""The checker's side of the window: run it when a run ends or a replay is loaded, show its
findings, jump to one, and the deep recompute check (Run > Recompute check). Owned by the
window (`window.checks`)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any, Protocol

from PySide6.QtWidgets import QDockWidget, QMessageBox, QStatusBar, QWidget

from specscope.app.gui.model.runmodel import RunModel
from specscope.app.gui.model.targets import target_of_run
from specscope.app.gui.sessions.hub import ModelHub
from specscope.app.gui.sessions.live import LiveSession
from specscope.app.gui.sessions.protocol import InspectSession
from specscope.app.gui.views.findings import FindingsWidget
from specscope.app.gui.views.runpanel import RunPanelWidget

log = logging.getLogger(__name__)


class CheckWindow(Protocol):
    """What CheckActions uses of the window (a QWidget: the parent of its message boxes)."""

    hub: ModelHub
    live: LiveSession
    session: InspectSession
    model: RunModel
    run_panel: RunPanelWidget
    findings: FindingsWidget
    findings_dock: QDockWidget
    checker: Any  # callable(config, rounds, end=None) -> CheckReport or a list of findings

    def statusBar(self) -> QStatusBar: ...

    def show_error(self, message: str, details: str = "", title: str = "specscope") -> None: ...

    def jump_to(self, rnd: int, pos: int) -> None: ...


class CheckActions:
    def __init__(self, window: CheckWindow):
        self.w = window

    def parent(self) -> QWidget | None:
        """The message boxes' parent: the window."""
        return self.w if isinstance(self.w, QWidget) else None

    def recompute_check(self) -> list | None:
        """Recompute every round's p with the target from the full prefix (no cache) and
        compare with the recorded p: the check that catches stale cache state. Needs the
        run's target (the bundled one, the tiny model for tiny runs, a fetched model by name
        or a checkpoint folder that is still there)."""
        from specscope.core.check.checker import recompute_findings

        w = self.w
        if w.model.config is None or not w.model.rounds:
            w.show_error("Nothing to check yet: run or open a trace first.", title="Recompute check")
            return None
        if w.live.busy:
            w.show_error("Wait for the run to finish (or stop it) before recomputing.", title="Recompute check")
            return None
        w.statusBar().showMessage("Recomputing every round with the target…")
        try:
            device = w.run_panel.texts().get("device") or "cpu"
            name = target_of_run(w.model.config.target_name)  # the run's own target, not the menu's
            if name is None:
                raise ValueError(f"the run's target {w.model.config.target_name} is not on this machine")
            target, _ = w.hub.target(device if device in w.hub.devices() else "cpu", name)
            found = recompute_findings(w.model.config, self.rounds_for_checking(), target)
        except Exception as exc:  # noqa: BLE001 - never a traceback in the GUI
            w.show_error(f"The recompute check failed: {exc}", title="Recompute check")
            return None
        self.set_findings(list(w.model.findings) + list(found))
        text = (
            f"{len(found)} round(s) whose recorded p differs from a full recompute of the target"
            if found
            else "every round's recorded p matches a full recompute of the target"
        )
        w.statusBar().showMessage(f"Recompute check: {text}", 15000)
        QMessageBox.information(self.parent(), "Recompute check", text[0].upper() + text[1:] + ".")
        return list(found)

    def reference_check(self) -> Any | None:
        """Run > Compare with plain greedy: decode the run's prompt plainly with its target
        and classify the first difference from the run's output as a near tie or a logic bug
        (core.check.diverge); the timeline jumps to it. Greedy runs only."""
        from specscope.core.check.diverge import diverge_report
        from specscope.core.decode.stops import token_piece_function
        from specscope.core.loading.text import token_label

        w = self.w
        title = "Compare with plain greedy"
        if w.model.config is None or not w.model.rounds:
            w.show_error("Nothing to compare yet: run or open a trace first.", title=title)
            return None
        if w.live.busy:
            w.show_error("Wait for the run to finish (or stop it) before comparing.", title=title)
            return None
        config = w.model.config
        if not config.sampling.greedy:
            w.show_error(
                f"This run was sampled at temperature {config.sampling.temperature:g}: divergence from plain "
                "greedy decoding is only defined at temperature 0.",
                title=title,
            )
            return None
        w.statusBar().showMessage("Decoding the prompt plainly with the target…")
        try:
            target, tokenizer = self._target_at(config)
            piece = token_piece_function(tokenizer) if tokenizer is not None else None  # the run's stop strings
            found = diverge_report(config, self.rounds_for_checking(), target, token_piece=piece)
        except Exception as exc:  # noqa: BLE001 - never a traceback in the GUI
            w.show_error(f"The comparison with plain greedy decoding failed: {exc}", title=title)
            return None
        lines = found.lines(lambda t: token_label(tokenizer, t))
        w.statusBar().showMessage(f"{title}: {lines[0]}", 15000)
        if found.round is not None:
            self.jump_to_finding(SimpleNamespace(round=found.round, position=found.position, node=None))
        QMessageBox.information(self.parent(), title, "\n".join(lines))
        return found

    def _target_at(self, config: Any) -> tuple[Any, Any]:
        """The run's own target (and tokenizer; the one it recorded, not the run panel's menu
        nor the bundled one) in the run's dtype: a near tie is a fact of the dtype."""
        import copy

        import torch

        w = self.w
        device = w.run_panel.texts().get("device") or "cpu"
        name = target_of_run(config.target_name)
        if name is None:
            raise ValueError(f"the run's target {config.target_name} is not on this machine")
        target, tokenizer = w.hub.target(device if device in w.hub.devices() else "cpu", name)
        wanted = getattr(torch, config.dtype, None)
        if isinstance(wanted, torch.dtype) and next(target.parameters()).dtype != wanted:
            target = copy.deepcopy(target).to(wanted)  # the hub's model stays as the run panel uses it
        return target, tokenizer

    def set_findings(self, findings: Iterable[Any], not_checked: dict[str, str] | None = None) -> None:
        """Show the checker's findings (objects/dicts with round, position, rule, message) and
        what it could not check (rule -> why; None: as before)."""
        self.w.model.set_findings(findings, not_checked)
        self.w.findings.set_not_checked(self.w.model.not_checked)

    def rounds_for_checking(self) -> Iterable[Any]:
        return self.w.session.rounds_for_checking()

    def report(self) -> Any:
        """The checker's report on the run shown: of a stored run, what `specscope check`
        prints (storage.checking.check_stored_run: its rounds and its end record); of a live
        run, the same rules with the end the recording will store (its stop reason and token
        count)."""
        w = self.w
        stored = w.session.store_and_run() if w.session is not w.live else None
        if stored is not None:
            from specscope.storage.checking import check_stored_run

            return check_stored_run(*stored)
        end = self.live_end()
        if end is not None:
            return w.checker(w.model.config, self.rounds_for_checking(), end=end)
        return w.checker(w.model.config, self.rounds_for_checking())

    def live_end(self) -> Any:
        """The end record a finished live run is stored with (storage's RunInfo.end of a
        completed run), None while it runs or when it did not complete."""
        from specscope.core.records import RunEnd

        m = self.w.model
        if m.stop_reason not in ("eos", "stop", "budget"):
            return None
        return RunEnd("completed", m.stop_reason, len(m.output_tokens))

    def run_checker(self) -> None:
        w = self.w
        if w.checker is None or not w.model.rounds or w.model.config is None:
            return
        try:
            report = self.report()
        except Exception as exc:
            log.exception("the checker failed")
            w.findings.set_error(str(exc))
            return
        # a CheckReport (the default checker) says what it could not check; a plain list does not
        found = list(getattr(report, "findings", report))
        self.set_findings(found, dict(getattr(report, "not_checked", {})))
        if found:
            w.findings_dock.raise_()
            w.statusBar().showMessage(f"The checker found {len(found)} problem(s); see Findings.", 15000)

    def jump_to_finding(self, f) -> None:
        cells = self.w.model.cells
        pos = -1
        position = f.position
        if position is None and str(f.rule).startswith("stop"):
            position = self.stop_position(f.round)  # a stop finding is about the token that completes the stop
        if f.node is not None:
            pos = f.node
        elif position is not None and 0 <= position < len(cells.out_cell):
            cell = cells.cell(cells.out_cell[position])
            if cell.round == f.round:
                pos = cell.pos
        self.w.jump_to(f.round, pos)

    def stop_position(self, rnd: int) -> int | None:
        """The output position of the token that completes round `rnd`'s stop (its recorded
        stop, else the round's last token: a stop completes there); None without tokens. A
        stop-flag finding once selected the round's rejected node instead."""
        rounds = self.w.model.rounds
        if not 0 <= rnd < len(rounds):
            return None
        r = rounds[rnd]
        if not r.emitted:
            return None
        stop = r.stop
        at = stop.position if stop is not None and 0 <= stop.position < len(r.emitted) else len(r.emitted) - 1
        return r.emitted_before + at
