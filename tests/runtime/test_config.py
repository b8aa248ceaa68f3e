"""DecodingConfig: one typed, frozen record of every tuning constant; checked fields, overrides, and the
classes that take their defaults from it."""

from __future__ import annotations

import dataclasses

import pytest

from jacobi_rt.runtime.acceptance import AcceptanceTracker, PassCosts
from jacobi_rt.runtime.auto import AutoProposer
from jacobi_rt.runtime.config import (
    DEFAULTS,
    FIELDS,
    LOAD_FIELDS,
    DecodingConfig,
    DraftConfig,
    changed_fields,
    describe,
)
from jacobi_rt.runtime.draft_length import DraftLength
from jacobi_rt.runtime.errors import InputError
from jacobi_rt.runtime.pass_budget import PassBudget
from jacobi_rt.runtime.proposers import LookaheadProposer
from jacobi_rt.runtime.windows import AdaptiveWindow
from jacobi_rt.tools.cli.decoding import parse_assignments


def test_every_field_says_why_and_the_config_is_frozen():
    assert all(why and len(why) > 20 for _, _, why in describe())
    assert {name for name, _, _ in describe()} == set(FIELDS)
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULTS.lookahead.branches = 3


def test_the_fields_are_grouped_by_the_method_they_tune():
    assert {name.split(".")[0] for name in FIELDS if "." in name} == {
        "jacobi",
        "lookahead",
        "draft",
        "auto",
        "costs",
        "batch",
        "prefix_cache",
    }
    assert "lookahead.branches" in FIELDS and "draft.max_length" in FIELDS and "window" in FIELDS


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"window": 0}, "window must be from 1 to 64"),
        ({"lookahead": {"branches": 1.5}}, "lookahead.branches must be an integer"),
        ({"lookahead.decay": 1.5}, "lookahead.decay must be from 0 to 1"),
        ({"draft": {"jacobi_tail": 1}}, "draft.jacobi_tail must be true or false"),
        ({"draft": {"length": 9}}, "draft.length \\(9\\) must be at most draft.max_length"),
        ({"costs.pass_costs": [[0, 1.0]]}, "costs.pass_costs needs distinct widths >= 1"),
        ({"costs": {"pass_costs": "cheap"}}, "costs.pass_costs must be \\(width, cost\\) pairs"),
        ({"lookahead.branches": None}, "lookahead.branches cannot be null"),
        (
            {"windoww": 4},
            "unknown decoding config field\\(s\\) windoww \\(did you mean window\\?\\); the fields are window, ",
        ),
        (
            {"draft_max_length": 4},
            "draft_max_length \\(did you mean draft.max_length\\?\\)",
        ),  # the flat names of before
        ({"lookahead": {"brunches": 1}}, "lookahead.brunches \\(did you mean lookahead.branches\\?\\)"),
        ({"draft": 4}, "draft \\(a group: set its fields, draft.max_length, draft.length, "),  # a group given a value
    ],
)
def test_bad_fields_are_refused_with_what_to_do(overrides, message):
    with pytest.raises(InputError, match=message):
        DEFAULTS.with_overrides(overrides)


def test_overrides_apply_on_top_nested_or_dotted_and_engine_fields_are_refused_per_request():
    config = DEFAULTS.with_overrides({"lookahead": {"branches": 1}, "costs.pass_costs": {"1": 1, "8": 1.1}})
    assert config.lookahead.branches == 1 and config.costs.pass_costs == ((1, 1.0), (8, 1.1))
    assert config.lookahead.decay == DEFAULTS.lookahead.decay  # the rest of the group is kept
    assert changed_fields(DEFAULTS, config) == {"lookahead.branches": 1, "costs.pass_costs": ((1, 1.0), (8, 1.1))}
    assert config.with_overrides(DecodingConfig(window=4)).window == 4 and config.with_overrides(None) is config
    assert config.with_overrides({"draft": DraftConfig(max_length=3)}).draft.max_length == 3  # a whole group
    assert "batch.prefill_chunk" in LOAD_FIELDS and "lookahead.branches" not in LOAD_FIELDS
    with pytest.raises(InputError, match="batch.prefill_chunk are set where the generator is loaded"):
        DEFAULTS.with_overrides({"batch": {"prefill_chunk": 8}}, per_request=True)


def test_cli_assignments_are_json_values():
    assert parse_assignments(
        ["lookahead.branches=1", "costs.learn=false", "costs.pass_costs=[[1, 1.0], [8, 1.2]]", "window=null"]
    ) == {"lookahead.branches": 1, "costs.learn": False, "costs.pass_costs": [[1, 1.0], [8, 1.2]], "window": None}
    with pytest.raises(InputError, match="FIELD=VALUE"):
        parse_assignments(["lookahead.branches"])


def test_the_classes_take_their_group_whole_with_the_config_defaults():
    tracker, costs, length = AcceptanceTracker(), PassCosts(), DraftLength()
    assert tracker.config == DEFAULTS.lookahead and costs.config == DEFAULTS.costs and length.config == DEFAULTS.draft
    assert costs.table == dict(DEFAULTS.costs.pass_costs)
    assert LookaheadProposer().branches == DEFAULTS.lookahead.branches
    assert AutoProposer({"a": LookaheadProposer()}).config == DEFAULTS.auto
    assert AdaptiveWindow(8).config == DEFAULTS.jacobi
    assert PassBudget().costs.batch_table == dict(DEFAULTS.costs.batch_pass_costs)


def test_each_group_reaches_what_it_tunes():
    config = DEFAULTS.with_overrides(
        {
            "lookahead": {"prior": 0.2, "margin": 0.1},
            "costs": {"learn": False, "pass_costs": ((1, 1.0), (8, 1.1)), "batch_pass_costs": ((1, 1.0), (64, 2.0))},
            "draft": {"prior_cost": 0.9, "probe_every": 3},
            "jacobi.probe_every": 7,
            "batch.prefill_tokens": 40,
        }
    )
    costs = PassCosts(config.costs)
    tracker = AcceptanceTracker(costs, config.lookahead)
    assert (tracker.config.prior, tracker.config.margin, tracker.costs.config.learn, tracker.costs.table) == (
        0.2,
        0.1,
        False,
        {1: 1.0, 8: 1.1},
    )
    length = DraftLength(costs, config.draft)
    assert (length.relative_cost, length.config.probe_every) == (0.9, 3)
    assert AdaptiveWindow(4, config.jacobi).config.probe_every == 7
    budget = PassBudget.of(config, prefill_chunk=256)
    assert (budget.prefill_tokens, budget.costs.batch_table) == (40, {1: 1.0, 64: 2.0})
    assert PassBudget.of(DEFAULTS, prefill_chunk=8).prefill_tokens == 16  # max(chunk, 16)
