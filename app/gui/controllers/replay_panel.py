"""The run panel while a stored run replays: it holds the run's settings, so Run reproduces
it, and says where the panel no longer matches the trace. Owned by the window
(`window.replay_panel`)."""

from __future__ import annotations

import logging
from typing import Any

from specscope.app.gui.model.settings import spec_of_run
from specscope.app.gui.model.targets import target_of_run
from specscope.app.gui.model.traces import legacy_prompt_tokenizer
from specscope.app.gui.sessions.hub import ModelHub
from specscope.app.gui.sessions.replay import ReplaySession, run_tokenizer
from specscope.app.gui.sessions.worker import IDLE
from specscope.app.gui.views.runpanel import RunPanelWidget

log = logging.getLogger(__name__)


def engine_of_run(config: Any) -> str:
    """The engine that recorded a run: transformers' runs say so in their proposer params,
    vLLM's carry its version there and name vLLM's method (`vllm-ngram`, ...) as the proposer."""
    params = config.proposer_params or {}
    if params.get("engine") == "transformers":
        return "transformers"
    if "vllm" in params or str(config.proposer).startswith("vllm-"):
        return "vllm"
    return "specscope"


def stop_texts(config: Any) -> dict[str, str]:
    """The run panel's EOS and stop fields for a run: every EOS id (not only the first), its
    stop strings and token sequences, written as the panel reads them (PanelSettings.to_texts).
    A trace that does not record its stops leaves the stop fields as they are."""
    from specscope.app.gui.model.settings import PanelSettings

    ids = tuple(config.eos_token_ids) or (() if config.eos_token_id is None else (config.eos_token_id,))
    texts = {"eos": ",".join(str(t) for t in ids) if ids else "none"}
    if "stops" not in config.unrecorded:
        written = PanelSettings(
            stop_strings=tuple(config.stop_strings), stop_ids=tuple(tuple(s) for s in config.stop_ids)
        ).to_texts()
        texts.update(stop_strings=written["stop_strings"], stop_ids=written["stop_ids"])
    return texts


class ReplayPanel:
    def __init__(self, hub: ModelHub, run_panel: RunPanelWidget, replay: ReplaySession):
        self.hub = hub
        self.run_panel = run_panel
        self.replay = replay
        self.trace_texts: dict[str, str] | None = None  # the panel's texts as the trace set them
        self.trace_label = ""
        self.mismatch: list[str] = []  # what the panel cannot reproduce of the replayed run

    def tokenizer(self, info: Any) -> Any | None:
        """The run's own tokenizer (sessions.replay.run_tokenizer: the one it recorded, the
        bundled one or a fetched model's), or for a run that recorded none the bundled one
        when it fits exactly; None when it is not here (never another model's: its text
        would be garbage)."""
        tok, _why = run_tokenizer(self.hub, info)
        return tok if tok is not None else legacy_prompt_tokenizer(info, self.hub.tokenizer)

    def decode_prompt(self, info: Any) -> str | None:
        """The run's prompt text: stored, or decoded from its prompt ids with the run's own
        tokenizer (None where it is not here); of a chat run that stored no text (the
        CLI's), the user's turn (the run panel then ticks Chat)."""
        if info.prompt_text:
            return info.prompt_text
        try:
            tok = self.tokenizer(info)
            if tok is None:
                return None
            user = self.chat_user_text(info)
            return user if user is not None else tok.decode(list(info.config.prompt_ids))
        except Exception:
            log.exception("could not decode the prompt")
            return None

    def show_trace_settings(self, info: Any) -> None:
        """Put the replayed run's settings in the run panel, so Run reproduces it; say what
        differs when the panel cannot hold the trace's exact settings."""
        cfg = info.config
        panel = self.run_panel
        proposer = spec_of_run(cfg.proposer, cfg.proposer_params, cfg.draft_name, cfg.target_name)
        texts = {
            "engine": engine_of_run(cfg),
            "k": str(cfg.k),
            "temperature": f"{cfg.sampling.temperature:g}",
            "top_k": str(cfg.sampling.top_k),
            "top_p": f"{cfg.sampling.top_p:g}",
            "seed": str(cfg.seed),
            "max_new_tokens": str(cfg.max_new_tokens),
            **stop_texts(cfg),
        }
        if proposer:
            texts["proposer"] = proposer
        target = target_of_run(cfg.target_name)
        if target is not None:
            texts["target"] = target
        prompt = self.decode_prompt(info)
        if prompt is not None:
            texts["prompt"] = prompt
        # a chat template ticked for an earlier run made Run template this run's prompt
        texts["chat"] = "on" if self.was_chat(info, prompt) else ""
        texts["system"] = ""  # a trace keeps no system text: a chat run with one re-encodes otherwise (said)
        self.trace_texts = None  # set_texts below must not compare against another trace
        panel.set_texts(texts)
        self.trace_texts = {k: v for k, v in panel.texts().items() if k in texts}
        self.mismatch = self.panel_mismatch(info)
        note = f" Not reproducible from the panel: {'; '.join(self.mismatch)}." if self.mismatch else ""
        self.trace_label = f"Replaying run {info.run_id[:8]} ({info.status}); Run starts these settings live.{note}"
        panel.set_state(IDLE, self.trace_label)

    def chat_user_text(self, info: Any) -> str | None:
        """The user's turn of a chat run's prompt ids, when they are the run's tokenizer's
        chat template around one user message (no system turn); None otherwise."""
        marker = "\u2063specscope\u2063"
        try:
            tok = self.tokenizer(info)
            if tok is None or not getattr(tok, "chat_template", None):
                return None
            from specscope.core.loading.chat import chat_prompt_ids

            around = tok.decode(chat_prompt_ids(tok, marker))
            if around.count(marker) != 1:
                return None
            head, tail = around.split(marker)
            text = tok.decode(list(info.config.prompt_ids))
            if not (text.startswith(head) and text.endswith(tail)) or len(text) < len(head) + len(tail):
                return None
            user = text[len(head) : len(text) - len(tail)]
            return user if tuple(chat_prompt_ids(tok, user)) == tuple(info.config.prompt_ids) else None
        except Exception:  # noqa: BLE001 - only a convenience
            return None

    def was_chat(self, info: Any, prompt: str | None) -> bool:
        """Whether the run's prompt ids are `prompt` through the tokenizer's chat template (with
        no system turn): traces do not record the chat box."""
        if prompt is None:
            return False
        try:
            tok = self.tokenizer(info)
            if tok is None or not getattr(tok, "chat_template", None):
                return False
            from specscope.core.loading.chat import chat_prompt_ids

            return tuple(chat_prompt_ids(tok, prompt)) == tuple(info.config.prompt_ids)
        except Exception:  # noqa: BLE001 - only a convenience
            return False

    def panel_edited(self) -> None:
        """While replaying: say when the run panel no longer holds the trace's settings."""
        texts, info = self.trace_texts, self.replay.info
        if not self.replay.active or not texts or info is None:
            return
        now = self.run_panel.texts()
        changed = [k for k, v in texts.items() if now.get(k) != v]
        if changed:
            self.run_panel.state_label.setText(
                f"Replaying run {info.run_id[:8]}; the panel no longer matches the trace ({', '.join(changed)} "
                f"changed): Run starts the panel's settings."
            )
        else:
            self.run_panel.state_label.setText(self.trace_label)

    def panel_mismatch(self, info: Any) -> list[str]:
        """What in the run panel does not reproduce the trace (empty when Run would)."""
        out = []
        cfg = info.config
        prompt = self.decode_prompt(info)
        if prompt is None:
            out.append("the prompt (no text stored and the run's tokenizer is not here)")
        else:
            try:
                hub = self.hub
                ids = hub.encode(prompt, self.tokenizer(info), cfg.vocab_size or 1)
                if tuple(ids) != tuple(cfg.prompt_ids) and not self.was_chat(info, prompt):
                    out.append("the prompt (its text re-encodes to other token ids)")
            except Exception:  # noqa: BLE001
                out.append("the prompt (it could not be re-encoded)")
        if target_of_run(cfg.target_name) is None:
            out.append(f"the target {cfg.target_name}")
        if spec_of_run(cfg.proposer, cfg.proposer_params, cfg.draft_name, cfg.target_name) is None:
            out.append(f"the proposer {cfg.draft_name or cfg.proposer}")
        if "stops" in cfg.unrecorded:
            out.append("the stops (the trace does not record them)")
        return out
