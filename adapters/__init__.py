"""callgate.adapters: one module per API family, pure translators between wire shapes and
engine values. No HTTP here."""

__all__ = [
    "anthropic",
    "gemini",
    "gemini_interactions",
    "openai_chat",
    "openai_responses",
    "render",
]
