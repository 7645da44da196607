"""Region executors. An executor module exposes ``load(path: Path) -> Callable`` returning a callable
``run(inputs: list[np.ndarray], outputs: list[np.ndarray]) -> None`` that reads the (zero-copy, mapped)
input arrays and writes each result into the matching pre-allocated output array."""
