"""callgate.engine.core: the sans-I/O protocol core. Never awaits, never imports an I/O
module (a test enforces it); time comes in as an argument."""
