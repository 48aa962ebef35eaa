"""The Calibration tab (issue 30): draft confidence against acceptance, acceptance by depth
against a head's training accuracy. Its numbers for a known run, its empty state, that it
follows the window's run (a new run, another opened trace), and the pure model behind it."""

from __future__ import annotations

import dataclasses
import json

import pytest

from specscope.app.gui.model.calibration import BINS, calibration_of, head_reference
from specscope.core.loading.models import models_dir
from tests.app.helpers import configure, wait_idle
from tests.storage.helpers import synthetic_config, synthetic_rounds

# (confidence, status) of each round's chain nodes; depth = position + 1
KNOWN = [
    [(0.95, "accepted"), (0.15, "rejected"), (0.50, "unvisited")],
    [(0.91, "accepted"), (0.62, "accepted"), (0.12, "rejected"), (0.70, "unvisited")],
    [(0.55, "rejected"), (0.90, "unvisited")],
]


def known_run(proposer_params=None, greedy=False, chains=KNOWN):
    config = synthetic_config(run_id="known", greedy=greedy)
    if proposer_params is not None:
        config = dataclasses.replace(config, proposer="eagle3", proposer_params=proposer_params)
    rounds = []
    for r, chain in zip(synthetic_rounds(config, len(chains)), chains):
        nodes = tuple(dataclasses.replace(r.nodes[i], confidence=c, status=s) for i, (c, s) in enumerate(chain))
        rounds.append(dataclasses.replace(r, nodes=nodes))
    return config, rounds


# by hand: bins of width 0.1 over the reached nodes (unvisited ones were never tested)
KNOWN_BINS = [(0.135, 0.0, 2), (0.55, 0.0, 1), (0.62, 1.0, 1), (0.93, 1.0, 2)]
KNOWN_BY_DEPTH = [2 / 3, 0.5, 0.0]


def test_the_model_bins_reached_nodes_by_confidence():
    config, rounds = known_run()
    c = calibration_of(rounds, config)
    overall = c.curves[0]
    got = [
        (round(float(x), 6), float(y), int(n)) for x, y, n in zip(overall.confidence, overall.accepted, overall.counts)
    ]
    assert got == KNOWN_BINS
    assert c.reached == c.with_confidence == 6 and c.rounds == 3
    assert list(c.acceptance_by_depth) == pytest.approx(KNOWN_BY_DEPTH)
    assert [cv.label for cv in c.curves] == ["all depths", "depth 1", "depth 2", "depth 3"]
    # count-weighted |confidence - accepted|: (2*0.135 + 0.55 + 0.38 + 2*0.07) / 6
    assert overall.calibration_error() == pytest.approx((0.27 + 0.55 + 0.38 + 0.14) / 6)
    assert len(overall.counts) <= BINS


def test_unknown_confidence_is_counted_as_reached_but_not_binned():
    chains = [[(None, "accepted"), (None, "rejected")], [(None, "rejected")]]
    config, rounds = known_run(chains=chains)
    c = calibration_of(rounds, config)
    assert c.reached == 3 and c.with_confidence == 0 and c.curves == ()
    assert list(c.acceptance_by_depth) == pytest.approx([0.5, 0.0])


def _bundled_record() -> dict:
    """The held-out record in the shipped bundled head's config (retraining changes its numbers)."""
    return json.loads((models_dir() / "eagle3-target" / "config.json").read_text())["specscope"]


def test_the_head_reference_comes_from_the_heads_config_or_says_why_not(tmp_path):
    draft, _ = known_run()
    assert head_reference(draft).accuracy is None and "not a draft head" in head_reference(draft).why_none
    bundled = {"head": "bundled:eagle3-target"}
    greedy, _ = known_run(bundled, greedy=True)
    ref = head_reference(greedy)
    assert ref.label == "held-out greedy" and ref.source == str(models_dir() / "eagle3-target" / "config.json")
    record = _bundled_record()
    assert list(ref.accuracy) == pytest.approx(record["heldout"]["greedy"]["accuracy_by_depth"])
    sampled, _ = known_run(bundled)
    assert head_reference(sampled).label == "held-out, all sets"
    assert list(head_reference(sampled).accuracy) == pytest.approx(record["accuracy_by_depth"])
    assert record["heldout"]["greedy"]["accuracy_by_depth"] != record["accuracy_by_depth"]
    (tmp_path / "config.json").write_text('{"hidden_size": 8}')
    foreign, _ = known_run({"head": str(tmp_path)})
    assert (
        head_reference(foreign).accuracy is None and "records no accuracy_by_depth" in head_reference(foreign).why_none
    )
    missing, _ = known_run({"head": str(tmp_path / "gone")})
    assert "not on this machine" in head_reference(missing).why_none


def test_a_depth_far_below_training_is_named():
    # a head's run accepting 1 of 10 at depth 1, far below what the shipped head was trained to (all
    # sets, its config's record): flagged; none at depth 2 is judged
    chains = [[(0.3, "accepted"), (0.2, "rejected")]] + [[(0.3, "rejected")]] * 9
    config, rounds = known_run({"head": "bundled:eagle3-target"}, chains=chains)
    c = calibration_of(rounds, config)
    assert [(s.depth, round(s.realised, 2)) for s in c.shortfalls] == [(1, 0.1)]
    trained = _bundled_record()["accuracy_by_depth"][0]
    assert f"depth 1: accepted 0.10 of the time, trained to {trained:.2f}" in c.verdict()


def test_a_chat_heads_greedy_answers_are_its_greedy_reference():
    # the shipped SmolLM2 head: its greedy answers per kind pooled by positions, answer positions only
    greedy, _ = known_run({"head": "bundled:eagle3-smollm2"}, greedy=True)
    ref = head_reference(greedy)
    record = json.loads((models_dir() / "eagle3-smollm2" / "config.json").read_text())["specscope"]
    sets = [v for k, v in record["heldout"].items() if k.startswith("greedy-")]
    assert len(sets) >= 3 and record["labels"] == "answers"
    pooled = sum(v["accuracy_by_depth"][0] * v["positions"] for v in sets) / sum(v["positions"] for v in sets)
    assert ref.label == "held-out greedy answers" and ref.accuracy[0] == pytest.approx(pooled, abs=1e-4)
    assert ref.caveat == ""


def test_a_chat_record_that_counted_the_prompts_positions_is_flagged(tmp_path):
    # the SmolLM2 head shipped before issue 41's retrain recorded its accuracy over prompt and
    # answer positions (no `labels`): the view says it overstates what serving accepts
    by_kind = {"chat": (0.324, 429), "summary": (0.3992, 521), "code": (0.5584, 514)}
    record = {
        "accuracy_by_depth": [0.309, 0.251],
        "heldout": {
            f"greedy-{k}": {"accuracy_by_depth": [a, a - 0.05], "positions": n} for k, (a, n) in by_kind.items()
        },
    }
    (tmp_path / "config.json").write_text(json.dumps({"specscope": record}))
    greedy, _ = known_run({"head": str(tmp_path)}, greedy=True)
    ref = head_reference(greedy)
    pooled = sum(a * n for a, n in by_kind.values()) / sum(n for _, n in by_kind.values())
    assert ref.label == "held-out greedy answers" and ref.accuracy[0] == pytest.approx(pooled, abs=1e-4)
    assert "counted the prompt's positions" in ref.caveat
    chains = [[(0.3, "accepted"), (0.2, "rejected")]] + [[(0.3, "rejected")]] * 19
    config, rounds = known_run({"head": str(tmp_path)}, greedy=True, chains=chains)
    assert "overstates what serving can accept" in calibration_of(rounds, config).verdict()


def test_a_chat_record_of_answer_positions_carries_no_caveat(tmp_path):
    record = {
        "labels": "answers",
        "accuracy_by_depth": [0.2, 0.1],
        "heldout": {"greedy-chat": {"accuracy_by_depth": [0.15, 0.05], "positions": 10}},
    }
    (tmp_path / "config.json").write_text(json.dumps({"specscope": record}))
    greedy, _ = known_run({"head": str(tmp_path)}, greedy=True)
    ref = head_reference(greedy)
    assert ref.accuracy == pytest.approx((0.15, 0.05)) and ref.caveat == ""


# --------------------------------------------------------------------------- the view in the window


def _shown(qtbot, window):
    window.tabs.setCurrentWidget(window.calibration)
    view = window.calibration
    view.refresh()
    return view


def test_the_empty_view_says_what_will_appear(qtbot, window):
    view = _shown(qtbot, window)
    numbers = view.numbers()
    assert numbers["empty"] and "appears here once a run has drafted" in numbers["text"]
    assert not view.verdict.isVisible()
    assert window.tabs.tabText(window.tabs.indexOf(view)) == "Calibration"


def test_the_view_shows_a_known_runs_numbers_and_follows_the_run(qtbot, window):
    view = _shown(qtbot, window)
    config, rounds = known_run()
    window.model.begin(config)
    window.model.extend(rounds)
    view.refresh()
    numbers = view.numbers()
    assert numbers["bins"] == KNOWN_BINS
    assert numbers["acceptance_by_depth"] == pytest.approx(KNOWN_BY_DEPTH)
    assert numbers["reached_by_depth"] == [3, 2, 1] and numbers["training"] is None
    assert "not a draft head" in view.verdict.text()
    # another run (a head's, greedy): the view starts afresh and draws the head's training line
    other, other_rounds = known_run({"head": "bundled:eagle3-target"}, greedy=True, chains=KNOWN[:1])
    window.model.begin(other)
    view.refresh()
    assert view.numbers()["empty"]
    window.model.extend(other_rounds)
    view.refresh()
    numbers = view.numbers()
    assert numbers["bins"] == [(0.15, 0.0, 1), (0.95, 1.0, 1)]
    assert numbers["training"] == pytest.approx(_bundled_record()["heldout"]["greedy"]["accuracy_by_depth"])
    x, y = view.trained_line.getData()
    assert list(x) == [1, 2, 3, 4] and list(y) == pytest.approx(numbers["training"])


def test_a_live_run_fills_the_view_as_it_goes(qtbot, window):
    configure(window, max_new_tokens="24")
    window.start_run()
    wait_idle(qtbot, window)
    view = _shown(qtbot, window)
    numbers = view.numbers()
    assert not numbers["empty"]
    reached = sum(numbers["reached_by_depth"])
    assert reached > 0 and sum(n for _, _, n in numbers["bins"]) == reached  # the draft model records confidence
    assert all(0 <= x <= 1 and 0 <= y <= 1 for x, y, _ in numbers["bins"])


# --------------------------------------------------------------------------- the head fault


def test_the_calibration_model_says_where_the_head_feature_shift_shows():
    """The bundled EAGLE-3 head, greedy, clean and with fault head-feature-shift: the same
    output (tests/core/faults/test_head_faults.py), and the faulty run's acceptance at depth 1 far
    below the head's held-out greedy accuracy (measured 0.40 against 0.67; clean 0.82)."""
    from specscope.core import SamplingConfig, SpeculativeDecoder
    from specscope.core.draft.registry import build_proposer
    from specscope.core.faults.zoo import faulty_decoder
    from specscope.core.loading import bundled_path, example_prompts, load_model, load_tokenizer

    greedy = SamplingConfig(temperature=0)
    target = load_model(bundled_path("target"), device="cpu", dtype="float32")
    prompt = load_tokenizer(bundled_path("target"))(example_prompts()[2].text, add_special_tokens=False)["input_ids"]
    clean = SpeculativeDecoder(target, build_proposer("eagle3"), k=4, sampling=greedy).generate(prompt, 48)
    faulty = faulty_decoder("head-feature-shift", target, build_proposer("eagle3"), k=4, sampling=greedy).generate(
        prompt, 48
    )
    bad, good = calibration_of(faulty.rounds, faulty.config), calibration_of(clean.rounds, clean.config)
    assert bad.reference.label == "held-out greedy"
    assert [s.depth for s in bad.shortfalls][:1] == [1]
    assert bad.shortfalls[0].realised < bad.shortfalls[0].training - 0.2
    assert "depth 1" in bad.verdict() and "exact" in bad.verdict()
    assert good.shortfalls == () and good.with_confidence == good.reached > 0


def test_the_findings_panel_does_not_call_a_head_fault_silent():
    """A run recorded with head-feature-shift has no findings because no rule can see it,
    not because it never fired: the panel says where it shows instead."""
    from specscope.app.gui.views.findings import fault_never_fired

    text = fault_never_fired("head-feature-shift")
    assert "No checker rule can see it" in text and "Calibration tab" in text and "never fired" not in text
    assert "never fired" in fault_never_fired("eos-leak")
