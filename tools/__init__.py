"""The maintainers' tooling for the course, kept out of the installed `helpers` package.

Not installed (pyproject.toml packages only `helpers*`): run it from the repository root, where `tools`
is importable, e.g. `python -m tools.capture.capture plan`. It imports `helpers` as any user does, and
nothing in `helpers` imports it.

`capture/`  the reference capture on a briefly lent GPU, its smoke pass, the GPU performance goals and
            the GPU check of the Triton FlashAttention
"""
