"""The text of a TRL completion, shared by the trainers and every reward function."""

from __future__ import annotations


def completion_text(completion) -> str:
    """A TRL completion is a string, or for chat prompts a list of messages; return its text.

    Message contents are joined with newlines; a content given as a list of blocks contributes its "text"
    blocks. Anything else is a ValueError naming the type.
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        parts = []
        for msg in completion:
            content = msg.get("content") if isinstance(msg, dict) else msg
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):  # content blocks
                parts.extend(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
            else:
                raise ValueError(f"a chat completion's messages need text content, got {msg!r:.80}")
        return "\n".join(parts)
    raise ValueError(f"cannot read the text of a completion of type {type(completion).__name__}")
