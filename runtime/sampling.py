"""Sampling that every decoding strategy reproduces: Gumbel-max with noise fixed per (seed, position, token).

For request seed s, the token at absolute position t is

    argmax over survivors i of  z[i] + g(s, t, i),    z = penalised logits / temperature

where the survivors are the tokens left by top-k, top-p and min-p, and g(s, t, i) is standard
Gumbel noise from a counter-based generator (Philox-4x64-10, key (s, 0), counter (i // 4 + 1, t, 0, 0),
word i % 4: numpy's `Philox` gives the same numbers on every platform). The Gumbel-max trick
makes this an exact draw from the filtered softmax, and it is a deterministic function of the
prefix: penalties read only the tokens before t, filtering is the same computation every time,
and the noise depends on (s, t, i), not on which pass or window computed the logits. So Jacobi,
lookahead and speculative decoding verify a guess against the sampled token exactly as they do
against a greedy id, and every strategy emits the same tokens for the same seed.

    sampler = Sampler(SamplingParams(temperature=0.7, top_p=0.9, seed=1), prompt_len=len(prompt))
    token = sampler.sample(logits_row, prefix_tokens, position=len(prefix_tokens))
"""

from __future__ import annotations

import math
import numbers
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .errors import InputError

MAX_LOGPROBS = 20
# Smaller temperatures are refused: logits / 1e-310 overflows to inf and the pick is lost. vLLM treats
# temperatures below the same 1e-5 as greedy; refusing them says so instead of changing the request.
MIN_TEMPERATURE = 1e-5
REPETITION_RANGE = (0.01, 100.0)  # a penalty of 5e-324 sent a logit to inf and left sampling no finite token
SEED_RANGE = (-(2**63), 2**64)  # int64 and uint64 seeds are both accepted; the key is seed mod 2**64


@dataclass(frozen=True)
class SamplingParams:
    """How to choose each token. temperature 0 (the default) is greedy decoding."""

    temperature: float = 0.0  # 0: greedy; >= MIN_TEMPERATURE: sample from softmax(logits / temperature)
    top_k: int = 0  # keep the k most likely tokens; 0: all
    top_p: float = 1.0  # keep the smallest most-likely set with probability >= top_p; 1: all
    min_p: float = 0.0  # keep tokens with probability >= min_p * the top token's; 0: all
    seed: int | None = None  # None: Generator draws one (reported in the result)
    repetition_penalty: float = 1.0  # HF/vLLM: logits of tokens in the prompt or output / p (> 0), or * p (< 0)
    frequency_penalty: float = 0.0  # OpenAI: minus this times the token's count in the output so far
    presence_penalty: float = 0.0  # OpenAI: minus this once if the token is in the output so far
    logprobs: int | None = None  # None: none; N >= 0: the chosen token's logprob and the N most likely
    coupled_draft: bool = True  # a draft model samples its guesses with the target's noise (speed only)

    def __post_init__(self) -> None:
        _number(
            "temperature",
            self.temperature,
            lambda v: v == 0 or v >= MIN_TEMPERATURE,
            f"0 (greedy) or a number >= {MIN_TEMPERATURE:g} (smaller ones can overflow logits / temperature; "
            "vLLM treats them as greedy: send 0)",
        )
        _integer("top_k", self.top_k, lambda v: v >= 0, "an integer >= 0 (0 keeps every token)")
        _number("top_p", self.top_p, lambda v: 0 < v <= 1, "a number in (0, 1] (1 keeps every token)")
        _number("min_p", self.min_p, lambda v: 0 <= v <= 1, "a number in [0, 1] (0 keeps every token)")
        _number(
            "repetition_penalty",
            self.repetition_penalty,
            lambda v: REPETITION_RANGE[0] <= v <= REPETITION_RANGE[1],
            f"a number from {REPETITION_RANGE[0]:g} to {REPETITION_RANGE[1]:g} (1 means none; past those, logits / p "
            "overflow to infinity)",
        )
        _number("frequency_penalty", self.frequency_penalty, lambda v: -2 <= v <= 2, "a number in [-2, 2]")
        _number("presence_penalty", self.presence_penalty, lambda v: -2 <= v <= 2, "a number in [-2, 2]")
        if self.seed is not None:
            _integer("seed", self.seed, lambda v: SEED_RANGE[0] <= v < SEED_RANGE[1], "an integer (64-bit)")
        if not isinstance(self.coupled_draft, bool):
            raise InputError(f"coupled_draft must be true or false, not {self.coupled_draft!r}")
        if self.logprobs is not None:
            _integer(
                "logprobs", self.logprobs, lambda v: 0 <= v <= MAX_LOGPROBS, f"an integer from 0 to {MAX_LOGPROBS}"
            )

    @property
    def greedy(self) -> bool:
        """True when the in-graph greedy ids are the answer: no logits need to reach the host."""
        return self.temperature == 0 and not self.penalised and self.logprobs is None

    @property
    def sampled(self) -> bool:
        """True when tokens are drawn (temperature > 0), so a seed matters; greedy with penalties draws none."""
        return self.temperature > 0

    @property
    def penalised(self) -> bool:
        return self.repetition_penalty != 1 or self.frequency_penalty != 0 or self.presence_penalty != 0

    def with_seed(self, seed: int) -> SamplingParams:
        return SamplingParams(**{**self.__dict__, "seed": seed})


def draw_seed() -> int:
    """A fresh seed for a request that gave none (returned to the user so the output can be reproduced)."""
    return secrets.randbits(63)


def _number(name: str, value, ok, allowed: str) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or not ok(value):
        raise InputError(f"{name} must be {allowed}, not {value!r}")


def _integer(name: str, value, ok, allowed: str) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not ok(int(value)):
        raise InputError(f"{name} must be {allowed}, not {value!r}")


# -- the noise ------------------------------------------------------------------------------------

_M0, _M1 = np.uint64(0xD2E7470EE14C6C93), np.uint64(0xCA5A826395121157)
_W0, _W1 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBB67AE8584CAA73B)
_LO32, _32 = np.uint64(0xFFFFFFFF), np.uint64(32)
_FEW = 4  # this many tokens or fewer: one numpy generator each
_VECTOR_LIMIT = 1024  # fewer tokens than this: Philox on their counters only; more: numpy's C stream
# every u is in [2**-54, 1 - 2**-54], so no g exceeds this (used to prune exactly)
GUMBEL_MAX = -math.log(-math.log1p(-(2.0**-54)))


def philox_raw(seed: int, position: int, ids: np.ndarray | None, vocab: int = 0) -> np.ndarray:
    """The 64-bit Philox word of each token id at `position` (ids None: of 0..vocab-1): the same as
    numpy's Philox(key=[seed, 0], counter=[0, position, 0, 0]).random_raw(n)[ids]."""
    if ids is None:
        return _stream(seed, position, 0).random_raw(vocab)
    if len(ids) > _VECTOR_LIMIT:
        ids = np.asarray(ids, dtype=np.intp)
        return _stream(seed, position, 0).random_raw(int(ids.max()) + 1)[ids]
    ids = np.asarray(ids, dtype=np.uint64)
    if len(ids) <= _FEW:  # a generator per token: cheaper than ten vectorised rounds for one or two
        return np.array([_stream(seed, position, int(i) // 4).random_raw(4)[int(i) % 4] for i in ids], dtype=np.uint64)
    zero = np.zeros(len(ids), dtype=np.uint64)
    words = _philox4x64(
        (ids >> np.uint64(2)) + np.uint64(1),
        zero + np.uint64(position),
        zero,
        zero,
        np.uint64(seed % 2**64),
        np.uint64(0),
    )
    return np.stack(words)[(ids & np.uint64(3)).astype(np.intp), np.arange(len(ids))]


def _stream(seed: int, position: int, block: int) -> np.random.Philox:
    """numpy's Philox positioned so that its next four words are block `block` of `position`
    (numpy increments the counter before each block, hence counter word 0 = block)."""
    return np.random.Philox(
        key=np.array([seed % 2**64, 0], dtype=np.uint64), counter=np.array([block, position, 0, 0], dtype=np.uint64)
    )


def gumbel(seed: int, position: int, ids: np.ndarray | None, vocab: int = 0) -> np.ndarray:
    """Standard Gumbel noise g(seed, position, id) for each id (ids None: for 0..vocab-1), float64."""
    raw = philox_raw(seed, position, ids, vocab)
    raw >>= np.uint64(11)
    g = raw.astype(np.float64)
    g += 0.5
    g *= 2.0**-53  # u in (0, 1), 53 bits
    np.log(g, out=g)
    np.negative(g, out=g)
    np.log(g, out=g)
    np.negative(g, out=g)  # -log(-log u)
    return g


def _philox4x64(c0, c1, c2, c3, k0, k1):
    """Philox-4x64-10 (Salmon et al. 2011) over arrays of counters, as numpy's C implementation."""
    multipliers = np.array([[_M0], [_M1]], dtype=np.uint64)  # both products of a round in one pass
    with np.errstate(over="ignore"):
        for round_ in range(10):
            if round_:
                k0, k1 = k0 + _W0, k1 + _W1
            hi, lo = _mulhilo(multipliers, np.stack([c0, c2]))
            c0, c1, c2, c3 = hi[1] ^ c1 ^ k0, lo[1], hi[0] ^ c3 ^ k1, lo[0]
    return c0, c1, c2, c3


def _mulhilo(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The high and low 64 bits of a * b, from 32-bit halves."""
    a0, a1, b0, b1 = a & _LO32, a >> _32, b & _LO32, b >> _32
    p00, p01, p10, p11 = a0 * b0, a0 * b1, a1 * b0, a1 * b1
    carry = ((p00 >> _32) + (p01 & _LO32) + (p10 & _LO32)) >> _32
    return p11 + (p01 >> _32) + (p10 >> _32) + carry, a * b


# -- the sampler -------------------------------------------------------------------------------


@dataclass
class TokenLogprob:
    """The chosen token's log-probability under the model (log-softmax of the raw logits) and the top N."""

    token: int
    logprob: float
    top: list[tuple[int, float]]  # (token id, logprob), most likely first


class Sampler:
    """One request's sampling: params with a seed, and where the prompt ends (penalties tell them apart)."""

    def __init__(self, params: SamplingParams, prompt_len: int):
        if params.seed is None and params.sampled:
            params = params.with_seed(draw_seed())
        self.params = params
        self.prompt_len = prompt_len
        self.logprobs: list[TokenLogprob] = []  # one per committed token, when params.logprobs is set

    def independent(self) -> Sampler:
        """The same sampling with noise of its own (another seed): for an uncoupled draft."""
        if not self.params.sampled:
            return self  # nothing is drawn: there is no noise to make independent
        return Sampler(self.params.with_seed((self.params.seed ^ 0x5DEECE66D) % 2**64), self.prompt_len)

    def sample(
        self, logits: np.ndarray, prefix: Sequence[int], position: int, allowed: np.ndarray | None = None
    ) -> int:
        """The token at absolute `position` after `prefix` (all tokens before it, prompt included).

        allowed: bool [vocab], the tokens a constraint allows there (runtime/grammar.Masks.allowed);
        None: every token. The filters then see only the allowed tokens (top-p's mass is theirs)."""
        # Under a constraint, the same rule on the allowed tokens only: the filters over their z, then
        # argmax of z + g(s, t, i) with the unconstrained noise of each token id i.
        p = self.params
        ids = None if allowed is None else np.flatnonzero(allowed)
        if ids is not None and not len(ids):
            raise InputError("the constraint allows no token here")
        z = self.penalised(logits, prefix)
        if p.temperature == 0:
            return int(np.argmax(z)) if ids is None else int(ids[np.argmax(z[ids])])
        z /= p.temperature
        kept = survivors(z if ids is None else z[ids], p.top_k, p.top_p, p.min_p)
        if ids is not None:
            kept = ids if kept is None else ids[kept]
        return self._gumbel_max(z, kept, position)

    def penalised(self, logits: np.ndarray, prefix: Sequence[int]) -> np.ndarray:
        """The logits as float64 after the penalties, which read only the tokens before the position."""
        z = np.array(logits, dtype=np.float64)  # a copy: penalties and the temperature change it
        p = self.params
        if not p.penalised:
            return z
        prefix = np.asarray(prefix, dtype=np.int64)
        if p.repetition_penalty != 1:
            seen = np.unique(prefix)
            z[seen] = np.where(z[seen] > 0, z[seen] / p.repetition_penalty, z[seen] * p.repetition_penalty)
        if p.frequency_penalty or p.presence_penalty:
            ids, counts = np.unique(prefix[self.prompt_len :], return_counts=True)
            z[ids] -= p.frequency_penalty * counts + p.presence_penalty
        return z

    def _gumbel_max(self, z: np.ndarray, ids: np.ndarray | None, position: int) -> int:
        """ids: the survivors (None: every token)."""
        seed = self.params.seed
        scores = z if ids is None else z[ids]
        if len(scores) > _VECTOR_LIMIT:
            # a token more than (GUMBEL_MAX - the top token's noise) below the top can never win:
            # draw noise for the others only (exact; it pays at low temperatures)
            top = int(np.argmax(scores))
            bar = scores[top] + gumbel(seed, position, np.array([top if ids is None else ids[top]]))[0]
            keep = np.flatnonzero(scores >= bar - GUMBEL_MAX)
            if ids is None and len(keep) > len(z) // 2:  # most remain: the whole stream, no gathers
                return int(np.argmax(z + gumbel(seed, position, None, len(z))))
            ids, scores = (keep if ids is None else ids[keep]), scores[keep]
        elif ids is None:
            ids = np.arange(len(z))
        scores = scores + gumbel(seed, position, ids)
        return int(ids[np.argmax(scores)])

    def record(self, logits: np.ndarray, token: int) -> None:
        """A token was committed from these logits: keep its logprobs if the request asked for them."""
        if self.params.logprobs is not None:
            self.logprobs.append(self.logprob(logits, token))

    def logprob(self, logits: np.ndarray, token: int) -> TokenLogprob:
        """The chosen token's logprob and the top N (params.logprobs) under the model's own distribution."""
        z = np.asarray(logits, dtype=np.float64)
        top = z.max()
        logp = z - (top + math.log(np.exp(z - top).sum()))
        n = self.params.logprobs or 0
        best = _top_ids(logp, n) if n else np.empty(0, dtype=np.int64)
        return TokenLogprob(int(token), float(logp[token]), [(int(i), float(logp[i])) for i in best])


def masked_greedy(logits: np.ndarray, greedy_id: int, allowed: np.ndarray) -> int:
    """Greedy decoding under a constraint: the most likely allowed token (the first on ties, as ArgMax).

    The in-graph greedy id is that token whenever it is allowed, so the logits are read only when it is not."""
    if allowed[greedy_id]:
        return int(greedy_id)
    ids = np.flatnonzero(allowed)
    if not len(ids):
        raise InputError("the constraint allows no token here")
    return int(ids[np.argmax(logits[ids])])


def survivors(z: np.ndarray, top_k: int, top_p: float, min_p: float) -> np.ndarray | None:
    """Token ids left by top-k, then top-p over what top-k left, then min-p; at least the top token
    (None: no filter, every token).

    The same computation every time for the same z, so every strategy filters alike."""
    if not top_k and top_p >= 1 and not min_p:
        return None
    probs = np.exp(z - z.max())  # unnormalised; the top token's is exactly 1
    if top_k or top_p < 1:
        ranked = _ranked(probs, top_k, top_p)  # most likely first, ties by token id
        if top_k:
            ranked = ranked[:top_k]
        if top_p < 1:
            mass = np.cumsum(probs[ranked])
            total = mass[-1] if top_k else probs.sum()
            ranked = ranked[: int(np.searchsorted(mass, top_p * total)) + 1]
        ids = np.sort(ranked)
    else:
        ids = np.arange(len(z))
    if min_p:
        ids = ids[probs[ids] >= min_p]
    return ids


def _ranked(probs: np.ndarray, top_k: int, top_p: float) -> np.ndarray:
    """The ids that top-k and top-p can keep, most likely first: a threshold narrows the sort to
    the few likely tokens, lowered until they hold top_k tokens and top_p of the total mass."""
    total = probs.sum()
    need = top_p * total if top_p < 1 else 0.0
    for threshold in (1e-3, 1e-6, 1e-10):
        ids = np.flatnonzero(probs >= threshold)
        if len(ids) >= top_k and probs[ids].sum() >= need:
            break
    else:
        ids = np.flatnonzero(probs)
    return ids[np.lexsort((ids, -probs[ids]))]


def _top_ids(values: np.ndarray, n: int) -> np.ndarray:
    n = min(n, len(values))
    part = np.argpartition(-values, n - 1)[:n]
    return part[np.lexsort((part, -values[part]))]
