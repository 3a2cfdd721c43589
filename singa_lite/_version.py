"""The version, written once: pyproject.toml reads it (scikit-build-core's regex provider), singa_lite exports it, and
checkpoints record it."""
__version__ = "0.1.0"
