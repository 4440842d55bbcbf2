"""callgate.engine: the provider-neutral tool-calling engine."""
