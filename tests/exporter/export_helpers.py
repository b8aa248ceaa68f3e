"""Helpers for the exporter tests: the window-graph contract as the design page states it, a
Hugging Face reference for a window over a cached prefix, and a runner for the ONNX graph.

The reference uses the model's own forward with a DynamicCache and a 2-D attention mask (no
jacobi_rt code), so it checks the exporter instead of repeating it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# The contract (v1), copied from docs/design: name -> (onnx element type name, axes).
# Axes: a contract dim name (must be a dim_param) or a manifest field (must be that fixed size).
DYNAMIC = {"batch", "window", "past", "total"}


def contract_inputs(layers: int) -> list[tuple[str, str, tuple]]:
    kv = [
        (f"past_key_values.{i}.{kind}", "model", ("batch", "kv_heads", "past", "head_dim"))
        for i in range(layers)
        for kind in ("key", "value")
    ]
    return [
        ("input_ids", "INT64", ("batch", "window")),
        ("position_ids", "INT64", ("batch", "window")),
        ("attention_mask", "INT64", ("batch", "total")),
        ("window_mask", "BOOL", ("batch", "window", "window")),
        *kv,
    ]


def contract_outputs(layers: int) -> list[tuple[str, str, tuple]]:
    kv = [
        (f"present.{i}.{kind}", "model", ("batch", "kv_heads", "total", "head_dim"))
        for i in range(layers)
        for kind in ("key", "value")
    ]
    return [
        ("logits", "FLOAT", ("batch", "window", "vocab_size")),
        ("greedy_ids", "INT64", ("batch", "window")),
        *kv,
    ]


def assert_graph_contract(onnx_path: Path, arch, kv_type: str = "FLOAT") -> None:
    """The graph's inputs/outputs: exact names in order, element types, dim_param names, fixed sizes."""
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    fixed = {"kv_heads": arch.kv_heads, "head_dim": arch.head_dim, "vocab_size": arch.vocab_size}
    for values, expected in (
        (model.graph.input, contract_inputs(arch.num_layers)),
        (model.graph.output, contract_outputs(arch.num_layers)),
    ):
        assert [v.name for v in values] == [name for name, _, _ in expected]
        for value, (name, elem, axes) in zip(values, expected):
            ttype = value.type.tensor_type
            want = kv_type if elem == "model" else elem
            assert onnx.TensorProto.DataType.Name(ttype.elem_type) == want, f"{name}: element type"
            dims = list(ttype.shape.dim)
            assert len(dims) == len(axes), f"{name}: rank {len(dims)}, contract {axes}"
            for axis, dim in zip(axes, dims):
                if axis in DYNAMIC:
                    assert dim.WhichOneof("value") == "dim_param" and dim.dim_param == axis, (
                        f"{name}: axis {axis!r} is {dim}, not a dim_param named {axis!r}"
                    )
                else:
                    assert dim.WhichOneof("value") == "dim_value" and dim.dim_value == fixed[axis], (
                        f"{name}: axis {axis!r} should be fixed at {fixed[axis]}, is {dim}"
                    )


@dataclass
class Case:
    """One window over a prefix, in contract form (numpy), plus the HF reference outputs."""

    feeds: dict
    logits: np.ndarray  # [B, W, V] reference
    present: list  # [B, kv, P+W, D] reference, 2 per layer


def cache_kwarg(model) -> str:
    """transformers 5.x names the cache argument `cache` (`past_key_values` is deprecated); 4.x has only the latter."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def kv_of(cache) -> list:
    return [t.detach().clone() for layer in cache.layers for t in (layer.keys, layer.values)]


def hf_case(model, batch: int, window: int, past: int, seed: int, pad_row: bool = False) -> Case:
    """Random tokens; the HF model runs the prefix (building its cache), then the window over the cache.

    pad_row: row 1 is left-padded by 2 tokens (attention_mask 0, positions restart at 0 after them).
    """
    import torch
    from transformers import DynamicCache

    g = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (batch, past + window), generator=g)
    mask = torch.ones(batch, past + window, dtype=torch.long)
    if pad_row:
        assert batch > 1 and past > 2
        mask[1, :2] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache()
    cached = {cache_kwarg(model): cache, "use_cache": True}
    with torch.no_grad():
        if past:
            model(input_ids=ids[:, :past], attention_mask=mask[:, :past], position_ids=positions[:, :past], **cached)
            past_kv = kv_of(cache)
        else:
            past_kv = None
        out = model(input_ids=ids[:, past:], attention_mask=mask, position_ids=positions[:, past:], **cached)
    layers = len(cache.layers)
    if past_kv is None:
        present = kv_of(cache)
        past_kv = [torch.zeros(batch, t.shape[1], 0, t.shape[3]) for t in present]
    feeds = {
        "input_ids": ids[:, past:].numpy(),
        "position_ids": positions[:, past:].numpy(),
        "attention_mask": mask.numpy(),
        "window_mask": np.tril(np.ones((window, window), dtype=bool))[None].repeat(batch, 0),
    }
    for i in range(layers):
        feeds[f"past_key_values.{i}.key"] = past_kv[2 * i].numpy()
        feeds[f"past_key_values.{i}.value"] = past_kv[2 * i + 1].numpy()
    return Case(feeds, out.logits.float().numpy(), [t.numpy() for t in kv_of(cache)])


def run(session, feeds: dict) -> dict:
    """Run the graph; outputs by name."""
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds)))


def presents(outputs: dict) -> list:
    """present.{i}.key/value in layer order."""
    keys = sorted(
        (k for k in outputs if k.startswith("present.")), key=lambda k: (int(k.split(".")[1]), k.endswith("value"))
    )
    return [outputs[k] for k in keys]


def assert_greedy_equal(greedy: np.ndarray, reference_logits: np.ndarray, where: str = "") -> None:
    expected = reference_logits.argmax(-1)
    if not np.array_equal(greedy, expected):
        bad = np.argwhere(greedy != expected)
        top2 = np.sort(reference_logits, axis=-1)[..., -2:]
        gaps = [float(top2[tuple(i)][1] - top2[tuple(i)][0]) for i in bad]
        raise AssertionError(f"{where}greedy ids differ at {bad.tolist()} (reference top-2 gaps {gaps})")


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def listing(folder: Path) -> set:
    """Names in a folder (to prove an export wrote nothing)."""
    return {p.name for p in Path(folder).iterdir()}


def leftovers(folder: Path, name: str) -> list:
    """Staging or backup folders an export of `name` may leave beside it."""
    return sorted(p.name for p in Path(folder).iterdir() if p.name.startswith(f".{name}."))


def assert_generation_is_greedy(artifact: Path, hf_model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """The runtime's greedy equals transformers' greedy `generate`, and every strategy equals greedy;
    returns the greedy ids."""
    import torch

    from jacobi_rt.runtime import Generator

    generator = Generator.load(artifact, threads=1)
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = hf_model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            eos_token_id=generator.manifest.tokens.eos_ids,
            pad_token_id=0,
        )
    greedy = generator.generate(prompt, max_new_tokens=max_new_tokens, strategy="greedy").ids
    assert greedy == out[0, len(prompt) :].tolist(), "runtime greedy != transformers greedy"
    for strategy in ("jacobi", "lookahead", "auto"):
        assert generator.generate(prompt, max_new_tokens=max_new_tokens, strategy=strategy).ids == greedy, strategy
    return greedy
