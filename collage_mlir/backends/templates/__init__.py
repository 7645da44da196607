"""Kernel templates, one per file, compiled by the kernel backends (``collage_mlir.backends.kernel``). A
template's text is part of each compiled kernel's cache key, so editing one recompiles its kernels."""
