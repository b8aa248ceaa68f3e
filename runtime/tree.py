"""Candidate continuations as one window: a trie with its positions and ancestor mask, and its verdict.

The window graph verifies several branches in one pass: `position_ids` give each node its
depth after the committed prefix, `window_mask` lets a node see only its ancestors, and the
accepted branch is the one the target's own predictions walk down, so the committed tokens are
exactly greedy decoding's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass
class Verdict:
    """The result of verifying a tree: what to commit and which window rows' KV to keep."""

    path: list[int]  # accepted guess nodes, root excluded, root to leaf
    committed: list[int]  # the target's predictions along root + path: exactly what greedy decoding emits
    keep: list[int]  # window rows whose KV to keep, in order: [0, *path]

    @property
    def contiguous(self) -> bool:
        """True when `keep` is 0..n-1: a plain commit(n) suffices, no KV gather."""
        return self.keep == list(range(len(self.keep)))


@dataclass
class Tree:
    """Candidate continuations flattened into one window: a trie whose shared prefixes appear once.

    Node 0 is the root (the last committed token). Nodes are in depth-first order following the
    candidates' order, so the first candidate occupies rows 1..len and a single candidate gives the
    plain Jacobi window with a lower-triangular mask.
    """

    tokens: list[int]
    parents: list[int]  # parent node of each node; -1 for the root
    positions: list[int]  # depth of each node (root 0): add the committed length for position_ids
    window_mask: np.ndarray  # bool [W, W]: row i may attend to column j iff j is i or an ancestor of i

    def accept(self, predictions: Sequence[int]) -> Verdict:
        return accept_branch(self.tokens, self.parents, predictions)


def build_tree(root: int, candidates: Sequence[Sequence[int]], max_nodes: int | None = None) -> Tree:
    """Merge candidates into a trie under `root`; stop adding nodes at `max_nodes` (root counted).

    Duplicates and candidates that are prefixes of others add no nodes; the nodes are numbered depth
    first (see Tree: children in insertion order), also where a later candidate branches off early.
    """
    trie: dict[int, dict] = {}  # token -> the subtrie below it
    size = 1
    for candidate in candidates:
        node = trie
        for token in candidate:
            token = int(token)
            if token not in node:
                if max_nodes is not None and size >= max_nodes:
                    break
                node[token], size = {}, size + 1
            node = node[token]
    tokens, parents, depth = [int(root)], [-1], [0]
    stack = [(token, sub, 0) for token, sub in reversed(trie.items())]
    while stack:
        token, sub, parent = stack.pop()
        stack += [(child, below, len(tokens)) for child, below in reversed(sub.items())]
        tokens.append(token)
        parents.append(parent)
        depth.append(depth[parent] + 1)
    return Tree(tokens, parents, depth, ancestor_mask(parents))


def ancestor_mask(parents: Sequence[int]) -> np.ndarray:
    """Bool [W, W]: each node attends to itself and its ancestors (parents precede children)."""
    mask = np.zeros((len(parents), len(parents)), dtype=bool)
    for node, parent in enumerate(parents):
        if parent >= 0:
            mask[node] = mask[parent]
        mask[node, node] = True
    return mask


def leaf_paths(parents: Sequence[int]) -> list[list[int]]:
    """Every root-to-leaf path of a tree, as node lists starting at the root (0)."""
    paths = []
    for leaf in sorted(set(range(len(parents))) - set(parents)):
        path = [leaf]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        paths.append(path[::-1])
    return paths


def accept_branch(tokens: Sequence[int], parents: Sequence[int], predictions: Sequence[int]) -> Verdict:
    """Walk from the root, each step to the child whose token the target predicted at the current node.

    predictions[i] is the target's next token after node i given node i's ancestors (greedy, or sampled
    for that prefix), so every committed token is the target's own choice: the result equals one token
    a pass exactly.
    """
    children: dict[tuple[int, int], int] = {}
    for node in range(len(tokens) - 1, 0, -1):  # first occurrence wins if a caller built duplicate siblings
        children[(parents[node], int(tokens[node]))] = node
    node, path = 0, []
    committed = [int(predictions[0])]
    while (child := children.get((node, committed[-1]))) is not None:
        node = child
        path.append(node)
        committed.append(int(predictions[node]))
    return Verdict(path, committed, [0, *path])
