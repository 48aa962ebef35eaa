"""The window's trace menu: open a store, pick one of its runs (a table with what tells runs
apart), diff two runs, and put a replayed run's settings in the run panel, saying where the
panel no longer matches the trace."""

from __future__ import annotations

import logging
import os
from typing import Any

from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QHeaderView,
    QInputDialog,
    QMessageBox,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
)

from .runmodel import visible_text
from .settings import spec_of_run
from .traces import TraceLibrary, describe_run
from .worker import IDLE

log = logging.getLogger(__name__)

TRACE_FILTER = "Trace stores (*.sqlite *.sqlite3 *.db);;All files (*)"
PICKER_COLUMNS = ("run", "status", "proposer", "k", "T", "seed", "rounds", "tokens", "stop", "findings",
                  "prompt starts")
CHECK_ROUNDS = 20_000  # the picker checks runs (for their finding counts) up to this many rounds in all
PROMPT_START = 32


def finding_counts(library: TraceLibrary, runs: list[Any]) -> list[str]:
    """Each run's finding count from the checker ("—" past CHECK_ROUNDS rounds in all)."""
    from specscope.core.check.checker import check_run

    out, budget = [], CHECK_ROUNDS
    for info in runs:
        if info.n_rounds > budget:
            out.append("—")
            continue
        budget -= info.n_rounds
        try:
            out.append(str(len(check_run(info.config, list(library.store.iter_rounds(info.run_id, full=True))))))
        except Exception:  # noqa: BLE001 - a count is a convenience
            out.append("?")
    return out


def run_row(info: Any, prompt: str | None, findings: str = "—") -> list[str]:
    """The picker's cells for one run."""
    cfg = info.config
    tokens = getattr(info, "n_new_tokens", None)
    if tokens is None:
        tokens = len(getattr(info, "new_tokens", ()))
    start = visible_text(prompt or "")[:PROMPT_START] if prompt else f"{len(cfg.prompt_ids)} token ids"
    return [info.run_id[:8], info.status, cfg.draft_name or cfg.proposer, str(cfg.k),
            f"{cfg.sampling.temperature:g}", str(cfg.seed), str(info.n_rounds), str(tokens),
            info.stop_reason or "—", findings, start]


def pick_run(parent, runs: list[Any], prompts: list[str | None], title: str = "Open trace",
             findings: list[str] | None = None) -> str | None:
    """A table of the runs; the chosen run's id (None when cancelled)."""
    dialog = QDialog(parent)
    dialog.setWindowTitle(title)
    table = QTableWidget(len(runs), len(PICKER_COLUMNS))
    table.setHorizontalHeaderLabels(PICKER_COLUMNS)
    table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
    table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
    table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
    for i, (info, prompt) in enumerate(zip(runs, prompts)):
        for j, text in enumerate(run_row(info, prompt, findings[i] if findings else "—")):
            item = QTableWidgetItem(text)
            item.setToolTip(describe_run(info) + (f"\n{prompt[:400]}" if prompt else ""))
            table.setItem(i, j, item)
    table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
    table.horizontalHeader().setStretchLastSection(True)
    table.selectRow(0)
    buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Open | QDialogButtonBox.StandardButton.Cancel)
    buttons.accepted.connect(dialog.accept)
    buttons.rejected.connect(dialog.reject)
    table.doubleClicked.connect(lambda _: dialog.accept())
    layout = QVBoxLayout(dialog)
    layout.addWidget(table)
    layout.addWidget(buttons)
    dialog.resize(900, 360)
    if dialog.exec() != QDialog.DialogCode.Accepted:
        return None
    row = table.currentRow()
    return runs[row].run_id if 0 <= row < len(runs) else None


class TraceDialogs:
    """Mixed into MainWindow: everything that opens a trace store."""

    def open_trace_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open a trace", str(self.last_trace or ""), TRACE_FILTER)
        if path:
            self.open_trace(path)

    def open_last_trace(self) -> None:
        if self.last_trace and os.path.exists(str(self.last_trace)):
            self.open_trace(str(self.last_trace))
        else:
            self.show_error("No trace was opened before (or it has moved).")

    def open_recording_store(self) -> None:
        """The store live runs are recorded to: pick one of its runs to replay."""
        from .traces import default_trace_path

        from specscope.storage import TraceStoreError

        try:
            path = self.store_path or default_trace_path()
        except TraceStoreError as exc:  # no home directory: there is no default store
            self.show_error(str(exc))
            return
        if os.path.exists(path):
            self.open_trace(path)
        else:
            self.show_error(f"No run has been recorded yet ({path} does not exist).")

    def ask(self, title: str, question: str) -> bool:
        """A yes/no question (tests replace it)."""
        answer = QMessageBox.question(self, title, question)
        return answer == QMessageBox.StandardButton.Yes

    def _choose_run(self, library: TraceLibrary, runs: list[Any]) -> str | None:
        if len(runs) == 1:
            return runs[0].run_id
        prompts = [r.prompt_text or self.decode_prompt(r) for r in runs]
        return pick_run(self, runs, prompts, findings=finding_counts(library, runs))

    def open_trace(self, path: str, run_id: str | None = None) -> bool:
        """Open a trace store (a file, or a database URL) and replay one of its runs (asks
        which when there are several, and before replacing a live run that is going)."""
        if "://" not in path and not os.path.exists(path):
            self.show_error(f"No such trace file: {path}")
            return False
        try:
            library = TraceLibrary(path)
            runs = library.runs()
        except Exception as exc:  # noqa: BLE001 - not a trace, corrupt, newer schema...
            self.show_error(f"Cannot open {os.path.basename(path)}: {exc}", title="Open trace")
            return False
        info = self._open_run(library, path, runs, run_id)
        if info is None:
            library.close()
            return False
        try:
            self._open_partner(library, path, info)
        except Exception:  # noqa: BLE001 - the single run still replays
            log.exception("could not open the run's comparison")
        self.replay_trace(library, path, info)
        return True

    def _open_run(self, library: TraceLibrary, path: str, runs: list[Any], run_id: str | None) -> Any:
        if not runs:
            self.show_error(f"{os.path.basename(path)} holds no runs.", title="Open trace")
            return None
        if run_id is None:
            run_id = self._choose_run(library, runs)
            if run_id is None:
                return None
        matches = [r.run_id for r in runs if r.run_id.startswith(run_id)]
        if len(matches) != 1:
            self.show_error(f"{os.path.basename(path)} has {'no' if not matches else 'several'} run(s) "
                            f"matching {run_id!r}.", title="Open trace")
            return None
        try:
            info = library.run(matches[0])
        except Exception as exc:  # noqa: BLE001
            self.show_error(f"Cannot read run {run_id}: {exc}", title="Open trace")
            return None
        if self.live.busy and not self.ask("Open trace", "A live run is going. Stop it and replay the trace?"):
            return None
        return info

    def compare_stored_dialog(self, path: str | None = None) -> bool:
        """File > Compare two runs: any two runs of a store side by side on the Compare tab."""
        if path is None:
            path, _ = QFileDialog.getOpenFileName(self, "Compare two runs", str(self.last_trace or ""), TRACE_FILTER)
        if not path:
            return False
        try:
            library = TraceLibrary(path)
            runs = library.runs()
        except Exception as exc:  # noqa: BLE001
            self.show_error(f"Cannot open {os.path.basename(path)}: {exc}", title="Compare two runs")
            return False
        try:
            if len(runs) < 2:
                self.show_error(f"{os.path.basename(path)} holds {len(runs)} run(s); a comparison needs two.",
                                title="Compare two runs")
                return False
            prompts = [r.prompt_text or self.decode_prompt(r) for r in runs]
            picked = [pick_run(self, runs, prompts, f"Compare two runs: run {which}") for which in "AB"]
        finally:
            library.close()
        if None in picked:
            return False
        return self.compare_stored(path, picked[0], picked[1])

    def compare_stored(self, path: str, run_a: str, run_b: str, show: bool = True) -> bool:
        """Read two stored runs into the Compare tab's lanes."""
        try:
            library = TraceLibrary(path)
            try:
                infos = [library.run(r) for r in (run_a, run_b)]
                lanes = [(info, library.rounds(info.run_id), self._token_text_for(info)) for info in infos]
            finally:
                library.close()
        except Exception as exc:  # noqa: BLE001 - never a traceback in the GUI
            self.show_error(f"Cannot read these runs: {exc}", title="Compare two runs")
            return False
        self.compare_session.load(lanes, path)
        if show:
            self.tabs.setCurrentWidget(self.compare)
        return True

    def _open_partner(self, library: TraceLibrary, path: str, info: Any) -> None:
        """A run recorded by compare mode: its comparison opens side by side on the Compare tab."""
        from .compare_session import comparison_of

        mine = comparison_of(info)
        if mine is None:
            return
        partner = next((r for r in library.runs() if r.run_id != info.run_id
                        and (comparison_of(r) or ("", ""))[0] == mine[0]), None)
        if partner is None:
            return
        a, b = (info.run_id, partner.run_id) if mine[1] == "A" else (partner.run_id, info.run_id)
        if self.compare_stored(path, a, b, show=False):
            self.statusBar().showMessage(f"Run {info.run_id[:8]} is lane {mine[1]} of a comparison: both lanes are "
                                         f"on the Compare tab.", 15000)

    def diff_runs_dialog(self, path: str | None = None) -> str | None:
        """Pick a trace store and two of its runs; show `specscope diff` of them."""
        if path is None:
            path, _ = QFileDialog.getOpenFileName(self, "Diff two runs", str(self.last_trace or ""), TRACE_FILTER)
        if not path:
            return None
        try:
            library = TraceLibrary(path)
        except Exception as exc:  # noqa: BLE001 - not a trace, corrupt, newer schema...
            self.show_error(f"Cannot open {os.path.basename(path)}: {exc}", title="Diff runs")
            return None
        try:
            runs = library.runs()
            if len(runs) < 2:
                self.show_error(f"{os.path.basename(path)} holds {len(runs)} run(s); a diff needs two.", title="Diff runs")
                return None
            labels = [describe_run(r) for r in runs]
            picked = []
            for which in ("A", "B"):
                choice, ok = QInputDialog.getItem(self, "Diff runs", f"Run {which}:", labels, len(picked), False)
                if not ok:
                    return None
                picked.append(runs[labels.index(choice)].run_id)
            text = library.diff(*picked)
        except Exception as exc:  # noqa: BLE001 - never a traceback in the GUI
            self.show_error(f"Cannot diff these runs: {exc}", title="Diff runs")
            return None
        finally:
            library.close()
        QMessageBox.information(self, "Diff runs", text)
        return text

    # ------------------------------------------------------------------ the run panel

    def decode_prompt(self, info: Any) -> str | None:
        """The run's prompt text: stored, or decoded from its prompt ids with the tokenizer
        when the run's vocabulary is the bundled one's (None otherwise)."""
        if info.prompt_text:
            return info.prompt_text
        try:
            tok = self.hub.tokenizer()
            if tok is None or (info.config.vocab_size and len(tok) > info.config.vocab_size):
                return None
            return tok.decode(list(info.config.prompt_ids))
        except Exception:  # noqa: BLE001 - only a convenience
            log.exception("could not decode the prompt")
            return None

    def show_trace_settings(self, info: Any) -> None:
        """Put the replayed run's settings in the run panel, so Run reproduces it; say what
        differs when the panel cannot hold the trace's exact settings."""
        cfg = info.config
        proposer = spec_of_run(cfg.proposer, cfg.proposer_params, cfg.draft_name)
        texts = {"k": str(cfg.k), "temperature": f"{cfg.sampling.temperature:g}", "top_k": str(cfg.sampling.top_k),
                 "top_p": f"{cfg.sampling.top_p:g}", "seed": str(cfg.seed), "max_new_tokens": str(cfg.max_new_tokens),
                 "eos": "none" if cfg.eos_token_id is None else str(cfg.eos_token_id)}
        if proposer:
            texts["proposer"] = proposer
        prompt = self.decode_prompt(info)
        if prompt is not None:
            texts["prompt"] = prompt
        self.trace_texts = None  # set_texts below must not compare against another trace
        self.run_panel.set_texts(texts)
        self.trace_texts = {k: v for k, v in self.run_panel.texts().items() if k in texts}
        self.replay_mismatch = self.panel_mismatch(info)
        note = f" Not reproducible from the panel: {'; '.join(self.replay_mismatch)}." if self.replay_mismatch else ""
        self.trace_label = f"Replaying run {info.run_id[:8]} ({info.status}); Run starts these settings live.{note}"
        self.run_panel.set_state(IDLE, self.trace_label)

    def panel_edited(self) -> None:
        """While replaying: say when the run panel no longer holds the trace's settings."""
        texts = getattr(self, "trace_texts", None)
        if self.mode != "replay" or not texts or self.replay.info is None:
            return
        now = self.run_panel.texts()
        changed = [k for k, v in texts.items() if now.get(k) != v]
        info = self.replay.info
        if changed:
            self.run_panel.state_label.setText(
                f"Replaying run {info.run_id[:8]}; the panel no longer matches the trace ({', '.join(changed)} "
                f"changed): Run starts the panel's settings.")
        else:
            self.run_panel.state_label.setText(self.trace_label)

    def panel_mismatch(self, info: Any) -> list[str]:
        """What in the run panel does not reproduce the trace (empty when Run would)."""
        out = []
        cfg = info.config
        prompt = self.decode_prompt(info)
        if prompt is None:
            out.append("the prompt (no text stored and the run's tokenizer is not the bundled one)")
        else:
            try:
                tok = self.hub.tokenizer()
                ids = self.hub.encode(prompt, tok, cfg.vocab_size or 1)
                if tuple(ids) != tuple(cfg.prompt_ids):
                    out.append("the prompt (its text re-encodes to other token ids)")
            except Exception:  # noqa: BLE001
                out.append("the prompt (it could not be re-encoded)")
        if spec_of_run(cfg.proposer, cfg.proposer_params, cfg.draft_name) is None:
            out.append(f"the proposer {cfg.draft_name or cfg.proposer}")
        return out

    # ------------------------------------------------------------------ replay

    def replay_trace(self, library, path: str, info) -> None:
        """Make the replay session active on `info`'s run (the live run, if any, stops)."""
        self.live.stop()
        self.live.active = False
        self.session = self.replay
        self.replay.open(library, path, info)
        self.findings.set_findings([], checked=False)
        try:
            self.show_trace_settings(info)
        except Exception:  # noqa: BLE001 - only a convenience
            log.exception("could not show the trace's settings")
        self.setWindowTitle(f"specscope — {path.rsplit('/', 1)[-1]} · {describe_run(info)}")
        self.tabs.setCurrentWidget(self.page)
        self.qsettings.setValue("trace/last", path)
        self.last_trace = path
        self._update_status()

    def _token_text_for(self, info):
        """Token text for a replayed run, decoded with the tokenizer the run recorded
        (traces.replay_tokenizer); where it is not here, the ids, and the status bar says why."""
        from specscope.core.loading.models import bundled_path

        from .traces import replay_tokenizer

        try:
            tok, why = replay_tokenizer(info, self.hub.tokenizer, bundled_path("target"))
        except Exception as exc:  # noqa: BLE001 - fall back to ids, and say so
            tok, why = None, f"cannot load this run's tokenizer ({exc}): showing token ids"
        if why:
            self.statusBar().showMessage(why, 15000)
        return self.hub.token_text(tok)

    def _replay_done(self) -> None:
        self._run_checker()
        self.statusBar().showMessage(f"Loaded {len(self.model.rounds)} rounds from {self.replay.trace_path}", 8000)

    def _leave_replay(self) -> None:
        self.replay.close()
        self.session = self.live
        self.live.active = True

    def toggle_replay_play(self) -> None:
        if self.session.can_play():
            self.follow_latest = False
            self.replay.toggle_play()
