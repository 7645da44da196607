"""collage-mlir: measure which backend should run each region of a model, and build one program mixing them."""

from collage_runtime.telemetry import disable_engine_telemetry

__version__ = "0.1.0"

# Before any backend imports its engine: no collage command talks to the network.
disable_engine_telemetry()
