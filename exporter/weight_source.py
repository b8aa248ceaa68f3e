"""TEMPORARY lead shim of exporter/weight_source.py (helper i-sources writes the real one)."""
from __future__ import annotations
import json
from pathlib import Path
from jacobi_rt.runtime.errors import ModelSourceError


class SafetensorsSource:
    def __init__(self, folder: Path, model):
        from safetensors import safe_open
        self.files = {}
        index = folder / "model.safetensors.index.json"
        if index.is_file():
            mapping = json.loads(index.read_text())["weight_map"]
        else:
            mapping = {}
            for f in sorted(folder.glob("*.safetensors")):
                with safe_open(str(f), "pt") as h:
                    mapping.update({k: f.name for k in h.keys()})
        self.mapping = mapping
        self.keys_of = {}
        groups = {}
        for name, p in model.named_parameters(remove_duplicate=False):
            groups.setdefault(id(p), []).append(name)
        for names in groups.values():
            found = next((n for n in names if n in mapping), None)
            if found is None:
                raise ModelSourceError(f"{folder}: no tensor {names[0]} in the safetensors files")
            for n in names:
                self.keys_of[n] = found
        self._open = {}

    def read(self, key, dtype):
        from safetensors import safe_open
        key = self.keys_of[key]
        f = self.mapping[key]
        with safe_open(str(self.folder / f), "pt") as h:
            tensor = h.get_tensor(key)
            return tensor.to(dtype) if tensor.dtype != dtype else tensor.clone()


def open_source(source, model):
    folder = Path(source.folder)
    if source.gguf_file or not any(folder.glob("*.safetensors")):
        raise ModelSourceError(f"{source.name}: streaming needs safetensors")
    s = SafetensorsSource(folder, model)
    s.folder = folder
    return s
