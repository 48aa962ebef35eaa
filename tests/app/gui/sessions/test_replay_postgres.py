"""The GUI on a PostgreSQL trace store: a live run recorded to a server URL, and the replay of
a run read from that URL. Needs SPECSCOPE_TEST_DATABASE_URL (tests/pg_server.py)."""

from __future__ import annotations

from PySide6.QtCore import Qt

from specscope.storage import TraceStore
from tests.app.helpers import configure, wait_idle
from tests.pg_server import fresh_schema, requires_server

pytestmark = requires_server


def test_replay_reads_a_run_from_a_postgresql_url(qtbot, make_window, tmp_path):
    with fresh_schema("replay") as url:
        w = make_window(store_path=url)  # the live run records to the server
        configure(w, temperature="1.0", proposer="draft-tiny", max_new_tokens="30")
        qtbot.mouseClick(w.run_panel.run_button, Qt.MouseButton.LeftButton)
        wait_idle(qtbot, w)
        run_id, live_rounds = w.model.config.run_id, list(w.model.rounds)
        assert live_rounds and w.last_error is None
        w.close()
        with TraceStore(url) as store:
            info = store.get_run(run_id)
            assert info.status == "completed" and info.n_rounds == len(live_rounds)
            assert [r.run_id for r in store.list_runs()] == [run_id]

        r = make_window(store_path=str(tmp_path / "other.sqlite"))
        opened = r.open_trace(url)
        assert opened, r.last_error
        qtbot.waitUntil(lambda: r.replay.loaded_all, timeout=20000)
        assert r.mode == "replay" and r.last_error is None
        assert r.model.config.run_id == run_id
        assert [x.tokens for x in r.model.rounds] == [x.tokens for x in live_rounds]
        assert r.model.output_tokens == w.model.output_tokens
        assert r.findings.findings == []
        r.navigator.slider.setValue(3)
        assert r.model.selected[0] == 3
        r.close()  # closes the replay's store before the schema is dropped
