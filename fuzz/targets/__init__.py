"""One atheris target per module. Each states its invariant on its first line and exposes
``check(data: bytes) -> None``, importable without atheris (the corpus replay test uses it);
``python -m fuzz.targets.<name> [libFuzzer flags]`` fuzzes it."""
