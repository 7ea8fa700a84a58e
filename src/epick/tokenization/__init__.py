"""Tokenization with a model's own tokenizer files and chat template, as vLLM tokenizes (pure: no I/O
beyond reading the files once)."""

from epick.tokenization.chat import ChatTemplate, ChatTemplateError, compile_template
from epick.tokenization.tokenizer import Tokenizer, TokenizerNotFoundError, load, locate

__all__ = [
    "ChatTemplate",
    "ChatTemplateError",
    "Tokenizer",
    "TokenizerNotFoundError",
    "compile_template",
    "load",
    "locate",
]
