"""N-gram guess sources: prompt lookup, the lookahead pool, the acceptance tracker, branch trees."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
from alone import propose, send

from jacobi_rt.runtime.acceptance import AcceptanceTracker, PassCosts, matched_prefix, pass_cost
from jacobi_rt.runtime.allocator import Guess, Offer, allocate, cut
from jacobi_rt.runtime.config import CostConfig, LookaheadConfig
from jacobi_rt.runtime.ngram import Candidate, NgramPool, PromptLookup
from jacobi_rt.runtime.passes import pass_result
from jacobi_rt.runtime.proposers import LookaheadProposer
from jacobi_rt.runtime.tree import accept_branch, ancestor_mask, build_tree, leaf_paths


def continuations(candidates) -> list[list[int]]:
    """The continuations' tokens of a lookup."""
    return [c.tokens for c in candidates]


def accept(guesses, predictions) -> int:
    """The linear accept rule, written independently of the tree: 1 + the right guesses before the first wrong one."""
    n = 1
    for guess, prediction in zip(guesses, predictions):
        if guess != prediction:
            break
        n += 1
    return n


def lookup_of(tokens, **kwargs) -> PromptLookup:
    lookup = PromptLookup(**kwargs)
    lookup.extend(tokens)
    return lookup


# -- PromptLookup -------------------------------------------------------------------------------


def test_lookup_continues_the_longest_matching_suffix():
    # "1 2 3" is followed by 4 once; "2 3" alone later by 7 (more recent, but shorter).
    lookup = lookup_of([1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 1, 2, 3])
    (best,) = lookup.lookup(None, 3)
    assert best == Candidate([4, 5, 9], "prompt", 3)


def test_lookup_prefers_the_most_recent_occurrence():
    lookup = lookup_of([5, 6, 1, 5, 6, 2, 0, 5, 6])
    assert continuations(lookup.lookup(None, 1, limit=3)) == [[2], [1]]


def test_lookup_fills_slots_with_shorter_matches_after_longer_ones():
    lookup = lookup_of([1, 2, 3, 4, 8, 3, 5, 1, 2, 3])
    found = lookup.lookup(None, 2, limit=3)
    assert [(c.tokens, c.match_len) for c in found] == [([4, 8], 3), ([5, 1], 1)]


def test_lookup_repeated_text_continues_the_period_past_the_end():
    lookup = lookup_of([7, 8, 9, 7, 8, 9, 7])
    assert continuations(lookup.lookup(None, 7)) == [[8, 9, 7, 8, 9, 7, 8]]
    assert continuations(lookup_of([4, 4, 4]).lookup(None, 5)) == [[4, 4, 4, 4, 4]]


def test_lookup_never_matches_the_suffix_itself():
    assert continuations(lookup_of([1, 2, 3]).lookup(None, 4)) == []
    assert continuations(lookup_of([1]).lookup(None, 4)) == []


def test_lookup_edge_cases():
    lookup = lookup_of([1, 2, 1, 2])
    assert continuations(lookup.lookup(None, 0)) == []
    assert continuations(lookup.lookup([], 3)) == []
    assert continuations(lookup.lookup(None, 3, limit=0)) == []
    assert continuations(PromptLookup().lookup(None, 3)) == []
    assert continuations(lookup.lookup([9, 9], 3)) == []  # unknown tokens
    assert continuations(lookup.lookup([2, 1], 1)) == [[2]]  # an explicit tail


def test_lookup_respects_n_min_and_n_max():
    tokens = [1, 2, 3, 9, 3]
    assert continuations(lookup_of(tokens, n_min=2).lookup(None, 1)) == []  # only the 1-gram "3" matches
    assert continuations(lookup_of(tokens, n_min=1).lookup(None, 1)) == [[9]]
    long = [1, 2, 3, 4, 5, 6, 0, 2, 3, 4, 5, 6]
    assert lookup_of(long, n_max=2).lookup(None, 1)[0].match_len == 2
    assert lookup_of(long, n_max=5).lookup(None, 1)[0].match_len == 5
    with pytest.raises(ValueError):
        PromptLookup(n_min=3, n_max=2)


def test_lookup_keeps_bounded_distinct_occurrences_per_key():
    lookup = lookup_of([0, 1, 0, 2, 0, 3, 0, 1, 0, 4, 0], occurrences=3)
    assert lookup.index[(0,)] == [5, 7, 9]  # next tokens 3, 1, 4: the oldest "0 -> 1" and "0 -> 2" are gone
    assert continuations(lookup.lookup([0], 1, limit=5)) == [[4], [1], [3]]


def test_lookup_indexes_incrementally():
    lookup = PromptLookup(n_min=1, n_max=4)
    rng = random.Random(0)
    for _ in range(4000):
        before = lookup.work
        lookup.extend([rng.randrange(50)])
        assert lookup.work - before <= 4  # one insertion per n-gram size, whatever the length
        lookup.lookup(None, 8, limit=4)
    assert lookup.work == 1 + 2 + 3 + 4 * 3996
    assert lookup.index == lookup_of(lookup.tokens).index  # appending one by one == all at once


def test_lookup_matches_a_brute_force_search():
    rng = random.Random(1)
    tokens = [rng.randrange(4) for _ in range(300)]
    lookup = lookup_of(tokens, n_min=1, n_max=3)
    for end in range(3, 300, 7):
        partial = lookup_of(tokens[:end], n_min=1, n_max=3)
        got = partial.lookup(None, 1)
        expected = None
        for n in (3, 2, 1):
            suffix = tokens[end - n : end]
            starts = [s for s in range(end - n) if tokens[s : s + n] == suffix]
            if starts:
                expected = (tokens[starts[-1] + n], n)
                break
        assert [(c.tokens[0], c.match_len) for c in got] == ([expected] if expected else [])
    assert lookup.tokens == tokens


# -- NgramPool ----------------------------------------------------------------------------------


def test_pool_indexes_committed_text_once_span_tokens_follow():
    pool = NgramPool(span=3)
    pool.extend([1, 2, 3, 4, 5])
    assert continuations(pool.lookup([1, 2], 5)) == [[3, 4, 5]]
    assert continuations(pool.lookup([3, 4], 5)) == []  # only 1 token follows "3 4" so far
    pool.extend([6, 7])
    assert continuations(pool.lookup([3, 4], 5)) == [[5, 6, 7]]
    assert continuations(pool.lookup([4], 2)) == [[5, 6]]


def test_pool_extend_in_pieces_equals_extend_at_once():
    rng = random.Random(2)
    tokens = [rng.randrange(6) for _ in range(200)]
    whole, pieces = NgramPool(span=4), NgramPool(span=4)
    whole.extend(tokens)
    i = 0
    while i < len(tokens):
        step = rng.randrange(1, 5)
        pieces.extend(tokens[i : i + step])
        i += step
    assert whole.table == pieces.table
    assert len(pieces.tokens) <= 4 + 2  # the buffer stays small: no rescans of the whole text


def test_pool_prefers_two_token_keys_then_one():
    pool = NgramPool(span=2)
    pool.add([1, 2], [3, 4])
    pool.add([9, 2], [5, 6])
    found = pool.lookup([1, 2], 2, limit=3, chain=False)
    assert [(c.tokens, c.match_len) for c in found] == [([3, 4], 2), ([5, 6], 1)]


def test_pool_is_bounded_per_key_and_most_recent_first():
    pool = NgramPool(per_key=3, span=2)
    for value in range(10, 16):
        pool.add([1], [value, 0])
    assert pool.table[(1,)] == [[15, 0], [14, 0], [13, 0]]
    pool.add([1], [13, 0])  # seen again: moves to the front
    assert pool.table[(1,)] == [[13, 0], [15, 0], [14, 0]]


def test_pool_merges_continuations_that_extend_each_other():
    pool = NgramPool(span=4)
    pool.add([1], [2])
    pool.add([1], [2, 3, 4])
    pool.add([1], [2, 3])  # a prefix of a known one: refreshes it, keeps the longer
    assert pool.table[(1,)] == [[2, 3, 4]]
    pool.add([1], [9, 9, 9, 9, 9, 9])  # cut to span
    assert pool.table[(1,)] == [[9, 9, 9, 9], [2, 3, 4]]


def test_pool_observe_harvests_chains_from_the_trajectory():
    pool = NgramPool(span=4)
    # Window [5, 6, 7, 0, 1] after context [4, 5]; the target predicts 6 7 8 2 3:
    # 6 and 7 were right (n=3), 0 was wrong; 1 follows 0 in the window, 2 is predicted after it...
    pool.observe([4, 5], [6, 7, 0, 1], [6, 7, 8, 2, 3])
    assert pool.table[(4, 5)] == [[6, 7, 8]]  # the chain stops where the window left the predictions
    assert pool.table[(5, 6)] == [[7, 8]]
    assert pool.table[(6, 7)] == [[8]]
    assert pool.table[(7, 0)] == [[2]]  # a rejected position: the target's guess after the wrong 0
    assert pool.table[(0, 1)] == [[3]]
    assert continuations(pool.lookup([0], 3)) == [[2]]


def test_pool_observe_with_no_guesses_and_short_context():
    pool = NgramPool()
    pool.observe([5], [], [6])
    assert pool.table == {(5,): [[6]]}


def test_pool_lookup_chains_short_entries():
    pool = NgramPool(span=2)
    pool.add([1, 2], [3])
    pool.add([2, 3], [4, 5])
    pool.add([4, 5], [6, 7])
    assert continuations(pool.lookup([1, 2], 4)) == [[3, 4, 5, 6]]
    assert pool.lookup([1, 2], 4, chain=False)[0].tokens == [3]
    assert continuations(pool.lookup([7], 3)) == []


def test_pool_edge_cases():
    pool = NgramPool()
    pool.extend([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11])
    assert continuations(pool.lookup([1, 2], 0)) == []
    assert continuations(pool.lookup([], 3)) == []
    pool.add([], [1])
    pool.add([1], [])
    assert (1,) in pool.table and [] not in pool.table[(1,)]


# -- AcceptanceTracker ------------------------------------------------------------------------


def test_pass_cost_interpolates_and_extrapolates():
    costs = {1: 1.0, 4: 1.3, 8: 1.7}
    assert pass_cost(1, costs) == 1.0
    assert pass_cost(2, costs) == pytest.approx(1.1)
    assert pass_cost(6, costs) == pytest.approx(1.5)
    assert pass_cost(12, costs) == pytest.approx(2.1)
    assert pass_cost(5, {1: 2.0}) == 2.0


def test_matched_prefix():
    assert matched_prefix([1, 2, 3], [1, 2, 9]) == 2
    assert matched_prefix([], [1]) == 0
    assert matched_prefix([1, 2], [1]) == 1


def test_tracker_scores_tried_tokens_up_to_the_first_miss():
    tracker = AcceptanceTracker(config=LookaheadConfig(prior_weight=1e-9, decay=1.0))
    tracker.score(Candidate([1, 2, 3, 4], "prompt", 3), [1, 2, 9])  # 2 right, the 3rd wrong
    rate = tracker.rate("prompt", 3)
    assert (round(rate.right, 6), round(rate.tried, 6)) == (2, 3)
    tracker.score(Candidate([1, 2, 3, 4], "prompt", 3), [1])  # a greedy pass: 1 right, nothing else known
    assert (round(rate.right, 6), round(rate.tried, 6)) == (3, 4)
    tracker.score(Candidate([5], "prompt", 3), [1, 2])  # wrong at once
    assert (round(rate.right, 6), round(rate.tried, 6)) == (3, 5)


def test_tracker_keys_by_source_and_capped_match_length():
    tracker = AcceptanceTracker(config=LookaheadConfig(max_match=4))
    assert tracker.rate("prompt", 7) is tracker.rate("prompt", 4)
    assert tracker.rate("prompt", 2) is not tracker.rate("prompt", 4)
    assert tracker.rate("pool", 2) is not tracker.rate("prompt", 2)


def test_the_one_length_rule_weighs_a_guess_producers_own_cost():
    flat = lambda window: 1.0  # wide passes free
    assert cut((0.9,) * 8, 8, flat) == (8, pytest.approx(sum(0.9**i for i in range(9))))
    assert cut((0.9,) * 8, 0, flat) == (0, 1.0)
    free, drafted = cut((0.7,) * 8, 8, pass_cost)[0], cut((0.7,) * 8, 8, pass_cost, per_token=0.5)[0]
    assert 1 <= drafted < free  # guesses that cost a draft pass each: fewer of them pay
    assert cut((0.1,) * 8, 8, pass_cost, per_token=1.0)[1] < 1.0  # the gain says greedy is better; callers decide


def tracked_length(tracker: AcceptanceTracker, p: float, available: int) -> int:
    """What the allocator sends of one guess of `available` tokens right with chance p, against the tracker's curve
    and margin."""
    picks = allocate(Offer((Guess((p,) * available),), margin=tracker.config.margin), available, tracker.costs).picks
    return picks[0][1] if picks else 0


def test_best_length_grows_with_acceptance_and_is_zero_when_unsure():
    tracker = AcceptanceTracker()
    lengths = [tracked_length(tracker, p, 15) for p in (0.05, 0.3, 0.6, 0.8, 0.97)]
    assert lengths[0] == 0
    assert lengths == sorted(lengths) and lengths[-1] == 15
    assert tracked_length(tracker, 0.97, 0) == 0
    assert tracked_length(tracker, 0.97, 3) == 3


def test_tracker_learns_to_stop_sending_bad_guesses_and_resumes_on_good_ones():
    tracker = AcceptanceTracker()

    def suggested(available: int) -> int:
        return tracked_length(tracker, tracker.rate("pool", 1).p, available)

    bad = Candidate([9, 9, 9], "pool", 1)
    assert suggested(3) > 0  # the prior is worth a try
    for _ in range(20):
        tracker.score(bad, [1])
    assert suggested(3) == 0
    good = Candidate([1, 2, 3, 4], "pool", 1)
    for _ in range(20):
        tracker.score(good, [1])  # shadow-scored on greedy passes: never sent, still measured
    assert suggested(4) > 0


# -- Branch trees -------------------------------------------------------------------------------


def tree_paths(tree) -> set[tuple[int, ...]]:
    return {tuple(tree.tokens[i] for i in path[1:]) for path in leaf_paths(tree.parents)}


def test_single_candidate_is_the_plain_jacobi_window():
    tree = build_tree(7, [[1, 2, 3]])
    assert tree.tokens == [7, 1, 2, 3]
    assert tree.parents == [-1, 0, 1, 2]
    assert tree.positions == [0, 1, 2, 3]
    assert (tree.window_mask == np.tril(np.ones((4, 4), dtype=bool))).all()
    assert tree.window_mask.dtype == bool


def test_no_candidates_is_the_root_alone():
    tree = build_tree(7, [])
    assert (tree.tokens, tree.parents, tree.positions) == ([7], [-1], [0])
    assert tree.window_mask.tolist() == [[True]]
    verdict = tree.accept([42])
    assert (verdict.path, verdict.committed, verdict.keep) == ([], [42], [0])
    assert build_tree(7, [[], []]).tokens == [7]


def test_shared_prefixes_appear_once_and_duplicates_are_dropped():
    tree = build_tree(0, [[1, 2, 3], [1, 2, 4], [1, 2, 3], [1, 2], [5]])
    assert tree.tokens == [0, 1, 2, 3, 4, 5]
    assert tree.parents == [-1, 0, 1, 2, 2, 0]
    assert tree.positions == [0, 1, 2, 3, 3, 1]
    assert tree_paths(tree) == {(1, 2, 3), (1, 2, 4), (5,)}
    expected = [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [1, 1, 1, 0, 1, 0],
        [1, 0, 0, 0, 0, 1],
    ]
    assert tree.window_mask.astype(int).tolist() == expected


def test_nodes_are_depth_first_so_the_first_candidate_is_a_window_prefix():
    # The second candidate branches off at the root, the third deep inside the first.
    tree = build_tree(0, [[1, 2, 3, 4], [5, 6], [1, 2, 7]])
    assert tree.tokens == [0, 1, 2, 3, 4, 7, 5, 6]
    assert tree.parents == [-1, 0, 1, 2, 3, 2, 0, 6]
    assert all(p < i for i, p in enumerate(tree.parents) if i)


def test_max_nodes_cuts_the_window():
    tree = build_tree(0, [[1, 2, 3], [4, 5, 6]], max_nodes=5)
    assert tree.tokens == [0, 1, 2, 3, 4]
    assert build_tree(0, [[1, 2, 3], [1, 2, 9]], max_nodes=4).tokens == [0, 1, 2, 3]


def test_accept_no_candidate_matches_commits_one_token():
    tree = build_tree(0, [[1, 2], [3, 4]])
    verdict = tree.accept([9, 8, 8, 8, 8])
    assert (verdict.path, verdict.committed, verdict.keep) == ([], [9], [0])
    assert verdict.contiguous


def test_accept_full_match_of_the_longest_branch():
    tree = build_tree(0, [[1, 2], [3, 4, 5]])  # nodes: 0, 1, 2, 3, 4, 5 (tokens 0 1 2 3 4 5)
    predictions = [3, 0, 0, 4, 5, 6]
    verdict = tree.accept(predictions)
    assert verdict.path == [3, 4, 5]
    assert verdict.committed == [3, 4, 5, 6]  # all three guesses + the prediction after the leaf
    assert verdict.keep == [0, 3, 4, 5]
    assert not verdict.contiguous  # the caller must gather KV rows 3, 4, 5 into rows 1, 2, 3


def test_accept_two_branches_sharing_a_prefix_diverging_later():
    tree = build_tree(0, [[1, 2, 3], [1, 2, 4, 5]])  # tokens 0 1 2 3 4 5; 4 branches off after 2
    assert tree.parents == [-1, 0, 1, 2, 2, 4]
    verdict = tree.accept([1, 2, 4, 7, 5, 6])
    assert verdict.path == [1, 2, 4, 5]
    assert verdict.committed == [1, 2, 4, 5, 6]
    assert verdict.keep == [0, 1, 2, 4, 5]
    verdict = tree.accept([1, 2, 3, 8, 9, 9])
    assert (verdict.path, verdict.committed) == ([1, 2, 3], [1, 2, 3, 8])
    assert verdict.contiguous
    verdict = tree.accept([1, 2, 6, 8, 9, 9])  # diverges from both at the third token
    assert (verdict.path, verdict.committed) == ([1, 2], [1, 2, 6])


def test_accept_branch_takes_the_first_of_duplicate_siblings_built_by_hand():
    verdict = accept_branch([0, 5, 5, 6], [-1, 0, 0, 2], [5, 1, 6, 2])
    assert verdict.path == [1] and verdict.committed == [5, 1]


def test_ancestor_mask_of_hand_made_parents():
    mask = ancestor_mask([-1, 0, 0, 1, 3])
    assert mask.astype(int).tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 0, 1, 0, 0],
        [1, 1, 0, 1, 0],
        [1, 1, 0, 1, 1],
    ]


def greedy_oracle(sequence_model, prefix, n):
    """n greedy tokens of a toy 'model': next token = sequence_model(prefix)."""
    out = list(prefix)
    for _ in range(n):
        out.append(sequence_model(out))
    return out[len(prefix) :]


@pytest.mark.parametrize("seed", range(30))
def test_tree_verification_equals_greedy_on_random_trees(seed):
    """Exhaustive-ish: random small tries over a 3-token vocabulary against a toy deterministic
    model; the committed tokens always equal greedy decoding, the kept rows are root + path, and a
    node's prediction is computed from its ancestors only (what the mask lets it see)."""
    rng = random.Random(seed)
    table = {key: rng.randrange(3) for key in itertools.product(range(3), repeat=2)}

    def model(seq):
        return table[(seq[-2], seq[-1])]

    prefix = [rng.randrange(3), rng.randrange(3)]
    truth = greedy_oracle(model, prefix, 6)
    candidates = [[rng.randrange(3) for _ in range(rng.randrange(0, 5))] for _ in range(rng.randrange(0, 5))]
    if rng.random() < 0.5:
        candidates.append(truth[: rng.randrange(1, 5)])  # often include a right guess
    tree = build_tree(prefix[-1], candidates)
    # Each node's prediction from the committed prefix + the tokens its mask row shows.
    predictions = []
    for node in range(len(tree.tokens)):
        visible = [tree.tokens[j] for j in range(len(tree.tokens)) if tree.window_mask[node, j]]
        assert len(visible) == tree.positions[node] + 1
        predictions.append(model(prefix[:-1] + visible))
    verdict = tree.accept(predictions)
    assert verdict.committed == truth[: len(verdict.committed)]
    assert verdict.keep == [0, *verdict.path]
    longest = max((matched_prefix(c, truth) for c in candidates), default=0)
    assert len(verdict.committed) == longest + 1
    # With one candidate the tree agrees with the loop's linear accept rule.
    if len(candidates) == 1:
        assert len(verdict.committed) == accept(candidates[0], predictions)


# -- LookaheadProposer ------------------------------------------------------------------------------


def run_loop(proposer, model, prompt, new, window):
    """The decoding loop with a toy model: returns the new tokens and the number of passes."""
    seq = list(prompt)
    seq.append(model(seq))
    proposer.start(list(prompt), seq[-1])
    passes = 0
    while len(seq) - len(prompt) < new:
        passes += 1
        guesses, sent = propose(proposer, window - 1)
        tree = build_tree(seq[-1], guesses, max_nodes=window)
        predictions = [
            model(seq[:-1] + [tree.tokens[j] for j in range(len(tree.tokens)) if tree.window_mask[i, j]])
            for i in range(len(tree.tokens))
        ]
        verdict = tree.accept(predictions)
        proposer.observe(pass_result(tree, predictions, verdict, 0.0, sent=sent))  # toy passes: no time to learn from
        seq.extend(verdict.committed)
    return seq[len(prompt) :][:new], passes


def copy_model(source):
    """A toy model that copies `source` text: after the longest suffix found in it, its next token."""

    def model(seq):
        for n in (4, 3, 2, 1):
            suffix = seq[-n:]
            for i in range(len(source) - n - 1, -1, -1):
                if source[i : i + n] == suffix:
                    return source[i + n]
        return (seq[-1] * 7 + 3) % 50

    return model


@pytest.mark.parametrize("branches", [1, 3])
def test_proposer_output_equals_greedy_and_saves_passes_on_copying(branches):
    rng = random.Random(3)
    source = [rng.randrange(1000) for _ in range(80)]
    model = copy_model(source)
    prompt = source + [1001] + source[:5]  # a summarising-like prompt: the model copies the text
    greedy = greedy_oracle(model, prompt, 40)
    assert greedy == source[5:45]
    out, passes = run_loop(
        LookaheadProposer(branches, AcceptanceTracker(costs=PassCosts(CostConfig(learn=False)))),
        model,
        prompt,
        40,
        window=8,
    )
    assert out == greedy
    assert passes <= 8  # greedy needs 39 passes, a perfect window of 8 needs 5


def test_proposer_sends_nothing_when_guesses_keep_failing():
    rng = random.Random(4)
    table = [rng.randrange(1000) for _ in range(1000)]

    def model(seq):  # a long random walk: n-grams of the prompt never come true
        return table[(seq[-1] * 31 + len(seq)) % 1000]

    prompt = [rng.randrange(1000) for _ in range(200)]
    proposer = LookaheadProposer(
        tracker=AcceptanceTracker(costs=PassCosts(CostConfig(learn=False)))
    )  # toy passes take no time to learn from
    out, passes = run_loop(proposer, model, prompt, 120, window=8)
    assert out == greedy_oracle(model, prompt, 120)
    sent = []
    original = proposer.observe
    proposer.observe = lambda result: sent.append(result.sent.sent) or original(result)
    run_loop(proposer, model, prompt, 30, window=8)
    assert sum(sent[-10:]) <= 2  # settled on (nearly) plain greedy passes


def test_proposer_k_zero_and_empty_prompt():
    proposer = LookaheadProposer()
    proposer.start([], 5)
    assert send(proposer, 0) == []
    guesses, sent = propose(proposer, 4)
    assert guesses == []  # nothing known yet
    tree = build_tree(5, [])
    proposer.observe(pass_result(tree, [6], tree.accept([6]), 0.0, sent=sent))
    assert proposer.lookup.tokens == [5, 6]


def test_tracker_learns_the_cost_curve_from_measured_passes():
    tracker = AcceptanceTracker()
    assert tracker.costs(8) == pass_cost(8)  # the table until both windows are timed
    for _ in range(3):
        tracker.costs.observe(1, 0.010)
        tracker.costs.observe(8, 0.011)  # a GPU-like flat curve
    assert tracker.costs(8) == pytest.approx(1.1)
    assert tracked_length(tracker, 0.5, 7) == 7  # wide passes nearly free: send everything
    fixed = AcceptanceTracker(costs=PassCosts(CostConfig(learn=False)))
    fixed.costs.observe(1, 0.010)
    assert fixed.costs(8) == pass_cost(8)


def test_the_cost_curve_is_keyed_by_rows_and_width_not_total_tokens():
    costs = PassCosts(CostConfig(min_samples=1))
    assert costs(32) == pass_cost(32) and costs(2, rows=16) == pass_cost(32, costs.batch_table)  # the two priors
    assert costs(2, rows=16) > costs(32)  # 16 rows x 2 cost more than one row of 32
    costs.observe(1, 0.010)
    costs.observe(16, 0.050, rows=1)
    costs.observe(1, 0.030, rows=16)  # a batched pass of 16 tokens teaches (16, 1), never one row of 16
    assert costs(16) == pytest.approx(5.0) and costs(1, rows=16) == pytest.approx(3.0)
    assert costs.unit_seconds() == pytest.approx(0.010)
