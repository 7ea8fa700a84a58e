"""The model's own tokenizer from files in the repository (tests/data/tokenizer, a 4,096-id byte-level
BPE with a ChatML template), encoding as vLLM does; and chat templates rendered as transformers does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from epick.tokenization import (
    ChatTemplate,
    ChatTemplateError,
    Tokenizer,
    TokenizerNotFoundError,
    load,
    locate,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "tokenizer"
IM_START, IM_END = 1, 2  # the template's special tokens, as trained


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return load(str(DATA))


def test_found_by_directory_file_or_search_path(tmp_path: Path) -> None:
    assert locate(str(DATA)) == DATA / "tokenizer.json"
    assert locate(str(DATA / "tokenizer.json")) == DATA / "tokenizer.json"
    assert locate("tokenizer", search=[DATA.parent]) == DATA / "tokenizer.json"
    with pytest.raises(TokenizerNotFoundError, match="nothing is downloaded") as e:
        locate("no-org/no-model", search=[tmp_path])
    assert str(tmp_path / "no-org/no-model/tokenizer.json") in str(e.value)


def test_encode_decode_round_trip(tok: Tokenizer) -> None:
    text = "How does the prefix cache route requests? Über-fast, 日本語 too."
    ids = tok.encode(text)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text
    assert tok.token_strings(tok.encode("Hello"))[0] == "H"


def test_chat_is_rendered_with_the_template_and_no_added_specials(tok: Tokenizer) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = tok.render_chat(messages)
    assert (
        text
        == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tok.encode_chat(messages)
    assert ids == tok.encode(text, add_special_tokens=False)
    assert ids[0] == IM_START and ids.count(IM_END) == 2
    # No generation prompt: the text ends after the last turn.
    assert tok.render_chat(messages, add_generation_prompt=False).endswith("Hi<|im_end|>\n")


def test_content_parts_in_a_string_template_are_joined_with_newlines(tok: Tokenizer) -> None:
    parts = [
        {"type": "text", "text": "a"},
        {"type": "image_url", "image_url": {"url": "x"}},
        {"type": "text", "text": "b"},
    ]
    assert "user\na\nb<|im_end|>" in tok.render_chat([{"role": "user", "content": parts}])
    assert tok.chat_template.content_format == "string"


def test_continue_final_message_ends_at_its_text(tok: Tokenizer) -> None:
    messages = [{"role": "user", "content": "Count"}, {"role": "assistant", "content": "1, 2,"}]
    text = tok.render_chat(messages, add_generation_prompt=False, continue_final_message=True)
    assert text.endswith("<|im_start|>assistant\n1, 2,")
    with pytest.raises(ChatTemplateError, match="cannot both"):
        tok.render_chat(messages, add_generation_prompt=True, continue_final_message=True)


def test_openai_format_template_gets_parts_and_transformers_helpers() -> None:
    source = (
        "{% for message in messages %}{% for part in message['content'] %}"
        "[{{ message['role'] }}:{{ part['text'] }}]{% endfor %}{% endfor %}"
        "{% if tools %}{{ tools | tojson }}{% endif %}{{ bos_token }}"
    )
    template = ChatTemplate(source)
    assert template.content_format == "openai"
    text = template.render(
        [{"role": "user", "content": "é"}], tools=[{"name": "f"}], special_tokens={"bos_token": "<s>"}
    )
    assert text == '[user:é][{"name": "f"}]<s>'


def test_developer_becomes_system_for_a_template_without_it(tok: Tokenizer) -> None:
    messages = [{"role": "developer", "content": "Rules."}, {"role": "user", "content": "Hi", "name": None}]
    assert tok.render_chat(messages).startswith("<|im_start|>system\nRules.<|im_end|>")


def test_template_errors_are_chat_template_errors() -> None:
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% for %}")
    failing = ChatTemplate("{{ raise_exception('roles must alternate') }}")
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        failing.render([{"role": "user", "content": "x"}])
    # The sandbox refuses to reach into Python.
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ messages.__class__.__mro__ }}{{ ''.__class__.__subclasses__() }}").render(
            [{"role": "user", "content": "x"}]
        )


def test_named_templates_and_added_token_dicts(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_bytes((DATA / "tokenizer.json").read_bytes())
    config = {
        "bos_token": {"__type": "AddedToken", "content": "<|endoftext|>"},
        "chat_template": [
            {"name": "tool_use", "template": "T"},
            {"name": "default", "template": "D{{ bos_token }}"},
        ],
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tok = Tokenizer.from_file(tmp_path / "tokenizer.json")
    assert tok.render_chat([{"role": "user", "content": "x"}]) == "D<|endoftext|>"


def test_bad_files_are_named(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a tokenizers file"):
        Tokenizer.from_file(tmp_path / "tokenizer.json")


def test_a_model_name_is_found_in_the_local_hugging_face_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The hub cache layout: models--<org>--<name>/snapshots/<revision>/..., refs/main naming the revision.
    repo = tmp_path / "models--acme--tiny-model"
    snapshot = repo / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "tokenizer.json").write_bytes((DATA / "tokenizer.json").read_bytes())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    assert locate("acme/tiny-model") == snapshot / "tokenizer.json"
