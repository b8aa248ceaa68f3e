"""jacobi_rt.runtime: run exported artifacts with Jacobi decoding, without PyTorch; the tokens are
those of decoding one token a pass (greedy, or sampled for a seed).

    from jacobi_rt.runtime import Generator
    gen = Generator.load("build/smollm2-135m")
    result = gen.generate("Write a haiku about autumn", max_new_tokens=64)
    print(result.text, result.stats.tokens_per_pass)

These names are the runtime's public API: the server (jacobi_rt.server) imports nothing else of it
(tests/test_import_graph.py checks that).
"""

from .batcher import Batcher
from .config import DEFAULTS, DecodingConfig
from .constraints import JSON_FORMAT, Constraint
from .errors import (
    ArtifactError,
    BackendError,
    ContextLimitError,
    InputError,
    JacobiError,
    MissingDependencyError,
    require,
)
from .generator import DEFAULT_SLOTS, GenerationResult, Generator, Stats, TextStream
from .manifest import MANIFEST_NAME, manifest_sha256
from .params import STRATEGIES, GenerationParams
from .sampling import MIN_TEMPERATURE, REPETITION_RANGE, SEED_RANGE, SamplingParams, TokenLogprob, draw_seed
from .tokenizer import TOOL_CALL_TAGS, Tokenizer

__all__ = [
    # loading and generating
    "Generator",
    "Batcher",
    "TextStream",
    "GenerationResult",
    "Stats",
    "DEFAULT_SLOTS",
    "MANIFEST_NAME",
    "manifest_sha256",
    # one request
    "GenerationParams",
    "STRATEGIES",
    "SamplingParams",
    "TokenLogprob",
    "MIN_TEMPERATURE",
    "REPETITION_RANGE",
    "SEED_RANGE",
    "draw_seed",
    "DecodingConfig",
    "DEFAULTS",
    # structured output and tools
    "Constraint",
    "JSON_FORMAT",
    "Tokenizer",
    "TOOL_CALL_TAGS",
    # errors
    "JacobiError",
    "ArtifactError",
    "BackendError",
    "ContextLimitError",
    "InputError",
    "MissingDependencyError",
    "require",
]
