"""Tokenizer.render_chat: whatever goes wrong inside a chat template is the caller's InputError."""

from __future__ import annotations

import pytest

from jacobi_rt.runtime import InputError
from jacobi_rt.runtime.manifest import load_manifest
from jacobi_rt.runtime.tokenizer import Tokenizer

HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture
def tokenizer(artifact):
    folder = artifact("llama")
    return Tokenizer(folder, load_manifest(folder, verify=False))


@pytest.mark.parametrize(
    "template, shown",
    [
        ("{{ messages[0]['role'] + 1 }}", "TypeError"),  # the template's own expression fails
        ("{{ messages.append(1) }}", "SecurityError"),  # the sandbox refuses
        ("{% for m in messages %}{{ m['content'] | int | length }}{% endfor %}", "TypeError"),
        ("{{ raise_exception('Conversation roles must alternate') }}", "roles must alternate"),
    ],
)
def test_an_error_inside_the_template_is_an_input_error(tokenizer, template, shown):
    tokenizer.chat_template = template
    with pytest.raises(InputError, match="chat template") as caught:
        tokenizer.render_chat(HI)
    assert shown in str(caught.value)


def test_a_template_that_does_not_compile_is_the_artifacts_fault(tokenizer):
    from jacobi_rt.runtime import ArtifactError

    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] | no_such_filter }}{% endfor %}"
    with pytest.raises(ArtifactError, match="does not compile"):
        tokenizer.render_chat(HI)


def test_a_working_template_renders(tokenizer):
    assert tokenizer.render_chat(HI).endswith("<|im_start|>assistant\n")
