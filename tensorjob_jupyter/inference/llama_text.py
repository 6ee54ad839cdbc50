"""A llama.cpp model's text: its vocabulary (text to tokens, tokens to bytes) and its chat template.

``ModelText`` turns a request into the prompt's tokens -- through the model's chat template when the request
asks for it (ChatML when the model names none), with the user's text tokenized apart from the template's
markup so that a prompt cannot forge a turn -- and a sampled token back into its bytes, with both lookups
cached. Apart from the engine because it reads the model alone: no context, slot or decode is involved.

Design: docs/internals/inference.md#the-engines-rooms
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

from tensorjob_jupyter.inference.base import GenerateRequest, ModelError

if TYPE_CHECKING:  # llama-cpp-python is imported when an engine is made (library.llama_cpp_library)
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter
    from llama_cpp.llama_types import ChatCompletionRequestMessage

#: The chat template of a model that names none.
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
          " + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\n' }}{% endif %}")


class ModelText:
    """The text side of one loaded model (``model``: its ``LlamaModel``; ``lc``: llama-cpp-python), for prompts
    that leave room for a reply in ``n_ctx`` tokens."""

    def __init__(self, lc: Any, model: Any, n_ctx: int):
        self._lc = lc
        self._model = model
        self._vocab = model.vocab
        self.n_ctx = n_ctx
        self._pieces: dict[int, bytes] = {}
        self._piece_buf = ctypes.create_string_buffer(256)
        self._eog_cache: dict[int, bool] = {}
        self.bos: int = model.token_bos()
        self._chat_template = model.metadata().get("tokenizer.chat_template")
        self._chat_formatter: Jinja2ChatFormatter | None = None

    def tokenize(self, text: str, *, special: bool = False, add_bos: bool = True) -> list[int]:
        return self._model.tokenize(text.encode("utf-8"), add_bos, special)

    def piece(self, token: int) -> bytes:
        """The raw bytes of one token (may be part of a character)."""
        data = self._pieces.get(token)
        if data is None:
            buf = self._piece_buf
            n = self._lc.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = self._lc.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
            data = buf.raw[:n]
            self._pieces[token] = data
        return data

    def is_eog(self, token: int) -> bool:
        """Whether ``token`` ends a generation (an end-of-turn or end-of-text token)."""
        eog = self._eog_cache.get(token)
        if eog is None:
            eog = self._eog_cache[token] = bool(self._lc.llama_vocab_is_eog(self._vocab, token))
        return eog

    @property
    def has_chat_template(self) -> bool:
        """Whether the model names a chat template (instruct models do): ``chat=None`` then uses it."""
        return bool(self._chat_template)

    def chat_prompt(self, prompt: str, system: str | None = None) -> str:
        """``prompt`` as one user turn in the model's chat template (ChatML if it has none),
        after a system turn when ``system`` is given."""
        if self._chat_formatter is None:
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter

            template = self._chat_template or CHATML
            eos = self._model.token_eos()
            self._chat_formatter = Jinja2ChatFormatter(
                template=template, eos_token=self._model.token_get_text(eos) if eos >= 0 else "",
                bos_token=self._model.token_get_text(self.bos) if self.bos >= 0 else "")
        messages: list[ChatCompletionRequestMessage] = []
        if system is not None:
            messages.append({"role": "system", "content": system})
        messages.append({"role": "user", "content": prompt})
        return self._chat_formatter(messages=messages).prompt

    def chat_tokens(self, prompt: str, system: str | None = None) -> list[int]:
        """The chat-formatted prompt; the template's markup may hold control tokens, the text may not.

        The template is rendered around placeholders; its parts are tokenized
        with special tokens recognised and the texts (the user's prompt, the
        system turn) without, so a prompt containing, say, ``<|im_end|>``
        cannot forge a turn. (A template that repeats or rewrites the texts
        is rendered whole instead.)
        """
        marker = "\ue000tensorjob-content\ue000"
        system_marker = "\ue000tensorjob-system\ue000"
        rendered = self.chat_prompt(marker, system_marker if system is not None else None)
        texts = [(marker, prompt)]
        if system is not None:
            texts.insert(0, (system_marker, system))
        if any(rendered.count(m) != 1 for m, _ in texts) or (
                system is not None and rendered.index(system_marker) > rendered.index(marker)):
            return self.tokenize(self.chat_prompt(prompt, system), special=True, add_bos=False)
        tokens: list[int] = []
        rest = rendered
        for m, text in texts:
            before, rest = rest.split(m)
            tokens += self.tokenize(before, special=True, add_bos=False)
            tokens += self.tokenize(text, special=False, add_bos=False)
        return tokens + self.tokenize(rest, special=True, add_bos=False)

    def uses_chat(self, request: GenerateRequest) -> bool:
        """Whether ``request`` is sent through the chat template (``chat=None``: when the model has one)."""
        return self.has_chat_template if request.chat is None else bool(request.chat)

    def prompt_tokens(self, request: GenerateRequest) -> list[int]:
        """The request's prompt as the model reads it; ``ModelError`` if it leaves no room for a reply."""
        if self.uses_chat(request):
            tokens = self.chat_tokens(request.prompt, request.system)
        elif request.system is not None:
            tokens = self.tokenize(f"{request.system}\n\n{request.prompt}")
        else:
            tokens = self.tokenize(request.prompt)
        if not tokens:
            if self.bos < 0:
                raise ModelError("the prompt is empty and the model has no BOS token to start from")
            tokens = [self.bos]
        if len(tokens) >= self.n_ctx:
            raise ModelError(f"the prompt is {len(tokens)} tokens long; the context window holds "
                             f"{self.n_ctx} (n_ctx), including the reply")
        return tokens


__all__ = ["CHATML", "ModelText"]
