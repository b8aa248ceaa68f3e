"""DecodingConfig: one typed, frozen record of every tuning constant; checked fields, overrides, and the
classes that take their defaults from it."""

from __future__ import annotations

import dataclasses

import pytest

from jacobi_rt.runtime.acceptance import AcceptanceTracker, PassCosts
from jacobi_rt.runtime.config import (DEFAULTS, ENGINE_FIELDS, FIELDS, DecodingConfig, describe,
                                      parse_assignments)
from jacobi_rt.runtime.draft import DraftLength
from jacobi_rt.runtime.errors import InputError
from jacobi_rt.runtime.proposers import AutoProposer, LookaheadProposer
from jacobi_rt.runtime.scheduler import PassBudget
from jacobi_rt.runtime.windows import AdaptiveWindow


def test_every_field_says_why_and_the_config_is_frozen():
    assert all(why and len(why) > 20 for _, _, why in describe())
    assert {name for name, _, _ in describe()} == set(FIELDS)
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULTS.branches = 3


@pytest.mark.parametrize("overrides, message", [
    ({"window": 0}, "window must be from 1 to 64"),
    ({"branches": 1.5}, "branches must be an integer"),
    ({"acceptance_decay": 1.5}, "acceptance_decay must be from 0 to 1"),
    ({"jacobi_tail": 1}, "jacobi_tail must be true or false"),
    ({"draft_length": 9}, "draft_length \\(9\\) must be at most draft_max_length"),
    ({"pass_costs": [[0, 1.0]]}, "pass_costs needs distinct widths >= 1"),
    ({"pass_costs": "cheap"}, "pass_costs must be \\(width, cost\\) pairs"),
    ({"branches": None}, "branches cannot be null"),
    ({"windoww": 4}, "unknown decoding config field\\(s\\) windoww; the fields are window, "),
])
def test_bad_fields_are_refused_with_what_to_do(overrides, message):
    with pytest.raises(InputError, match=message):
        DEFAULTS.with_overrides(overrides)


def test_overrides_apply_on_top_and_engine_fields_are_refused_per_request():
    config = DEFAULTS.with_overrides({"branches": 1, "pass_costs": {"1": 1, "8": 1.1}})
    assert config.branches == 1 and config.pass_cost_table() == {1: 1.0, 8: 1.1}
    assert config.with_overrides(DecodingConfig(window=4)).window == 4 and config.with_overrides(None) is config
    assert "prefill_chunk" in ENGINE_FIELDS and "branches" not in ENGINE_FIELDS
    with pytest.raises(InputError, match="prefill_chunk are set where the generator is loaded"):
        DEFAULTS.with_overrides({"prefill_chunk": 8}, per_request=True)


def test_cli_assignments_are_json_values():
    assert parse_assignments(["branches=1", "learn_costs=false", "pass_costs=[[1, 1.0], [8, 1.2]]", "window=null"]) == {
        "branches": 1, "learn_costs": False, "pass_costs": [[1, 1.0], [8, 1.2]], "window": None}
    with pytest.raises(InputError, match="FIELD=VALUE"):
        parse_assignments(["branches"])


def test_the_classes_take_their_defaults_from_the_config():
    tracker, costs, length = AcceptanceTracker(), PassCosts(), DraftLength(DEFAULTS.draft_max_length)
    assert (tracker.prior, tracker.decay, tracker.margin) == (DEFAULTS.acceptance_prior, DEFAULTS.acceptance_decay,
                                                              DEFAULTS.acceptance_margin)
    assert costs.table == DEFAULTS.pass_cost_table() and costs.min_samples == DEFAULTS.cost_min_samples
    assert (length.prior_p, length.probe_every) == (DEFAULTS.draft_prior_acceptance, DEFAULTS.draft_probe_every)
    assert LookaheadProposer().branches == DEFAULTS.branches
    assert AutoProposer({"a": LookaheadProposer()}).probe_budget == DEFAULTS.auto_probe_budget
    assert AdaptiveWindow(8).probe_every == DEFAULTS.window_probe_every
    assert PassBudget().costs.batch_table == DEFAULTS.batch_cost_table()


def test_from_config_carries_every_tuned_field():
    config = DecodingConfig(acceptance_prior=0.2, acceptance_margin=0.1, learn_costs=False, pass_costs=((1, 1.0), (8, 1.1)),
                            draft_prior_cost=0.9, draft_probe_every=3, window_probe_every=7, batch_prefill_tokens=40,
                            batch_pass_costs=((1, 1.0), (64, 2.0)))
    tracker = AcceptanceTracker.from_config(config)
    assert (tracker.prior, tracker.margin, tracker.costs.learn, tracker.costs.table) == (0.2, 0.1, False, {1: 1.0, 8: 1.1})
    length = DraftLength.from_config(config)
    assert (length.prior_cost, length.probe_every, length.costs.table) == (0.9, 3, {1: 1.0, 8: 1.1})
    assert AdaptiveWindow.from_config(config, 4).probe_every == 7
    budget = PassBudget.from_config(config, prefill_chunk=256)
    assert (budget.prefill_tokens, budget.costs.batch_table) == (40, {1: 1.0, 64: 2.0})
    assert PassBudget.from_config(DEFAULTS, prefill_chunk=8).prefill_tokens == 16  # max(chunk, 16)
