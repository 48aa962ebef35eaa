"""File > Diff two runs: the GUI's `specscope diff` of two stored runs."""

import pytest
from PySide6.QtWidgets import QInputDialog, QMessageBox

from specscope.core import DraftModelProposer, SamplingConfig, SpeculativeDecoder
from specscope.core.faults.zoo import faulty_decoder
from specscope.storage import TraceStore, record
from tests.tiny_models import noisy_copy, tiny_lm

PROMPT = [4, 8, 15, 16, 23, 42]
GREEDY = SamplingConfig(temperature=0)


@pytest.fixture(scope="module")
def pair():
    target = tiny_lm("llama", seed=2, init_range=0.3)
    return target, noisy_copy(target, 0.05)


def recorded_store(path, decoders):
    with TraceStore(path) as store:
        for dec in decoders:
            record(store, dec, PROMPT, 30)


def pick_in_order(monkeypatch):
    calls = iter([0, 1])
    monkeypatch.setattr(
        QInputDialog,
        "getItem",
        staticmethod(lambda parent, title, label, items, current, editable: (items[next(calls)], True)),
    )
    shown = []
    monkeypatch.setattr(QMessageBox, "information", staticmethod(lambda parent, title, text: shown.append(text)))
    return shown


def test_cached_run_and_its_no_cache_reference_do_not_diverge(window, monkeypatch, tmp_path, pair):
    target, draft = pair
    path = tmp_path / "pair.sqlite"
    recorded_store(
        path,
        [
            SpeculativeDecoder(target, DraftModelProposer(draft), k=4, sampling=GREEDY),
            SpeculativeDecoder(target, DraftModelProposer(draft), k=4, sampling=GREEDY, use_cache=False),
        ],
    )
    shown = pick_in_order(monkeypatch)
    text = window.traces.diff_runs_dialog(str(path))
    assert shown == [text] and "no divergence" in text and "compared 30 tokens" in text


def test_a_stale_cache_run_diverges(window, monkeypatch, tmp_path, pair):
    target, draft = pair
    path = tmp_path / "bug.sqlite"
    recorded_store(
        path,
        [
            SpeculativeDecoder(target, DraftModelProposer(draft), k=4, sampling=GREEDY),
            faulty_decoder("target-crop-off-by-one", target, DraftModelProposer(draft), k=4, sampling=GREEDY),
        ],
    )
    pick_in_order(monkeypatch)
    text = window.traces.diff_runs_dialog(str(path))
    assert "first [cache]" in text


def test_a_store_with_one_run_is_explained(window, monkeypatch, tmp_path):
    target = tiny_lm("llama", seed=2, init_range=0.3)
    path = tmp_path / "one.sqlite"
    recorded_store(path, [SpeculativeDecoder(target, DraftModelProposer(noisy_copy(target, 0.05)), k=2)])
    errors = []
    monkeypatch.setattr(window, "show_error", lambda message, details="", title="": errors.append(message))
    assert window.traces.diff_runs_dialog(str(path)) is None
    assert errors and "needs two" in errors[0]
