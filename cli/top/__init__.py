"""The top-level `pagedkv` package. Its rooms are mapped in pyproject.toml (`pagedkv.spec` is spec/,
`pagedkv.cli` is cli/, ...); this folder holds only what belongs to the name itself: the version and
`python -m pagedkv`. Nothing is imported eagerly, so importing a room costs no more than before."""


def __getattr__(name):
    if name == "__version__":
        from importlib.metadata import version

        return version("pagedkv")
    raise AttributeError(f"module 'pagedkv' has no attribute {name!r}")
