"""collage-mlir: measure which backend should run each region of a model, and build one program mixing them."""

__version__ = "0.1.0"
