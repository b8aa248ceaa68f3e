"""Generator.start(), the runtime API the server is built on: pieces, then the result; close() stops early."""

from __future__ import annotations

import pytest

from jacobi_rt.runtime import InputError


def test_pieces_then_the_result(gen):
    stream = gen.start("The quick", max_new_tokens=12, strategy="lookahead")
    expected = gen.generate("The quick", 12, strategy="lookahead")
    assert stream.prompt_tokens == expected.stats.prompt_tokens and stream.result is None
    assert "".join(stream) == expected.text
    assert stream.result.ids == expected.ids and stream.result.stats.new_tokens == 12


def test_close_stops_early_and_the_generator_stays_usable(gen):
    stream = gen.start("The quick", max_new_tokens=200, strategy="greedy")
    next(stream)
    stream.close()
    assert stream.result is None and list(stream) == []
    assert len(gen.generate("The quick", 3).ids) == 3


def test_bad_requests_fail_at_start(gen):
    with pytest.raises(InputError, match="empty"):
        gen.start("")
    with pytest.raises(InputError, match="window"):
        gen.start("hi", window=0)
