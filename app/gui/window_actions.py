"""What the run buttons and keys do, routed to the active session (mixed into MainWindow):
run, step, pause and stop a live run; play a replay; start a comparison; recompute the
deep replay check."""

from __future__ import annotations

import logging
from typing import Any, Iterable

from PySide6.QtWidgets import QMessageBox

from .settings import RunSettings
from .worker import LOADING, RUNNING

log = logging.getLogger(__name__)


class WindowActions:
    def _full_vectors_toggled(self, checked: bool) -> None:
        self.recording.full_vectors = checked
        self.qsettings.setValue("recording/full_vectors", "true" if checked else "false")
        self.statusBar().showMessage(
            "The next recorded runs keep full probability vectors" if checked
            else "The next recorded runs keep the top-N of each distribution (full vectors for vocabularies up to 1024)", 8000)

    def validated_settings(self) -> RunSettings | None:
        v = self.run_panel.validate()
        if not v.ok:
            self._cannot_run(v.errors)
            return None
        return v.settings

    def refused(self, errors: dict[str, str]) -> None:
        """The worker refused the settings with the models loaded (core.decode.factory: the
        prompt plus the budget past the position limit, an EOS outside the vocabulary): each
        message under its field, as the CLI refuses them; no run started."""
        self.run_panel.show_errors(errors)
        self._cannot_run(errors)

    def _cannot_run(self, errors: dict[str, str]) -> None:
        first = next(iter(errors.values()), "")
        self.statusBar().showMessage(f"Cannot run: {first}", 10000)
        self.last_error = first

    def start_run(self, run: bool = True) -> bool:
        settings = self.validated_settings()
        if settings is None:
            return False
        self._leave_replay()
        self.findings.set_findings([], checked=False)
        self.live.start(settings, run=run)
        self.setWindowTitle(f"specscope — live: {settings.describe()}")
        return True

    def run_or_resume(self) -> None:
        self.session.run_key(self.start_run)

    def toggle_run(self) -> None:
        if self.tabs.currentWidget() is self.compare:
            if self.compare_controller.state in (RUNNING, LOADING):
                self.compare_session.stop()
            else:
                self.start_compare()
            return
        self.session.space_key(self.start_run)

    def pause(self) -> None:
        self.live.pause()

    def step(self) -> None:
        self.session.step_key(self.start_run)

    def step_or_next(self) -> None:
        if self.session.browses():
            self.follow_latest = False
            self.navigator.next()
        else:
            self.step()

    def stop(self) -> None:
        self.live.stop()

    def _on_state(self, state: str) -> None:
        if self.session.shows_run_state:
            self.run_panel.set_state(state)
            if self.live.activity_text:
                self._on_activity(self.live.activity_text)
        self._update_status()

    def _on_live_finished(self, reason: str) -> None:
        self._run_checker()
        m = self.model.metrics
        self.statusBar().showMessage(
            f"Run finished ({reason}): {m.emitted_total} tokens in {len(m)} rounds, "
            f"mean accepted length {m.mean_accepted_length:.2f}", 15000)

    # ------------------------------------------------------------------ compare

    def start_compare(self) -> None:
        self.tabs.setCurrentWidget(self.compare)
        pair = self.compare.settings_pair(self.run_panel.texts(), self.hub.devices())
        if pair is None:
            base = self.run_panel.validate()
            msg = next(iter(base.errors.values()), "check the proposers and k of A and B")
            self.statusBar().showMessage(f"Cannot compare: {msg}", 10000)
            self.last_error = msg
            return
        self.compare_session.start(*pair)

    # ------------------------------------------------------------------ deep check

    def recompute_check(self) -> list | None:
        """Recompute every round's p with the target from the full prefix (no cache) and
        compare with the recorded p: the check that catches stale cache state. Needs the
        run's target (the bundled one, or the tiny model for tiny runs)."""
        from specscope.core.check.checker import recompute_findings

        if self.model.config is None or not self.model.rounds:
            self.show_error("Nothing to check yet: run or open a trace first.", title="Recompute check")
            return None
        if self.live.busy:
            self.show_error("Wait for the run to finish (or stop it) before recomputing.", title="Recompute check")
            return None
        self.statusBar().showMessage("Recomputing every round with the target…")
        try:
            device = self.run_panel.texts().get("device") or "cpu"
            target, _ = self.hub.target(device if device in self.hub.devices() else "cpu")
            found = recompute_findings(self.model.config, self.rounds_for_checking(), target)
        except Exception as exc:  # noqa: BLE001 - never a traceback in the GUI
            self.show_error(f"The recompute check failed: {exc}", title="Recompute check")
            return None
        self.set_findings(list(self.model.findings) + list(found))
        text = (f"{len(found)} round(s) whose recorded p differs from a full recompute of the target"
                if found else "every round's recorded p matches a full recompute of the target")
        self.statusBar().showMessage(f"Recompute check: {text}", 15000)
        QMessageBox.information(self, "Recompute check", text[0].upper() + text[1:] + ".")
        return list(found)

    # ------------------------------------------------------------------ findings

    def set_findings(self, findings: Iterable[Any]) -> None:
        """Show the checker's findings (objects/dicts with round, position, rule, message)."""
        self.model.set_findings(findings)

    def rounds_for_checking(self) -> list:
        return self.session.rounds_for_checking()

    def _run_checker(self) -> None:
        if self.checker is None or not self.model.rounds or self.model.config is None:
            return
        try:
            found = self.checker(self.model.config, self.rounds_for_checking())
        except Exception as exc:  # noqa: BLE001
            log.exception("the checker failed")
            self.findings.set_error(str(exc))
            return
        self.set_findings(found)
        if found:
            self.findings_dock.raise_()
            self.statusBar().showMessage(f"The checker found {len(found)} problem(s); see Findings.", 15000)

    def jump_to_finding(self, f) -> None:
        pos = -1
        if f.node is not None:
            pos = f.node
        elif f.position is not None and 0 <= f.position < len(self.model.cells.out_cell):
            cell = self.model.cells.cell(self.model.cells.out_cell[f.position])
            if cell.round == f.round:
                pos = cell.pos
        self.jump_to(f.round, pos)

    def jump_to(self, rnd: int, pos: int) -> None:
        self.follow_latest = False
        self.tabs.setCurrentWidget(self.page)
        self.model.select(rnd, pos)
