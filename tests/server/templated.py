"""An artifact copy with another chat template, for the tests of what templates render."""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

from jacobi_rt.runtime.file_digest import file_records


def with_template(source: Path, folder: Path, template: str) -> Path:
    """`source` copied to `folder` with `template` as its chat template, jacobi.json's records updated."""
    shutil.copytree(source, folder, dirs_exist_ok=True)
    (folder / "chat_template.jinja").write_text(template)
    manifest = json.loads((folder / "jacobi.json").read_text())
    manifest["tokenizer"]["chat_template"] = "chat_template.jinja"
    files, samples = file_records(folder)
    manifest["files"]["chat_template.jinja"] = files["chat_template.jinja"]
    if "samples" in manifest:
        manifest["samples"]["chat_template.jinja"] = samples["chat_template.jinja"]
    (folder / "jacobi.json").write_text(json.dumps(manifest))
    return folder


@contextlib.contextmanager
def template_server(source: Path, folder: Path, template: str) -> Iterator[tuple]:
    """(server, generator): `source` with `template`, served on the in-place graph; the copy removed after."""
    from jacobi_rt.runtime import Generator
    from jacobi_rt.server.run import BackgroundServer
    from jacobi_rt.server.settings import ServerSettings

    gen = Generator.load(with_template(source, folder, template), graph="inplace", threads=1)
    with BackgroundServer(gen, ServerSettings(model_id=source.name)) as server:
        yield server, gen
    shutil.rmtree(folder, ignore_errors=True)
