"""`ByteTokenizer`: UTF-8 bytes as token ids, for tests that count or template text
exactly without a real tokenizer."""

from __future__ import annotations

from typing import Any

EOS = 256


class ByteTokenizer:
    """UTF-8 bytes as token ids; 256 is EOS."""

    eos_token_ids = (EOS,)
    vocab_size = 260

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Bytes of `text`."""
        return list(text.encode())

    def decode(self, ids: list[int]) -> str:
        """Text of the byte ids (others dropped)."""
        return bytes(i for i in ids if i < 256).decode(errors="replace")

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """A fixed, simple template (it ignores tools, as SmolLM2's does)."""
        text = "".join(f"<{m['role']}>{m['content']}\n" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")
