"""vLLM's /tokenize and /detokenize, as the sim server answers them: request body in, answer out."""

from __future__ import annotations

from typing import Any

from epick.sim import errors
from epick.sim.openai_api import chat_prompt, flag
from epick.sim.tokenizing import SimTokenizer


def tokenized(body: dict[str, Any], tokenizer: SimTokenizer, max_model_len: int) -> dict[str, Any]:
    """{prompt, add_special_tokens=true} or {messages, add_generation_prompt, continue_final_message,
    add_special_tokens=false, tools, chat_template_kwargs}, as vLLM; raises `APIError` (400)."""
    strings = flag(body, "return_token_strs", False)
    if "messages" in body:
        tokens = chat_prompt(body, tokenizer)
    elif "prompt" in body:
        prompt = body["prompt"]
        if not isinstance(prompt, str):
            raise errors.bad_request("'prompt' must be a string", "prompt")
        tokens = tokenizer.encode(prompt, add_special_tokens=flag(body, "add_special_tokens", True))
    else:
        raise errors.bad_request("either 'prompt' or 'messages' is required")
    return {
        "count": len(tokens),
        "max_model_len": max_model_len,
        "tokens": tokens,
        "token_strs": tokenizer.token_strings(tokens) if strings else None,
    }


def detokenized(body: dict[str, Any], tokenizer: SimTokenizer) -> dict[str, Any]:
    """{tokens} -> {prompt}, special tokens kept (vLLM decodes them); raises `APIError` (400)."""
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in tokens
    ):
        raise errors.bad_request("'tokens' must be a list of non-negative integers", "tokens")
    tokenizer.check_ids(tokens, "tokens")
    return {"prompt": tokenizer.decode(tokens, skip_special_tokens=False)}


# vLLM's render endpoints (`/v1/chat/completions/render`, `/v1/completions/render`): a request's prompt
# rendered and tokenized, nothing generated, in the shape llm-d-router's docs/communication.md records
# from vLLM (a chat answer is one object; a completions answer is a list, one object per prompt).


def _sampling_params(body: dict[str, Any], prompt_tokens: int, max_model_len: int) -> dict[str, Any]:
    def number(name: str, default: float) -> float:
        value = body.get(name)
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else default

    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    return {
        "presence_penalty": number("presence_penalty", 0.0),
        "frequency_penalty": number("frequency_penalty", 0.0),
        "repetition_penalty": number("repetition_penalty", 1.0),
        "temperature": number("temperature", 1.0),
        "top_p": number("top_p", 1.0),
        "top_k": int(number("top_k", 0)),
        "min_p": number("min_p", 0.0),
        "max_tokens": max_tokens if isinstance(max_tokens, int) else max(0, max_model_len - prompt_tokens),
        "stop": [],
        "stop_token_ids": [],
        "bad_words": [],
        "output_kind": 2,
        "skip_clone": True,
        "skip_reading_prefix_cache": False,
    }


def _render(
    body: dict[str, Any], tokens: list[int], request_id: str, features: object, max_model_len: int
) -> dict[str, Any]:
    return {
        "request_id": request_id,
        "token_ids": tokens,
        "features": features,
        "sampling_params": _sampling_params(body, len(tokens), max_model_len),
        "model": body.get("model"),
        "stream": flag(body, "stream", False),
        "stream_options": body.get("stream_options"),
        "cache_salt": body.get("cache_salt"),
        "priority": body.get("priority", 0),
        "kv_transfer_params": None,
    }


def rendered_chat(
    body: dict[str, Any], tokenizer: SimTokenizer, max_model_len: int, request_id: str
) -> dict[str, Any]:
    """POST /v1/chat/completions/render: the chat prompt's token ids (text only: no multimodal
    features, their lists empty); raises `APIError` (400)."""
    tokens = chat_prompt(body, tokenizer)
    no_media: dict[str, dict[str, list[object]]] = {
        "mm_hashes": {"image": []},
        "mm_placeholders": {"image": []},
        "kwargs_data": {"image": []},
    }
    return _render(body, tokens, f"chatcmpl-{request_id}", no_media, max_model_len)


def rendered_completions(
    body: dict[str, Any], tokenizer: SimTokenizer, max_model_len: int, request_id: str
) -> list[dict[str, Any]]:
    """POST /v1/completions/render: one answer per prompt (a string, token ids, or a list of
    strings); raises `APIError` (400)."""
    prompt = body.get("prompt")
    special = flag(body, "add_special_tokens", True)
    if isinstance(prompt, str):
        prompts = [tokenizer.encode(prompt, add_special_tokens=special)]
    elif (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        prompts = [tokenizer.prompt_ids(prompt)]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        prompts = [tokenizer.encode(p, add_special_tokens=special) for p in prompt]
    else:
        raise errors.bad_request(
            "'prompt' must be a string, a list of strings or a list of token ids", "prompt"
        )
    return [
        _render(
            body,
            tokens,
            f"cmpl-{request_id}-{i}" if len(prompts) > 1 else f"cmpl-{request_id}",
            None,
            max_model_len,
        )
        for i, tokens in enumerate(prompts)
    ]
