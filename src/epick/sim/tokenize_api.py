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
