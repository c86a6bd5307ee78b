"""The exact releases this runtime is built against (tools/pins.txt is the source;
python/tests/test_packaging.py checks that the two agree, and that RUNTIME_VERSION is this
distribution's version in python/runtime_dist/pyproject.toml and the one kiln's extra pins)."""

EXECUTORCH_VERSION = "1.5.1"
TORCH_VERSION = "2.14.0"
# The version of the kiln-executorch-runtime distribution (its own number, not kiln's).
RUNTIME_VERSION = "0.1.0"
