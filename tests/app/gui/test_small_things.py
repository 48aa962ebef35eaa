"""Issue 20's small things: what the first Step is doing, asking before a trace replaces a
live run, the live-plots dock after quitting on Compare, torch's thread count, `open --run`."""

from __future__ import annotations

import pytest

from tests.app.helpers import configure, wait_idle


def test_the_first_step_says_it_loads_models_then_computes_round_0(qtbot, window):
    said: list[str] = []
    window.live.activity.connect(said.append)
    configure(window)
    window.runs.step()
    qtbot.waitUntil(lambda: len(window.model.rounds) == 1, timeout=30000)
    words = [s for s in said if s]
    assert words and words[0].startswith("loading models")
    assert any(s.startswith("computing round 0") for s in words), said
    assert said[-1] == ""  # round 0 arrived: the panel says Paused again
    assert "Paused" in window.run_panel.state_label.text()


def test_opening_a_trace_during_a_run_asks_first(qtbot, make_window, tmp_path):
    rec = make_window(store_path=str(tmp_path / "rec.sqlite"))
    configure(rec)
    assert rec.start_run()
    wait_idle(qtbot, rec)
    rec.close()
    w = make_window(store_path=str(tmp_path / "other.sqlite"))
    configure(w, max_new_tokens="400")
    assert w.start_run(run=False)
    qtbot.waitUntil(lambda: w.live.state == "paused", timeout=30000)
    questions: list[str] = []
    w.traces.ask = lambda title, q: questions.append(q) or False
    assert not w.open_trace(str(tmp_path / "rec.sqlite"))
    assert questions and w.mode == "live" and w.live.state == "paused"
    w.traces.ask = lambda title, q: questions.append(q) or True
    assert w.open_trace(str(tmp_path / "rec.sqlite"))
    assert len(questions) == 2 and w.mode == "replay"


def test_quitting_on_the_compare_tab_keeps_the_plots_dock_for_the_next_start(qtbot, make_window, settings_file):
    w1 = make_window(settings=settings_file)
    w1.resize(1600, 1000)
    qtbot.wait(50)
    assert w1.plots_dock.isVisible()
    w1.tabs.setCurrentWidget(w1.compare)
    assert not w1.plots_dock.isVisible()
    w1.close()
    w2 = make_window(settings=settings_file)
    qtbot.wait(50)
    assert w2.plots_dock.isVisible()


def test_threads_default_setting_and_status_bar(qtbot, window):
    from specscope.app.threads import default_threads

    assert default_threads(1) == 1 and default_threads(2) == 1 and default_threads(4) == 3
    assert default_threads(16) == 14
    assert f"{default_threads()} torch thread" in window.status_label.text()
    configure(window, threads="1")
    window.update_status()
    assert "1 torch thread " in window.status_label.text() + " "
    configure(window, threads="0")
    window.run_panel.validate()
    assert "threads" in window.run_panel.errors["threads"].text()
    configure(window, threads="1")
    assert window.start_run()
    wait_idle(qtbot, window)
    import torch

    assert torch.get_num_threads() == 1 and window.live.controller.worker.threads == 1


def test_cli_threads_and_open_run(monkeypatch, tmp_path, hub):
    from specscope.app import gui
    from specscope.app.cli import entry as cli
    from specscope.core import DraftModelProposer, SpeculativeDecoder
    from specscope.storage import TraceStore, TraceWriter

    target, _ = hub.target("cpu")
    path = tmp_path / "t.sqlite"
    ids = []
    with TraceStore(path) as store:
        for seed in range(2):
            dec = SpeculativeDecoder(target, DraftModelProposer(hub.draft("draft-small", "cpu")), k=2, seed=seed)
            config = dec.run_config([1, 2, 3], 6)
            with TraceWriter(store, config) as writer:
                writer.record(dec.rounds([1, 2, 3], 6, config=config))
            ids.append(config.run_id)
    calls = []
    monkeypatch.setattr(gui, "launch", lambda **kw: calls.append(kw) or 0)
    assert cli.main(["--threads", "2", "open", str(path), "--run", ids[1][:10]]) == 0
    assert calls == [{"trace_path": str(path), "run_id": ids[1], "threads": 2}]
    assert cli.main(["open", str(path), "--run", "nosuchrun"]) != 0
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["run", "--threads", "0"])


def test_greedy_rounds_say_what_the_draft_believed_in_token_text(qtbot, window):
    configure(window, temperature="0")
    assert window.start_run()
    wait_idle(qtbot, window)
    r = next(r for r in window.model.rounds if r.rejected_node is not None)
    window.model.select(r.index, r.rejected_node)
    header = window.inspector.values["header"]
    node = r.nodes[r.rejected_node]
    assert "draft believed" in header and f"(id {node.token})" in header
    assert f"the target's argmax “{window.model.token_text(node.target_argmax)}” (id {node.target_argmax})" in header
    assert "q = —" not in header and "q = -" not in header


def test_drafts_after_an_accepted_eos_are_said_to_be(qtbot, window):
    """Greedy is deterministic: rerun with EOS = a draft token that was accepted mid-round."""
    from specscope.app.gui.views.describe import after_accepted_eos, describe_node

    configure(window, temperature="0", max_new_tokens="40")
    assert window.start_run()
    wait_idle(qtbot, window)
    # an accepted draft token (not the round's last node) that the output has not emitted before
    eos = next(
        (
            n.token
            for r in window.model.rounds
            for n in r.nodes[:-1]
            if n.status == "accepted"
            and r.tokens.count(n.token) == 1
            and n.token not in window.model.output_tokens[: r.emitted_before]
        ),
        None,
    )
    assert eos is not None
    configure(window, temperature="0", max_new_tokens="40", eos=str(eos))
    assert window.start_run()
    wait_idle(qtbot, window)
    last = window.model.rounds[-1]
    assert last.eos and last.emitted[-1].kind == "accepted"
    cut = [n for n in last.nodes if after_accepted_eos(last, n)]
    assert cut and all(n.status == "unvisited" for n in cut)
    assert "discarded after an accepted EOS" in describe_node(last, cut[0], window.model.token_text)
    window.model.select(last.index, cut[0].index)
    assert "after an accepted EOS" in window.inspector.values["header"]
    assert "after an accepted EOS" in window.tree.title.text()
