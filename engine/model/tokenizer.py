"""The model's tokenizer and chat template, from the same file or folder as its weights.

transformers does the conversion (GGUF vocab -> fast tokenizer) and renders the
chat template; this wrapper only fixes the small surface the engine uses and
never lets transformers reach the network.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from engine.errors import InvalidRequestError, UnsupportedModelError

# End-of-turn markers that chat templates emit; a model whose template uses one
# must stop on it even when its tokenizer's `eos_token` is a different token.
_END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>")


class ChatTemplateMissingError(InvalidRequestError):
    """Chat was asked of a model whose tokenizer carries no chat template."""

    code = "chat_template_missing"


class Tokenizer:
    """Encode, decode and chat-format text for one model. `hf` is the transformers object."""

    def __init__(self, hf: PreTrainedTokenizerBase, extra_eos_ids: Sequence[int] = ()) -> None:
        self.hf = hf
        eos: set[int] = set(extra_eos_ids)
        if hf.eos_token_id is not None:
            eos.add(int(hf.eos_token_id))
        template = hf.chat_template if isinstance(hf.chat_template, str) else ""
        vocab = hf.get_vocab()
        eos.update(vocab[t] for t in _END_OF_TURN_TOKENS if t in template and t in vocab)
        self._eos_token_ids = frozenset(eos)
        self._all_special_ids = frozenset(int(i) for i in hf.all_special_ids)
        self._vocab_size = len(hf)
        # transformers' encode wraps the Rust tokenizer in ~30 us of Python per call;
        # the gateway tokenizes every request on its event loop, so call Rust directly.
        self._fast: Any = hf.backend_tokenizer if getattr(hf, "is_fast", False) else None
        # The detokenizer decodes twice per generated token; skip transformers' wrapper
        # too, but only where that wrapper is known to return the Rust text unchanged.
        self._fast_decode: Any = self._fast if _decode_is_plain(hf) else None

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Every token id that ends generation."""
        return self._eos_token_ids

    @property
    def bos_token_id(self) -> int | None:
        """The beginning-of-sequence id, if the tokenizer has one."""
        bos = self.hf.bos_token_id
        return None if bos is None else int(bos)

    @property
    def vocab_size(self) -> int:
        """Number of token ids, added tokens included."""
        return self._vocab_size

    @property
    def all_special_ids(self) -> frozenset[int]:
        """Ids of the special tokens (bos, eos, pad, unk and additional ones)."""
        return self._all_special_ids

    @property
    def has_chat_template(self) -> bool:
        """Whether `apply_chat_template` can work."""
        return bool(self.hf.chat_template)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Text -> token ids; special tokens are added the way the model's tokenizer says."""
        if self._fast is not None:
            ids: list[int] = self._fast.encode(text, add_special_tokens=add_special_tokens).ids
            return ids
        return list(self.hf.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Token ids -> text."""
        ids = ids if isinstance(ids, list) else list(ids)
        if self._fast_decode is not None:
            text: str = self._fast_decode.decode(ids, skip_special_tokens=skip_special_tokens)
            return text
        return str(self.hf.decode(ids, skip_special_tokens=skip_special_tokens))

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        """Token ids -> their vocabulary strings (byte-level form, not decoded text)."""
        return list(self.hf.convert_ids_to_tokens(list(ids)))

    @property
    def chat_template(self) -> str | None:
        """The chat template's text (None without one); tool-call formats are read off it."""
        template = self.hf.chat_template
        return template if isinstance(template, str) else None

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """Renders a conversation with the model's own template, as prompt text.

        `tools` (OpenAI function definitions) reach templates that render them.
        """
        if not self.has_chat_template:
            raise ChatTemplateMissingError(
                "this model has no chat template; use the completions API", param="messages"
            )
        functions: list[dict[Any, Any] | Callable[..., Any]] | None = (
            None if tools is None else list(tools)
        )
        rendered: Any = self.hf.apply_chat_template(
            messages, tools=functions, tokenize=False, add_generation_prompt=add_generation_prompt
        )
        return str(rendered)


def _decode_is_plain(hf: PreTrainedTokenizerBase) -> bool:
    """Whether `hf.decode(ids)` is exactly the Rust tokenizer's decode of `ids`.

    transformers' fast `decode` converts the ids, calls Rust, then optionally applies
    `clean_up_tokenization_spaces`. A subclass may also override either method to
    post-process (some model tokenizers do). Anything but the plain path keeps it.
    """
    cls = type(hf)
    return (
        isinstance(hf, PreTrainedTokenizerFast)
        and cls.decode is PreTrainedTokenizerBase.decode
        and cls._decode is PreTrainedTokenizerFast._decode
        and not hf.clean_up_tokenization_spaces
    )


def load_gguf_tokenizer(path: str | Path) -> Tokenizer:
    """The tokenizer and chat template embedded in a GGUF file (converted by transformers)."""
    path = Path(path)
    try:
        hf = AutoTokenizer.from_pretrained(
            str(path.parent), gguf_file=path.name, local_files_only=True
        )
    except (OSError, ValueError, KeyError) as exc:
        raise UnsupportedModelError(f"cannot build a tokenizer from {path}: {exc}") from exc
    return Tokenizer(hf)


def load_hf_tokenizer(folder: str | Path) -> Tokenizer:
    """The tokenizer of a Hugging Face folder; generation_config.json may add eos ids."""
    folder = Path(folder)
    try:
        hf = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise UnsupportedModelError(f"cannot load the tokenizer in {folder}: {exc}") from exc
    return Tokenizer(hf, _generation_eos_ids(folder))


def _generation_eos_ids(folder: Path) -> list[int]:
    """`eos_token_id` of generation_config.json (an int or a list), if present."""
    path = folder / "generation_config.json"
    if not path.exists():
        return []
    value = json.loads(path.read_text()).get("eos_token_id")
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


def load_tokenizer(path: str | Path) -> Tokenizer:
    """The tokenizer of the model at `path`: a Hugging Face folder, else a GGUF file."""
    path = Path(path)
    if path.is_dir():
        return load_hf_tokenizer(path)
    return load_gguf_tokenizer(path)
