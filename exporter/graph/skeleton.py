"""The model the export traces: built from its config, its parameters holding no data until asked.

Tracing reads shapes, never weight values, so the skeleton's parameters are placeholders:
`torch.empty` memory that no one writes, which the kernel backs with no page (a 30 GB model
costs nothing resident). Its buffers (rotary tables) are computed as usual. Values come from a
`Read` (parameter name -> array in the export dtype) only where they are needed: into the graph
as it is written (lazy_weights.py), into the PyTorch modules a check runs (`filled`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import numpy as np
import torch

Read = Callable[[str], np.ndarray]


def build(config, dtype: torch.dtype):
    """A causal LM of `config` with placeholder parameters (shared ones shared), eager attention."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=dtype)
    model.tie_weights()  # init_empty_weights re-creates each parameter, which unties the embedding and the head
    placeholders: dict[int, torch.nn.Parameter] = {}
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is not None:
                if id(param) not in placeholders:
                    placeholders[id(param)] = torch.nn.Parameter(
                        torch.empty(param.shape, dtype=dtype), requires_grad=False
                    )
                module._parameters[name] = placeholders[id(param)]
    return model.eval()


def parameter_names(model) -> dict[str, list[str]]:
    """First name of each distinct parameter -> every name it goes by (tied weights have two)."""
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    return {group[0]: group for group in names.values()}


@contextlib.contextmanager
def filled(model, read: Read, names: list[str] | None = None, prefix: str = "") -> Iterator[None]:
    """Within the block, the parameters named in `names` (default: all) whose names start with
    `prefix` hold their real values; placeholders again on exit, so the memory is given back."""
    params = dict(model.named_parameters())  # one name per distinct parameter
    chosen = {name: p for name, p in params.items() if name.startswith(prefix) and (names is None or name in names)}
    saved = {name: p.data for name, p in chosen.items()}
    try:
        for name, param in chosen.items():
            param.data = torch.from_numpy(np.array(read(name)))
        yield
    finally:
        for name, param in chosen.items():
            param.data = saved[name]


def state_dict_reader(model) -> Read:
    """A Read over a model loaded whole (the in-memory path, and the reference the streamed one must equal)."""
    state = dict(model.named_parameters(remove_duplicate=False))

    def read(name: str) -> np.ndarray:
        return state[name].detach().numpy()

    return read
