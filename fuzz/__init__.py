"""callgate's fuzzing campaign: atheris targets, SSE stream mutators and the runner.

Nothing here is installed or imported by callgate itself; the normal test suite imports
the targets' ``check`` functions to replay the corpus (see ``fuzz/README.md``).
"""
