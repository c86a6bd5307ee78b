"""The exact releases this runtime is built against (tools/pins.txt is the source; a test checks
that the two agree)."""

EXECUTORCH_VERSION = "1.5.1"
TORCH_VERSION = "2.14.0"
KILN_VERSION = "0.1.0"
