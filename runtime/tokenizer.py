"""Text <-> ids with the artifact's `tokenizer.json` (the `tokenizers` library), chat templates
rendered with jinja2, and an incremental detokenizer for streaming."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ArtifactError, InputError, require
from .manifest import Manifest


class Tokenizer:
    def __init__(self, folder: str | Path, manifest: Manifest):
        tokenizers = require("tokenizers", "pip install tokenizers")
        info = manifest.tokenizer
        path = Path(folder) / (info.get("file") or "tokenizer.json")  # as manifest_checks names it
        try:
            self._tok = tokenizers.Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception on bad files
            raise ArtifactError(f"cannot read the tokenizer {path} ({exc}); re-export the artifact") from exc
        self.bos_token = info.get("bos_token")
        self.eos_token = info.get("eos_token")
        template = info.get("chat_template")
        self.chat_template = (Path(folder) / template).read_text() if template else None

    def json(self) -> str:
        """The tokenizer as tokenizer.json's text (for libraries that build their own view of the vocabulary)."""
        return self._tok.to_str()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)

    @property
    def takes_tools(self) -> bool:
        """The chat template reads a `tools` variable: it shows the model the functions it may call."""
        return bool(self.chat_template) and "tools" in _variables(self.chat_template)

    @property
    def tool_call_tags(self) -> tuple[str, str] | None:
        """How the template tells the model to write a call, when it is a format jacobi-rt reads: a JSON
        {"name", "arguments"} object between <tool_call> and </tool_call> (Qwen2.5's, Hermes')."""
        return TOOL_CALL_TAGS if self.takes_tools and TOOL_CALL_TAGS[0] in self.chat_template else None

    def render_chat(
        self, messages: list[dict], add_generation_prompt: bool = True, tools: list[dict] | None = None
    ) -> str:
        """The chat template applied to `messages` (and `tools`, OpenAI's function list, for a template that
        takes them), as Hugging Face's apply_chat_template renders it."""
        if not self.chat_template:
            raise InputError("this artifact has no chat template; pass a plain prompt instead of chat messages")
        if not isinstance(messages, (list, tuple)) or not messages:
            raise InputError('chat messages must be a non-empty list like [{"role": "user", "content": "Hi"}]')
        for m in messages:
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise InputError(f'each chat message needs "role" and "content" keys; got {m!r}')
        template = _compile(self.chat_template)
        extra = {"tools": tools} if tools else {}
        try:
            return template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token or "",
                **extra,
            )
        except InputError:
            raise
        except Exception as exc:  # jinja2's errors, or a TypeError from the template's own expressions
            raise InputError(
                f"the chat template failed on these messages ({type(exc).__name__}: {exc}); "
                "check the roles and contents this model's template expects"
            ) from exc


TOOL_CALL_TAGS = ("<tool_call>", "</tool_call>")


def _environment():
    require("jinja2", "pip install jinja2")
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise InputError(f"the chat template refused the messages: {message}")

    # The same environment settings Hugging Face's tokenizers use, so the rendered prompt is identical.
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, indent=None, **kw: json.dumps(x, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: __import__("datetime").datetime.now().strftime(fmt)
    return env


@functools.lru_cache(maxsize=16)
def _variables(source: str) -> frozenset[str]:
    """The variables a template reads from its caller (jinja2.meta), e.g. messages, tools."""
    import jinja2
    from jinja2 import meta

    try:
        return frozenset(meta.find_undeclared_variables(_environment().parse(source)))
    except jinja2.TemplateError as exc:
        raise ArtifactError(f"the artifact's chat template does not compile ({exc}); re-export the artifact") from exc


@functools.lru_cache(maxsize=16)
def _compile(source: str):
    import jinja2

    try:
        return _environment().from_string(source)
    except jinja2.TemplateError as exc:
        raise ArtifactError(f"the artifact's chat template does not compile ({exc}); re-export the artifact") from exc


@dataclass
class Detokenizer:
    """Turns ids into text pieces as they arrive; the pieces concatenate to the full decode.

    A byte-level BPE token may hold part of a UTF-8 character: decoding it alone gives U+FFFD,
    so text is held back until a later token completes the character. Decoding restarts from a
    recent offset, which keeps each step short and lets tokenizers that strip a leading space
    (SentencePiece) see their context.
    """

    tokenizer: Tokenizer
    ids: list[int] = field(default_factory=list)
    prefix: int = 0  # ids[prefix:read] decode to text already emitted (context for the next piece)
    read: int = 0

    def add(self, token: int) -> str:
        self.ids.append(token)
        before = self.tokenizer.decode(self.ids[self.prefix : self.read])
        after = self.tokenizer.decode(self.ids[self.prefix :])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return after[len(before) :]

    def flush(self) -> str:
        """Whatever is held back, less an incomplete character at the very end (the output stopped, by
        max_tokens say, inside one): its bytes would decode to U+FFFD, so they are dropped, as add() holds them."""
        before = self.tokenizer.decode(self.ids[self.prefix : self.read])
        after = self.tokenizer.decode(self.ids[self.prefix :])
        self.prefix = self.read = len(self.ids)
        return after[len(before) :].rstrip("\ufffd") if len(after) > len(before) else ""
