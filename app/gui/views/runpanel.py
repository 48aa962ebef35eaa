"""The run panel: prompt, proposer and sampler settings, with errors shown next to each
field, and the Run / Pause / Step / Stop buttons. The buttons and the state line form their own
widget (`action_row`): the window pins it above the scrolling fields, so Run is visible at any
window height."""

from __future__ import annotations

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFileDialog,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QStyle,
    QVBoxLayout,
    QWidget,
)

from specscope.app.gui.model.settings import (
    DEFAULT_PROPOSER,
    ENGINES,
    MAX_K,
    PATH_ARG,
    PanelSettings,
    Validation,
    checkpoint_of,
    menu_spec,
    note_engines,
    proposer_choices,
    proposer_label,
    spec_text,
    validate,
)
from specscope.app.gui.model.tree_settings import (
    CHILDREN_MODES,
    DEFAULT_CHILDREN,
    DRAW_MODES,
    TREE_EXAMPLES,
    fold_draw,
    fold_tree,
    grows_trees,
    is_chain,
    split_draw,
    split_tree,
    takes_draw,
)
from specscope.app.gui.sessions.worker import IDLE, LOADING, PAUSED, RUNNING
from specscope.app.gui.views.target_menu import TargetMenu

ERROR_STYLE = "color:#b00020; font-size:8pt;"
ERROR_PX = 13  # an error line's height when empty; a message wraps onto as many lines as it needs
FIELD_HELP = {
    "k": f"draft tokens per round (1–{MAX_K}), or auto (chosen each round by cost); a tree's shape sets its own",
    "tree": "chain (k tokens) · branching per depth 3,2,1,1 · paths:0;1;0.0 · dynamic:nodes=16,depth=5,topk=4 "
    "(nodes=auto: width, depth and size by cost; width 1 is a chain)",
    "children": "how a tree's siblings are chosen: topk (most probable) · sampled (i.i.d. from q) · distinct "
    "(without replacement)",
    "draw": "a draft head's chain tokens at T > 0: sampled (from its q) · onehot (q's top token as a point mass, "
    "as servers that dropped draft probabilities did: vLLM #40149)",
    "temperature": "0 = greedy",
    "top_k": "0 = off",
    "top_p": "1 = off",
    "seed": "seeds every draw; stored with the run",
    "max_new_tokens": "stop after this many new tokens",
    "eos": "auto = the model's EOS ids · none · or token ids (2,107)",
    "threads": "torch CPU threads for decoding · auto = all cores but one (up to 8 cores)",
    "system": "the system turn of the chat (optional)",
    "stop_strings": "stop strings, one per line (\\n = newline): the output ends at the token completing one",
    "stop_ids": "stop token sequences: 1,2,3; 7,8",
}


BRING_INTO_VIEW_MS = 60  # a refused field scrolls into view after its message has wrapped


class RunPanelWidget(QWidget):
    runClicked = Signal()
    pauseClicked = Signal()
    stepClicked = Signal()
    stopClicked = Signal()
    edited = Signal()  # any field's text changed (by the user or set_texts)

    def __init__(self, devices: tuple[str, ...] = ("cpu",), examples: list[tuple[str, str]] | None = None, parent=None):
        super().__init__(parent)
        self.devices = devices
        self.vocab_size: int | None = None
        self.examples = list(examples or [])
        self.fields: dict[str, QWidget] = {}
        self.errors: dict[str, QLabel] = {}
        outer = QVBoxLayout(self)
        outer.setContentsMargins(6, 6, 6, 6)
        outer.addWidget(self._prompt_box())
        outer.addWidget(self._settings_box(devices))
        outer.addWidget(self._chat_box())  # after the sampler: at 1024x700 the proposer rows stay in view
        outer.addStretch(1)
        self.action_row = self._action_row()  # placed by the window, outside the scroll area

        self.set_texts(PanelSettings().to_texts())
        self._auto_proposer = self.texts()["proposer"]  # the proposer a target chose, until the person picks another
        self.set_state(IDLE)
        for w in self.fields.values():
            sig = (
                w.currentTextChanged
                if isinstance(w, QComboBox)
                else w.toggled
                if isinstance(w, QCheckBox)
                else w.textChanged
            )
            sig.connect(self._live_validate)
            sig.connect(self.edited)
        self._proposer_changed()

    # ------------------------------------------------------------------ building

    def _prompt_box(self) -> QGroupBox:
        box = QGroupBox("Prompt")
        bl = QVBoxLayout(box)
        self.example = QComboBox()
        self.example.addItem("— example prompts —", None)
        for name, text in self.examples:
            self.example.addItem(name, text)
        self.example.activated.connect(self._pick_example)
        self.example.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.example.setMinimumContentsLength(10)
        bl.addWidget(self.example)
        self.prompt = QPlainTextEdit()
        self.prompt.setPlaceholderText("Type a prompt, or pick an example above")
        self.prompt.setFixedHeight(84)
        self.prompt.setTabChangesFocus(True)
        bl.addWidget(self.prompt)
        self.fields["prompt"] = self.prompt
        bl.addWidget(self._error_label("prompt"))
        return box

    def _chat_box(self) -> QGroupBox:
        """Chat (the prompt is the user's turn; the system text its system turn) and the stops."""
        box = QGroupBox("Chat and stops")
        layout = QVBoxLayout(box)
        self.chat = QCheckBox("Chat template")  # short: the run panel must fit a 1024 px window
        self.chat.setToolTip(
            "The prompt is the user's turn and the system text the system turn, through the model's chat template"
        )
        self.chat.toggled.connect(lambda on: self.system.setEnabled(on))
        self.fields["chat"] = self.chat
        layout.addWidget(self.chat)
        self.system = QLineEdit()
        self.system.setEnabled(False)
        self.fields["system"] = self.system
        self.stop_strings = QPlainTextEdit()
        self.stop_strings.setFixedHeight(40)
        self.stop_strings.setTabChangesFocus(True)
        self.fields["stop_strings"] = self.stop_strings
        self.stop_ids = QLineEdit()
        self.fields["stop_ids"] = self.stop_ids
        for key, widget in (("system", self.system), ("stop_strings", self.stop_strings), ("stop_ids", self.stop_ids)):
            widget.setToolTip(FIELD_HELP[key])
            widget.setPlaceholderText(FIELD_HELP[key].split(" (")[0].split(":")[0])  # the whole text is the tooltip
            layout.addWidget(widget)
            layout.addWidget(self._error_label(key))
        return box

    def _settings_box(self, devices: tuple[str, ...]) -> QGroupBox:
        box = QGroupBox("Proposer and sampler")
        grid = QGridLayout(box)
        grid.setVerticalSpacing(1)
        self.target = TargetMenu()  # bundled, fetched, fetchable and local models
        self.target.targetChosen.connect(self._follow_target)
        self.fields["target"] = self.target
        first = self._add_row(grid, 0, "target", "Target", self.target)
        self.engine = QComboBox()
        self.engine.addItems(ENGINES)
        note_engines(self.engine)
        self.engine.setToolTip(
            "specscope's decoder, transformers' own generate() or vLLM's own speculative decoding, "
            "recorded round by round"
        )
        self.fields["engine"] = self.engine
        first = self._add_row(grid, first, "engine", "Engine", self.engine)
        self.proposer = QComboBox()
        for choice in proposer_choices(with_trees=False, target=""):  # the tree is its own field here
            self.proposer.addItem(choice.label, choice.spec)
        self.proposer.currentIndexChanged.connect(self._proposer_changed)
        self.fields["proposer"] = self.proposer
        row = self._add_row(grid, first, "proposer", "Proposer", self.proposer)
        row = self._add_row(grid, row, "checkpoint", "Checkpoint", self._checkpoint_row())
        row = self._tree_rows(grid, row)
        for key, label in (
            ("k", "k (draft length)"),
            ("temperature", "Temperature"),
            ("top_k", "Top-k"),
            ("top_p", "Top-p"),
            ("seed", "Seed"),
            ("max_new_tokens", "Max new tokens"),
            ("eos", "EOS"),
            ("threads", "Threads"),
        ):
            edit = QLineEdit()
            edit.setPlaceholderText(FIELD_HELP.get(key, ""))
            edit.setToolTip(FIELD_HELP.get(key, ""))
            self.fields[key] = edit
            row = self._add_row(grid, row, key, label, edit)
        self.device = QComboBox()
        self.device.setEditable(True)
        for d in devices:
            self.device.addItem(d)
        self.fields["device"] = self.device
        self._add_row(grid, row, "device", "Device", self.device)
        return box

    def _tree_rows(self, grid: QGridLayout, row: int) -> int:
        """The tree (editable: a menu of examples, any spec can be typed) and children fields."""
        self.tree = QComboBox()
        self.tree.setEditable(True)
        self.tree.addItems(TREE_EXAMPLES)
        # the menu as wide as its specs: elided, nodes=16 and nodes=auto looked alike ("dynamic:no…")
        self.tree.view().setMinimumWidth(self.tree.view().sizeHintForColumn(0) + 24)
        # a typed shape is that shape: no inline completion ("3,2,1" became "3,2,1,1" on Tab),
        # and what is typed is not added to the menu
        self.tree.setCompleter(None)
        self.tree.setInsertPolicy(QComboBox.InsertPolicy.NoInsert)
        self.tree.setToolTip(FIELD_HELP["tree"])
        self.tree.currentTextChanged.connect(self._proposer_changed)
        self.fields["tree"] = self.tree
        row = self._add_row(grid, row, "tree", "Tree", self.tree)
        self.children_mode = QComboBox()
        self.children_mode.addItems([DEFAULT_CHILDREN] + [m for m in CHILDREN_MODES if m != DEFAULT_CHILDREN])
        self.children_mode.setToolTip(FIELD_HELP["children"])
        self.fields["children"] = self.children_mode
        row = self._add_row(grid, row, "children", "Children", self.children_mode)
        self.draw = QComboBox()
        self.draw.addItems(DRAW_MODES)
        self.draw.setToolTip(FIELD_HELP["draw"])
        self.draw.currentTextChanged.connect(self._proposer_changed)
        self.fields["draw"] = self.draw
        return self._add_row(grid, row, "draw", "Draws", self.draw)

    def _checkpoint_row(self) -> QWidget:
        ck = QWidget()
        ckl = QHBoxLayout(ck)
        ckl.setContentsMargins(0, 0, 0, 0)
        self.checkpoint = QLineEdit()
        self.checkpoint.setPlaceholderText("folder with config.json + weights, or a .gguf file")
        self.checkpoint.setMinimumWidth(60)
        self.browse = QPushButton("…")
        self.browse.setFixedWidth(28)
        self.browse.setToolTip("choose a checkpoint folder")
        self.browse.clicked.connect(self._browse)
        self.browse_gguf = QPushButton("GGUF")
        self.browse_gguf.setFixedWidth(48)  # the path field keeps the width at 1024 px
        self.browse_gguf.setToolTip("choose a GGUF file (converted once and cached; the first load takes a while)")
        self.browse_gguf.clicked.connect(self._browse_gguf)
        ckl.addWidget(self.checkpoint, 1)
        ckl.addWidget(self.browse)
        ckl.addWidget(self.browse_gguf)
        self.fields["checkpoint"] = self.checkpoint
        return ck

    def _action_row(self) -> QWidget:
        """The four buttons, two by two (the panel stays narrow), and the state line under them."""
        row = QWidget()
        layout = QVBoxLayout(row)
        layout.setContentsMargins(6, 4, 6, 2)
        layout.setSpacing(2)
        layout.addLayout(self._buttons())
        self.state_label = QLabel("")
        self.state_label.setWordWrap(True)
        layout.addWidget(self.state_label)
        return row

    def _buttons(self) -> QGridLayout:
        buttons = QGridLayout()
        style = self.style()
        self.run_button = QPushButton(style.standardIcon(QStyle.StandardPixmap.SP_MediaPlay), "Run")
        self.pause_button = QPushButton(style.standardIcon(QStyle.StandardPixmap.SP_MediaPause), "Pause")
        self.step_button = QPushButton(style.standardIcon(QStyle.StandardPixmap.SP_MediaSkipForward), "Step")
        self.stop_button = QPushButton(style.standardIcon(QStyle.StandardPixmap.SP_MediaStop), "Stop")
        self.run_button.setToolTip("Run the settings below (Space)")
        self.pause_button.setToolTip("Pause the run (Space)")
        self.step_button.setToolTip("Run one round, then pause (Right)")
        self.stop_button.setToolTip("Stop the run (Ctrl+.)")
        self.run_button.setDefault(True)
        for i, (b, sig) in enumerate(
            (
                (self.run_button, self.runClicked),
                (self.pause_button, self.pauseClicked),
                (self.step_button, self.stepClicked),
                (self.stop_button, self.stopClicked),
            )
        ):
            b.clicked.connect(sig.emit)
            buttons.addWidget(b, i // 2, i % 2)
        return buttons

    def _error_label(self, key: str) -> QLabel:
        label = QLabel("")
        label.setStyleSheet(ERROR_STYLE)
        # as wide as the field, wrapped: a one-line label cut messages short ("seed must lie in
        # [0, 92233"); the empty line keeps its height, so the form moves only for an error
        label.setWordWrap(True)
        label.setMinimumHeight(ERROR_PX)
        label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Minimum)
        label.setObjectName(f"error_{key}")
        self.errors[key] = label
        return label

    def _add_row(self, grid: QGridLayout, row: int, key: str, text: str, widget: QWidget) -> int:
        if isinstance(widget, QComboBox):  # long entries must not widen the dock
            widget.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
            widget.setMinimumContentsLength(10)
        label = QLabel(text)
        label.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        grid.addWidget(label, row, 0)
        grid.addWidget(widget, row, 1)
        widget.setFixedHeight(widget.sizeHint().height())  # an error's red border must not resize it
        grid.addWidget(self._error_label(key), row + 1, 1)
        return row + 2

    # ------------------------------------------------------------------ values

    def texts(self) -> dict[str, str]:
        out = {}
        for key, w in self.fields.items():
            if isinstance(w, QPlainTextEdit):
                out[key] = w.toPlainText()
            elif isinstance(w, QCheckBox):
                out[key] = "on" if w.isChecked() else ""
            elif isinstance(w, QComboBox):
                out[key] = w.currentText()
            else:
                out[key] = w.text()
        # the proposer as a spec: the "local checkpoint…" entry (KIND:PATH) with its folder, and
        # the tree fields folded in as the CLI's --tree/--children are (a compare lane's own
        # proposer replaces the whole spec, tree and all)
        base = spec_text(self.proposer.currentData() or "", self.checkpoint.text())
        if self.draw.isEnabled():  # a head drafting a chain
            base = fold_draw(base, out["draw"])
        out["proposer"] = fold_tree(base, out["tree"], out["children"])
        out["target"] = self.target.spec()
        return out

    def set_texts(self, texts: dict[str, str]) -> None:
        for key, value in texts.items():
            w = self.fields.get(key)
            if w is None or value is None:
                continue
            value = str(value)
            if key == "proposer":
                self._set_proposer(value)
            elif key == "target":
                self.target.set_spec(value)
                self._offer_proposers()
            elif isinstance(w, QPlainTextEdit):
                w.setPlainText(value)
            elif isinstance(w, QCheckBox):
                w.setChecked(value.strip().lower() in ("on", "true", "1", "yes"))
            elif isinstance(w, QComboBox):
                idx = w.findText(value)
                if idx >= 0:
                    w.setCurrentIndex(idx)
                elif w.isEditable():
                    w.setEditText(value)
            else:
                w.setText(value)

    def _set_proposer(self, value: str) -> None:
        """Select a spec (or a legacy name): a menu entry; a local checkpoint's spec selects
        KIND:PATH and fills the folder; any other spec is added to the menu."""
        spec = menu_spec(value)
        if spec is None:
            return  # not a proposer (any more): the menu keeps its choice
        spec, tree, children = split_tree(spec)  # the tree and the draw mode go to their own fields
        spec, draw = split_draw(spec)
        self._set_combo(self.tree, tree)
        self._set_combo(self.children_mode, children)
        self._set_combo(self.draw, draw)
        path = checkpoint_of(spec)
        if path is not None:
            self.checkpoint.setText(path)
            spec = f"{spec.partition(':')[0]}:{PATH_ARG}"
        idx = self.proposer.findData(spec)
        if idx < 0:
            self.proposer.addItem(proposer_label(spec), spec)
            idx = self.proposer.count() - 1
        self.proposer.setCurrentIndex(idx)

    @staticmethod
    def _set_combo(combo: QComboBox, value: str) -> None:
        idx = combo.findText(value)
        if idx >= 0:
            combo.setCurrentIndex(idx)
        elif combo.isEditable():
            combo.setEditText(value)

    def set_field(self, key: str, value: str) -> None:
        self.set_texts({key: value})

    def free_text_fields(self) -> tuple[QWidget, ...]:
        """The fields where a space is text (Space types there; elsewhere it runs): the prompt,
        the checkpoint folder, the chat's system text, the stop strings and ids ("2, 7")."""
        return (self.prompt, self.checkpoint, self.system, self.stop_strings, self.stop_ids)

    def validate(self) -> Validation:
        result = validate(self.texts(), self.devices, self.vocab_size)
        self.show_errors(result.errors)
        return result

    def validate_quietly(self) -> PanelSettings | None:
        """The settings when every field is valid, without flagging anything."""
        return validate(self.texts(), self.devices, self.vocab_size).settings

    def show_errors(self, errors: dict[str, str]) -> None:
        for key, label in self.errors.items():
            msg = errors.get(key, "")
            label.setText(msg)
            label.setToolTip(msg)
            w = self.fields.get(key)
            if w is not None:
                w.setStyleSheet("border: 1px solid #b00020;" if msg else "")
        first = next((key for key in self.errors if errors.get(key)), None)
        if first is not None:  # once the label has its wrapped height (two layout passes: width, then height)
            QTimer.singleShot(BRING_INTO_VIEW_MS, self, lambda: self.bring_into_view(first))

    def bring_into_view(self, key: str, tries: int = 10) -> None:
        """Scroll the panel so that field `key` and the message under it show: a refusal of max
        new tokens, far down the panel, was seen only in the status bar's cut-short line."""
        area = self.parentWidget()
        while area is not None and not isinstance(area, QScrollArea):
            area = area.parentWidget()
        if area is None:
            return
        label = self.errors[key]
        if tries > 0 and label.hasHeightForWidth() and label.heightForWidth(label.width()) > label.height():
            # the wrapped text is taller than the label yet (a busy machine has not run the second
            # layout pass): scrolled now, the message's last lines stayed below the fold
            QTimer.singleShot(BRING_INTO_VIEW_MS, self, lambda: self.bring_into_view(key, tries - 1))
            return
        area.ensureWidgetVisible(label, 0, 8)
        field = self.fields.get(key)
        if field is not None and field.isVisible():
            area.ensureWidgetVisible(field, 0, 8)

    def _live_validate(self, *args) -> None:
        # Only re-check fields already flagged, so typing does not shout at every keystroke.
        if any(label.text() for label in self.errors.values()):
            self.validate()

    def set_examples(self, examples: list[tuple[str, str]]) -> None:
        """Offer these (name, text) example prompts (the chat ones for a chat run)."""
        if list(examples) == self.examples:
            return
        self.examples = list(examples)
        self.example.clear()
        self.example.addItem("— example prompts —", None)
        for name, text in self.examples:
            self.example.addItem(name, text)

    def _pick_example(self, index: int) -> None:
        text = self.example.itemData(index)
        if text:
            self.prompt.setPlainText(text)

    def _proposer_changed(self, *args) -> None:
        is_ckpt = str(self.proposer.currentData() or "").endswith(f":{PATH_ARG}")
        self.checkpoint.setEnabled(is_ckpt)
        self.browse.setEnabled(is_ckpt)
        self.browse_gguf.setEnabled(is_ckpt)
        # prompt lookup (and any kind without a `tree` parameter) drafts chains only
        trees = grows_trees(str(self.proposer.currentData() or ""))
        self.tree.setEnabled(trees)
        self.children_mode.setEnabled(trees and not is_chain(self.tree.currentText()))
        self.tree.setToolTip(FIELD_HELP["tree"] if trees else "this proposer drafts chains only")
        heads = takes_draw(str(self.proposer.currentData() or ""))
        chain = is_chain(self.tree.currentText()) or not trees
        self.draw.setEnabled(heads and chain)  # onehot applies to a chain; a tree's siblings follow Children
        self.draw.setToolTip(
            FIELD_HELP["draw"]
            if heads and chain
            else "a tree's siblings are chosen by Children"
            if heads
            else "a draft head's setting"
        )

    def _offer_proposers(self) -> None:
        """The proposer menu for the chosen target: the drafts that share its tokenizer (the
        bundled target's small and tiny; SmolLM2's smollm2-draft, found in the package's
        resources wherever the window was started), the heads and the other kinds. The
        current choice stays (a draft the target cannot use is refused under the field)."""
        keep = self.proposer.currentData()
        choices = proposer_choices(with_trees=False, target=self.target.spec())
        if [self.proposer.itemData(i) for i in range(self.proposer.count())] == [c.spec for c in choices]:
            return
        self.proposer.blockSignals(True)
        self.proposer.clear()
        for choice in choices:
            self.proposer.addItem(choice.label, choice.spec)
        idx = self.proposer.findData(keep)
        if idx < 0 and keep:
            self.proposer.addItem(proposer_label(keep), keep)
            idx = self.proposer.count() - 1
        self.proposer.setCurrentIndex(max(idx, 0))
        self.proposer.blockSignals(False)
        self._proposer_changed()

    def _follow_target(self, choice) -> None:
        """A target's default proposer (its catalog `default_draft`; the bundled draft for the
        bundled target; prompt lookup for others, whose tokenizer no bundled draft shares)
        replaces the proposer, unless the person chose another since the last such choice."""
        self._offer_proposers()
        if self.texts()["proposer"] != self._auto_proposer:
            return
        default = choice.default_draft or (DEFAULT_PROPOSER if not choice.spec else "lookup")
        if menu_spec(default) is not None:
            self._set_proposer(default)
            self._auto_proposer = self.texts()["proposer"]

    def show_target_message(self, message: str) -> None:
        """One line under the target menu (a fetch that failed or was cancelled)."""
        line = " ".join(message.split())
        self.errors["target"].setText(line)
        self.errors["target"].setToolTip(line)

    def _browse(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Choose a draft checkpoint folder")
        if path:
            self.checkpoint.setText(path)

    def _browse_gguf(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Choose a draft GGUF file", "", "GGUF files (*.gguf);;All files (*)"
        )
        if path:
            self.checkpoint.setText(path)

    # ------------------------------------------------------------------ state

    def set_state(self, state: str, detail: str = "") -> None:
        running = state == RUNNING
        loading = state == LOADING
        active = state in (RUNNING, PAUSED, LOADING)
        self.run_button.setEnabled(not running and not loading)
        self.run_button.setText("Resume" if state == PAUSED else "Run")
        self.pause_button.setEnabled(running)
        self.step_button.setEnabled(not running and not loading)
        self.stop_button.setEnabled(active)
        for w in self.fields.values():
            w.setEnabled(not active)
        self.system.setEnabled(not active and self.chat.isChecked())  # the system turn belongs to a chat
        self.example.setEnabled(not active)
        if not active:
            self._proposer_changed()
        labels = {IDLE: "Ready.", LOADING: "Loading models…", PAUSED: "Paused — Step or Resume.", RUNNING: "Running…"}
        self.state_label.setText(detail or labels.get(state, state))
