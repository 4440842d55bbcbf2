"""callgate.adapters: one module per API family, pure translators between wire shapes and
engine values. No HTTP here."""
