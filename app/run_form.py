"""The form that sets up an agent run (Supervise and Drive pages): instruction, policy and its
options, where it acts (this desktop, a sandbox task or a browser game), the tools' workspace (Supervise) and the gate. Choices are remembered
in the store's settings under `<prefix>.*`."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QStackedWidget,
    QWidget,
)

from agent.executors.base import ExecutionError
from agent.executors.terminal import TerminalExecutor
from agent.storage.model_files import DEFAULT_MODEL_DIR
from app.agent_run import RunSetupError, make_executor, make_policy, models_missing
from app.game_executor import game_choices

POLICY_LABELS = {"default": "Default small model", "endpoint": "OpenAI-compatible endpoint",
                 "local": "Local model folder", "replay": "Replay file (scripted responses)"}
EXECUTOR_LABELS = {"desktop": "This desktop", "sandbox": "A sandbox task", "game": "A browser game",
                   "android": "An Android phone (uiautomator2)"}
GATE_LABELS = {"all": "Ask me before every step", "risky": "Ask before risky steps", "auto": "Never ask"}


LOCAL_POLICIES = ("default", "local")  # they run a model here: torch and transformers


def sandbox_families() -> list[str]:
    try:
        from trainer.sandbox.families import FAMILIES  # lazy: names only; the sandbox itself runs in a child process

        return list(FAMILIES)
    except Exception:  # the trainer may not be installed beside the app
        return []


class RunForm(QWidget):
    def __init__(self, store=None, prefix: str = "supervise", gates=("all", "risky"), executors=("desktop", "sandbox"),
                 tools: bool = False, parent=None):
        """executors: where the agent may act, from EXECUTOR_LABELS (empty: the row is hidden).
        tools: offer a workspace folder for the terminal and file tools (the gate asks before each call)."""
        super().__init__(parent)
        self.store, self.prefix = store, prefix
        form = QFormLayout(self)
        form.setContentsMargins(0, 0, 0, 0)
        self.instruction = QLineEdit()
        self.instruction.setPlaceholderText(
            "What should the agent do? (a sandbox task or a game brings its own)"
            if {"sandbox", "game"} & set(executors or ())
            else "What should the agent do? e.g. “Open Downloads and sort the files by date”")
        form.addRow("Instruction", self.instruction)

        self.policy = QComboBox()
        missing = models_missing()
        for key in ("default", "endpoint", "local", "replay"):
            self.policy.addItem(POLICY_LABELS[key] + (" (needs the training extras)" if missing and key in LOCAL_POLICIES else ""), key)
            if missing and key in LOCAL_POLICIES:  # the small bundle has no torch: say so, offer the endpoint
                self.policy.model().item(self.policy.count() - 1).setEnabled(False)
                self.policy.setItemData(self.policy.count() - 1, missing, Qt.ToolTipRole)
        if missing:
            self.policy.setCurrentIndex(self.policy.findData("endpoint"))
        self.options = QStackedWidget()
        self.replay_path = QLineEdit()
        self.replay_path.setPlaceholderText("responses.jsonl")
        browse = QPushButton("…")
        browse.clicked.connect(self._browse_replay)
        replay = QWidget()
        rl = QHBoxLayout(replay)
        rl.setContentsMargins(0, 0, 0, 0)
        rl.addWidget(self.replay_path, 1)
        rl.addWidget(browse)
        self.base_url = QLineEdit()
        self.base_url.setPlaceholderText("http://127.0.0.1:8000/v1")
        self.model = QLineEdit()
        self.model.setPlaceholderText("model name, e.g. ui-tars-1.5-7b")
        self.api_key = QLineEdit()
        self.api_key.setEchoMode(QLineEdit.Password)
        self.api_key.setPlaceholderText("API key (optional)")
        endpoint = QWidget()
        el = QHBoxLayout(endpoint)
        el.setContentsMargins(0, 0, 0, 0)
        for w in (self.base_url, self.model, self.api_key):
            el.addWidget(w)
        self.model_dir = QLineEdit()
        self.model_dir.setPlaceholderText("a transformers Qwen2.5-VL-class model folder")
        default = QLabel(f"{DEFAULT_MODEL_DIR}")
        default.setObjectName("muted")
        self._pages = {"default": default, "endpoint": endpoint, "local": self.model_dir, "replay": replay}
        for key in ("default", "endpoint", "local", "replay"):
            self.options.addWidget(self._pages[key])
        self.policy.currentIndexChanged.connect(lambda: self.options.setCurrentWidget(self._pages[self.policy.currentData()]))
        form.addRow("Policy", self.policy)
        form.addRow("", self.options)

        self.executor = QComboBox()
        for key in executors or ("desktop",):
            self.executor.addItem(EXECUTOR_LABELS[key], key)
        self.family = QComboBox()
        self.family.addItems(sandbox_families() or ["click_button"])
        self.game = QComboBox()  # titles shown, registry names kept
        games, self.games_problem = game_choices() if "game" in (executors or ()) else ([], None)
        for name, title in games:
            self.game.addItem(title, name)
        self.seed = QSpinBox()
        self.seed.setRange(0, 2**31 - 1)
        where = QWidget(self)  # parented: when it is not shown, its combos must still live
        wl = QHBoxLayout(where)
        wl.setContentsMargins(0, 0, 0, 0)
        wl.addWidget(self.executor)
        wl.addWidget(self.family)
        wl.addWidget(self.game)
        self.seed_label = QLabel("seed")
        wl.addWidget(self.seed_label)
        wl.addWidget(self.seed)
        self.serial = QLineEdit()
        self.serial.setPlaceholderText("device serial (empty: the one phone `adb devices` lists)")
        wl.addWidget(self.serial, 1)
        self.executor.currentIndexChanged.connect(self._executor_changed)
        if executors and len(executors) > 1:
            form.addRow("Acts on", where)
        else:
            where.hide()
        self.tools_root = QLineEdit()  # empty: no tools
        self.tools_root.setPlaceholderText("optional: a workspace folder where the agent may also run commands and read "
                                           "and write files (you are asked before every call)")
        self.tools_root.setToolTip("read_file and write_file stay inside the folder; a command starts there but runs "
                                   "with your rights and is not confined to it")
        if tools:
            pick = QPushButton("…")
            pick.clicked.connect(self._browse_tools)
            row = QWidget()
            tl = QHBoxLayout(row)
            tl.setContentsMargins(0, 0, 0, 0)
            tl.addWidget(self.tools_root, 1)
            tl.addWidget(pick)
            form.addRow("Tools", row)
        self.gate = QComboBox()
        for g in gates:
            self.gate.addItem(GATE_LABELS[g], g)
        form.addRow("Gate", self.gate)
        self.warning = QLabel()  # said before a run, not discovered during it
        self.warning.setObjectName("error")
        self.warning.setWordWrap(True)
        form.addRow("", self.warning)
        self.policy.currentIndexChanged.connect(self._update_warning)
        self.executor.currentIndexChanged.connect(self._update_warning)
        self._executor_chosen = False  # by a person (or a remembered run); until then it follows the model
        self.executor.activated.connect(lambda _: setattr(self, "_executor_chosen", True))
        self.policy.currentIndexChanged.connect(self._follow_model)
        self._restore()
        self._follow_model()
        self._executor_changed()
        self._update_warning()

    # ------------------------------------------------------------ values
    def _executor_changed(self) -> None:
        where = self.executor.currentData()
        self.family.setVisible(where == "sandbox")
        self.game.setVisible(where == "game")
        self.seed.setVisible(where in ("sandbox", "game"))
        self.seed_label.setVisible(where in ("sandbox", "game"))
        self.serial.setVisible(self.executor.currentData() == "android")

    def _follow_model(self) -> None:
        """Where the agent acts, until someone chooses: the default small model learned only the
        sandbox's tasks, so it starts on a sandbox task (on this desktop it would mostly miss, as
        the warning says); any other model starts on the first place the page offers."""
        sandbox = self.executor.findData("sandbox")
        if self._executor_chosen or sandbox < 0:
            return
        self.executor.setCurrentIndex(sandbox if self.policy.currentData() == "default" else 0)

    def _update_warning(self) -> None:
        where = self.executor.currentData()
        if self.policy.currentData() == "default" and where in ("desktop", "android"):
            self.warning.setText("The default small model learned only Tandem's sandbox tasks (336x252 screens "
                                 "with their element lists); "
                                 f"on {'this desktop' if where == 'desktop' else 'a phone'} it will mostly miss. "
                                 "Use an endpoint or a local UI-TARS-class model for real work.")
            self.warning.show()
        elif where == "game" and self._games_check():  # said here, before Start, not as a crash after it
            self.warning.setText(self.games_problem)
            self.warning.show()
        else:
            self.warning.hide()

    def _games_check(self) -> str | None:
        """Why no game can run here now (Chromium may have been installed since the form was built)."""
        self.games_problem = game_choices()[1]
        return self.games_problem

    def _browse_replay(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Replay responses", "", "JSON lines (*.jsonl);;All files (*)")
        if path:
            self.replay_path.setText(path)

    def _browse_tools(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "The agent's workspace folder")
        if path:
            self.tools_root.setText(path)

    def build_tools(self):
        """A TerminalExecutor over the chosen workspace folder, or None when none is chosen."""
        root = self.tools_root.text().strip()
        if not root:
            return None
        try:
            return TerminalExecutor(root)
        except ExecutionError as e:
            raise RunSetupError(f"tools: {e}") from None

    def set_choice(self, combo: QComboBox, value) -> None:
        i = combo.findData(value)
        if i < 0:
            raise ValueError(f"no choice {value!r} in {[combo.itemData(k) for k in range(combo.count())]}")
        combo.setCurrentIndex(i)
        if combo is self.executor:
            self._executor_chosen = True

    def build_executor(self):
        if self.executor.currentData() == "game" and self._games_check():
            raise RunSetupError(self.games_problem)
        return make_executor(self.executor.currentData(), family=self.family.currentText(), seed=self.seed.value(),
                             serial=self.serial.text().strip() or None, game=self.game.currentData())

    def build_policy(self, platform: str):
        return make_policy(self.policy.currentData(), responses=self.replay_path.text().strip() or None,
                           base_url=self.base_url.text().strip(), model=self.model.text().strip(),
                           api_key=self.api_key.text().strip() or None, model_dir=self.model_dir.text().strip(),
                           platform=platform, tools=bool(self.tools_root.text().strip()))

    def use_model(self, model_dir: str) -> None:
        """Run a local model folder from now on (an announced flywheel version)."""
        self.set_choice(self.policy, "local")
        self.model_dir.setText(model_dir)
        self.remember()

    def use_endpoint(self, base_url: str, model: str) -> None:
        """Run a model served at an OpenAI-compatible endpoint (one too large to download)."""
        self.set_choice(self.policy, "endpoint")
        self.base_url.setText(base_url)
        self.model.setText(model)
        self.remember()

    @staticmethod
    def remember_endpoint(store, prefix: str, base_url: str, model: str) -> None:
        store.set_setting(f"{prefix}.policy", "endpoint")
        store.set_setting(f"{prefix}.base_url", base_url)
        store.set_setting(f"{prefix}.model", model)

    @staticmethod
    def remember_model(store, prefix: str, model_dir: str) -> None:
        """use_model for a form not built yet: it reads these settings when it is."""
        store.set_setting(f"{prefix}.policy", "local")
        store.set_setting(f"{prefix}.model_dir", model_dir)

    # ------------------------------------------------------------ settings
    def _fields(self):
        return {"policy": self.policy, "executor": self.executor, "gate": self.gate, "replay": self.replay_path,
                "base_url": self.base_url, "model": self.model, "model_dir": self.model_dir, "family": self.family, "serial": self.serial, "game": self.game,
                "tools_root": self.tools_root}

    def remember(self) -> None:
        if self.store is None:
            return
        for key, w in self._fields().items():
            v = w.currentData() if isinstance(w, QComboBox) and w is not self.family else (
                w.currentText() if isinstance(w, QComboBox) else w.text())
            self.store.set_setting(f"{self.prefix}.{key}", v)

    def _restore(self) -> None:
        if self.store is None:
            return
        for key, w in self._fields().items():
            v = self.store.get_setting(f"{self.prefix}.{key}")
            if v is None:
                continue
            self._executor_chosen |= w is self.executor
            if w is self.family:
                w.setCurrentText(v)
            elif isinstance(w, QComboBox):
                i = w.findData(v)
                if i >= 0 and w.model().item(i).isEnabled():  # a saved choice this installation cannot run stays off
                    w.setCurrentIndex(i)
            else:
                w.setText(v)
