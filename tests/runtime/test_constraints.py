"""runtime/constraints.py: constraints checked when made, and a matcher whose tree masks are the
masks one-token decoding sees at each node."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("llguidance", reason="structured output needs llguidance: pip install '.[structured]'")

from benchmarks.extraction import extraction_set  # noqa: E402
from jacobi_rt.runtime.constraints import Constraint, ConstraintError  # noqa: E402
from jacobi_rt.runtime.errors import InputError  # noqa: E402
from jacobi_rt.runtime.grammar import grammar_tokenizer  # noqa: E402
from jacobi_rt.runtime.manifest import load_manifest  # noqa: E402
from jacobi_rt.runtime.tokenizer import Tokenizer  # noqa: E402
from jacobi_rt.runtime.tree import build_tree  # noqa: E402

SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "age", "tags", "kind"],
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "kind": {"enum": ["cat", "dog"]},
    },
}


@pytest.fixture(scope="module")
def smollm2_tokens(artifact):
    """The SmolLM2 tokenizer and its grammar bridge (tokenizer only: no model is loaded)."""
    folder = artifact("smollm2-135m")
    manifest = load_manifest(folder, verify=False)
    tokenizer = Tokenizer(folder, manifest)
    return tokenizer, grammar_tokenizer(tokenizer, manifest.architecture.vocab_size, manifest.tokens.eos_ids)


@pytest.mark.parametrize(
    "make, field, says",
    [
        (
            lambda: Constraint.json_schema({"type": "foo"}, "response_format.json_schema.schema"),
            "response_format.json_schema.schema",
            "Invalid type",
        ),
        (lambda: Constraint.json_schema({"properties": 5}), "json_schema", "properties must be an object"),
        (lambda: Constraint.json_schema([1, 2]), "json_schema", "must be a JSON object"),
        (lambda: Constraint.json_schema({"type": "number", "minimum": float("nan")}), "json_schema", "not plain JSON"),
        (lambda: Constraint.regex("(", "structured_outputs.regex"), "structured_outputs.regex", "unclosed group"),
        (lambda: Constraint.regex(""), "regex", "non-empty"),
        (lambda: Constraint.choice([]), "choice", "non-empty list"),
        (lambda: Constraint.choice("yes"), "choice", "non-empty list"),
        (lambda: Constraint.choice(["yes", 3]), "choice.1", "non-empty string"),
        (lambda: Constraint.lark("start: missing_rule"), "grammar", "missing_rule"),
        (lambda: Constraint("xml", "<a/>"), "constraint", "json_object, json_schema"),
    ],
)
def test_bad_constraints_are_input_errors_naming_the_field(make, field, says):
    with pytest.raises(InputError) as caught:
        make()
    assert str(caught.value).startswith(f"{field}:") and says in str(caught.value), str(caught.value)


def test_good_constraints_compile():
    Constraint.json_object()
    Constraint.json_schema(True)
    Constraint.regex(r"\d{3}-\d{4}")
    Constraint.choice(["north", "south", 'say "hi"\n'])
    Constraint.lark('start: "a"+ "b"')
    Constraint.lark('root ::= "yes" | "no"')  # GBNF, converted


def test_every_extraction_schema_accepts_its_example(smollm2_tokens):
    tokenizer, bridge = smollm2_tokens
    items = extraction_set()
    assert len(items) >= 12
    for item in items:
        fields = item.schema["properties"]
        assert 4 <= len(fields) <= 10, item.id
        matcher = bridge.matcher(Constraint.json_schema(item.schema))
        ids = tokenizer.encode(json.dumps(item.example, ensure_ascii=False), add_special_tokens=False) + [2]
        assert matcher.cut(ids) == len(ids), (item.id, bridge.text(ids[: matcher.cut(ids)]))


def test_tree_masks_are_the_masks_after_each_prefix(smollm2_tokens):
    """Each live node's row equals a fresh matcher's mask after the committed tokens and the node's
    path; a node whose token the grammar refuses (and its subtree) is dead; the state is unchanged."""
    tokenizer, bridge = smollm2_tokens
    constraint = Constraint.json_schema(SCHEMA)
    committed = tokenizer.encode('{"name": "Tom", "age": 4', add_special_tokens=False)
    matcher = bridge.matcher(constraint)
    matcher.commit(committed)
    before = matcher.masks([0], [-1]).bits[0].copy()
    good = tokenizer.encode('2, "tags": ["a"]', add_special_tokens=False)
    bad = tokenizer.encode('x, "tags"', add_special_tokens=False)
    other = tokenizer.encode(', "tags": []', add_special_tokens=False)
    tree = build_tree(committed[-1], [good, bad, other, good[:2] + bad])
    masks = matcher.masks(tree.tokens, tree.parents)
    assert np.array_equal(matcher.masks([0], [-1]).bits[0], before)
    for node in range(len(tree.tokens)):
        path, at = [], node
        while at > 0:
            path.append(tree.tokens[at])
            at = tree.parents[at]
        fresh = bridge.matcher(constraint)
        valid = fresh.cut(committed + path[::-1]) == len(committed) + len(path)
        assert masks.live[node] == valid, node
        if valid:
            fresh.commit(committed + path[::-1])
            assert np.array_equal(masks.bits[node], fresh.masks([0], [-1]).bits[0]), node
    assert not masks.live.all() and masks.live[: len(good) + 1].all()


def test_forced_cut_commit_and_the_end(smollm2_tokens):
    tokenizer, bridge = smollm2_tokens
    matcher = bridge.matcher(Constraint.json_schema(SCHEMA))
    assert bridge.text(matcher.forced()) == '{"name":'  # the space may merge with what follows: not forced yet
    text = '{"name": "Rex", "age": 3, "tags": [], "kind": "dog"}'
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert matcher.cut(ids + [2, 5]) == len(ids) + 1  # the EOS counts once the object is complete, nothing after
    assert matcher.cut(ids[:-1] + [2]) == len(ids) - 1  # not before
    matcher.commit(ids[:-1])
    assert not matcher.can_stop and not matcher.finished
    with pytest.raises(ConstraintError):
        matcher.commit([2])  # an EOS before the object is complete
    matcher.commit(ids[-1:])
    assert matcher.can_stop and matcher.finished and matcher.forced() == []
    allowed = np.flatnonzero(matcher.masks([ids[-1]], [-1]).allowed(0))
    assert allowed.tolist() == [2]
    matcher.commit([2])
    assert matcher.ended and matcher.cut([2]) == 0


def test_a_refused_commit_is_an_error_not_a_silent_state(smollm2_tokens):
    tokenizer, bridge = smollm2_tokens
    matcher = bridge.matcher(Constraint.choice(["north", "south"]))
    with pytest.raises(ConstraintError):
        matcher.commit(tokenizer.encode("west", add_special_tokens=False))


def test_choice_and_regex_masks(smollm2_tokens):
    tokenizer, bridge = smollm2_tokens
    matcher = bridge.matcher(Constraint.choice(["north", "south", "northwest"]))
    first = {bridge.text([int(t)]) for t in np.flatnonzero(matcher.masks([0], [-1]).allowed(0))}
    assert first and all("north".startswith(t) or "south".startswith(t) or "northwest".startswith(t) for t in first)
    matcher = bridge.matcher(Constraint.regex(r"[0-9]{3}"))
    digits = tokenizer.encode("123", add_special_tokens=False)
    assert matcher.cut(digits + tokenizer.encode("4", add_special_tokens=False)) == len(digits)
    assert matcher.cost.windows == 0  # cut and forced compute no mask
    matcher.masks([0], [-1])
    assert matcher.cost.windows == 1 and matcher.cost.rows == 1 and matcher.cost.seconds > 0


def test_an_offer_under_a_constraint(smollm2_tokens):
    """The forced run comes first, right with chance 1; the proposer's guesses past it follow it, cut to
    the grammar (one the grammar rejects at once is dropped), at their own rates, a draft's production paid
    only past the run; with no guess left the run alone is the offer."""
    from jacobi_rt.runtime.allocator import Guess, Offer, allocate

    tokenizer, bridge = smollm2_tokens
    matcher = bridge.matcher(Constraint.json_schema(SCHEMA))
    forced = matcher.forced()
    assert bridge.text(forced) == '{"name":'
    follows = tokenizer.encode('{"name": "Rex", "age"', add_special_tokens=False)
    assert follows[: len(forced)] == forced
    past, run = follows[len(forced) :], len(forced)
    wrong = tokenizer.encode("hello", add_special_tokens=False)  # no JSON string starts so
    bad_tail = [*past, *wrong]  # right up to the key, then not (a colon must follow it)
    draft = Guess(accept=(0.9, 0.9), tokens=None, cost=0.1)
    offer = Offer(
        (Guess((0.9,) * len(bad_tail), tuple(bad_tail)), Guess((0.9,) * len(wrong), tuple(wrong)), draft), branches=2
    )
    constrained = matcher.constrain(offer, forced)
    kept, made = constrained.offer.guesses
    assert constrained.origin == (0, 2) and constrained.forced == tuple(forced)
    assert kept.tokens == tuple(follows) and kept.free == run
    assert kept.accept == (1.0,) * run + (0.9,) * len(past)
    assert made.tokens is None and made.accept == (1.0,) * run + (0.9, 0.9) and made.free == run and made.cost == 0.1
    allocation = allocate(constrained.offer, 15, lambda width: 1 + 0.08 * (width - 1))
    lengths = dict(allocation.picks)
    assert lengths[0] == len(follows) and lengths[1] == run + 2  # both past the run
    assert allocation.production == 0.1 * 2  # the draft runs the forced run in its first pass: only its two tokens cost
    sent, own = constrained.split(allocation)
    assert sent == forced and sorted(own.picks) == [(0, len(past)), (2, 2)]  # the proposer's own indices, past the run
    alone = matcher.constrain(Offer((Guess((0.9,), tuple(wrong[:1])),)), forced)
    assert alone.origin == (None,) and alone.offer.guesses[0].tokens == tuple(forced)
    sent, own = alone.split(allocate(alone.offer, 15, lambda width: 1 + 0.08 * (width - 1)))
    assert sent == forced and own.picks == []
    matcher.commit(follows[:-1])
    assert matcher.constrain(Offer(), matcher.forced()).offer.guesses == () or matcher.forced()
