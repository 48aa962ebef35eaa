"""A proposer kind registered in core.draft.registry alone works from the CLI, the run panel, the
compare lanes and ModelHub.build, with no change to the app.

The kind is defined here: "repeat-last" proposes the last context token k times (or `times`
times) as a point mass. It is registered for these tests only and removed afterwards.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from specscope.core.draft.proposers import Draft, ProposerBase, chain_parents
from specscope.core.draft.registry import KINDS, Param, ProposerKind, register
from tests.app.cli.test_run import checkpoints, run_cli  # noqa: F401  (the tiny checkpoints fixture)
from tests.app.helpers import configure, wait_idle

PROMPT = "1 2 3 4 5 6 7 8 1 2 3 4"


class RepeatLastProposer(ProposerBase):
    """Proposes the last context token again, as a point mass (q = one-hot)."""

    name = "repeat-last"

    def __init__(self, times: int = 0):
        self.times = times  # 0 = k
        self.spec = "repeat-last"
        self.label = None
        self.vocab_size: int | None = None

    def bind(self, vocab_size: int, use_cache: bool) -> None:
        self.vocab_size = vocab_size

    def reset(self) -> None:
        pass

    def propose(self, context, k, sampling, rng) -> Draft:
        n = min(self.times or k, k)
        tokens = (int(context[-1]),) * n
        q = None
        if not sampling.greedy and n:
            q = np.zeros((n, self.vocab_size))
            q[:, tokens[0]] = 1.0
        return Draft(tokens=tokens, parents=chain_parents(n), q=q)

    def observe(self, committed_len: int) -> int | None:
        return None

    def params(self) -> dict:
        return {"times": self.times}

    @property
    def cache_length(self) -> int | None:
        return None


@pytest.fixture
def repeat_last():
    kind = register(
        ProposerKind(
            "repeat-last",
            "repeat last: propose the last context token again",
            lambda spec, _load: RepeatLastProposer(**spec.params),
            params=(Param("times", int, 0, "tokens per round (0 = k)"),),
        )
    )
    yield kind
    KINDS.pop("repeat-last", None)


def cli_args(checkpoints, *extra):
    target, _ = checkpoints
    return ["run", "--target", target, "--prompt-ids", "1,2,3,4,1,2", "--device", "cpu", "--max-new", "16", *extra]


def test_the_cli_runs_a_newly_registered_kind(repeat_last, capsys, checkpoints, tmp_path):
    with pytest.raises(SystemExit):
        run_cli(capsys, "run", "--help")
    assert "repeat-last" in capsys.readouterr().out  # --help lists the registered kinds
    db = tmp_path / "r.sqlite"
    code, out, err = run_cli(capsys, *cli_args(checkpoints, "--proposer", "repeat-last:times=2", "--json", "--db", db))
    assert code == 0, err
    summary = json.loads(out)
    assert len(summary["new_tokens"]) == 16
    code, out, _ = run_cli(capsys, *cli_args(checkpoints, "--proposer", "lookup", "--json"))
    assert json.loads(out)["new_tokens"] == summary["new_tokens"]  # greedy: exact, whatever proposes
    from specscope.storage import TraceStore

    with TraceStore(db) as store:
        (info,) = store.list_runs()
        assert info.config.proposer == "repeat-last"
        assert info.config.proposer_params.get("spec", "repeat-last:times=2") == "repeat-last:times=2"
    code, _, _ = run_cli(capsys, "check", db)
    assert code == 0


def test_cli_spec_errors_are_one_line(repeat_last, capsys, checkpoints):
    target, draft = checkpoints
    for extra, words in (
        (("--proposer", "repeat-last:times=x"), "must be an integer"),
        (("--proposer", "repeat-last:size=2"), "no parameter 'size'"),
        (("--proposer", "repeat-last", "--draft", draft), "--draft"),
        (("--proposer", "repeat-last", "--lookup-max-ngram", "2"), "--lookup-max-ngram"),
        (("--proposer", "lookup:max_ngram=4", "--lookup-max-ngram", "2"), "max_ngram twice"),
        (("--proposer", "draft:tiny", "--draft", draft), "two draft models"),
        (("--proposer", "no-such-kind"), "unknown proposer"),
    ):
        code, _, err = run_cli(capsys, *cli_args(checkpoints, *extra))
        assert code == 2 and words in err and "Traceback" not in err, (extra, err)
        assert len(err.strip().splitlines()) == 1, err


def test_the_settings_offer_and_validate_a_newly_registered_kind(repeat_last):
    from specscope.app.gui.model.settings import PanelSettings, proposer_choices, validate

    choices = {c.spec: c.label for c in proposer_choices()}
    assert choices["repeat-last"] == "repeat last (times=0)"
    texts = dict(PanelSettings(prompt=PROMPT).to_texts(), proposer="repeat-last:times=3")
    assert validate(texts).settings.proposer == "repeat-last:times=3"
    assert "must be an integer" in validate(dict(texts, proposer="repeat-last:times=x")).errors["proposer"]


def test_model_hub_builds_a_newly_registered_kind(repeat_last, hub):
    from specscope.app.gui.model.settings import PanelSettings

    prep = hub.build(PanelSettings(prompt=PROMPT, proposer="repeat-last:times=2", max_new_tokens=20))
    assert isinstance(prep.decoder.proposer, RepeatLastProposer) and prep.decoder.proposer.times == 2
    result = prep.decoder.start(prep.prompt_ids, config=prep.config).drain()
    assert len(result.new_tokens) == 20 and all(len(r.nodes) <= 2 for r in result.rounds)


def test_the_run_panel_and_compare_lanes_run_a_newly_registered_kind(repeat_last, qtbot, make_window, hub):
    from specscope.app.gui.model.settings import PanelSettings

    window = make_window()
    assert window.run_panel.proposer.findData("repeat-last") >= 0
    assert all(c.findData("repeat-last") >= 0 for c in window.compare.proposers)
    configure(window, proposer="repeat-last")
    assert window.run_panel.texts()["proposer"] == "repeat-last"
    window.run_panel.run_button.click()
    wait_idle(qtbot, window)
    assert window.last_error is None
    assert window.model.config.proposer == "repeat-last"
    lookup = hub.build(PanelSettings(prompt=PROMPT, proposer="lookup", max_new_tokens=24, eos_disabled=True))
    expected = lookup.decoder.start(lookup.prompt_ids, config=lookup.config).drain().new_tokens
    assert window.model.output_tokens == list(expected)  # greedy: exact, whatever proposes
