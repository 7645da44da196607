"""``load``: an artifact, a directory or one packed ``.collage`` file, as the program that runs it: a
``Program`` (one static shape, ``manifest.json``) or a ``ShapedProgram`` (shape buckets, ``shapes.json``).
One bucket's directory loads as a ``Program`` that reads its artifact's weight store."""

from __future__ import annotations

import zipfile
from pathlib import Path

from .package import is_package
from .program import Program
from .shaped import ShapedProgram
from .shapes import SHAPES, load_shape_table
from .weights import WEIGHTS, WeightStore


def load(root: str | Path, **kwargs) -> Program | ShapedProgram:
    """Loads the artifact ``root`` written by ``collage compile``."""
    path = Path(root)
    if is_package(path):
        try:
            with zipfile.ZipFile(path) as zf:
                shaped = SHAPES in zf.namelist()
        except (OSError, zipfile.BadZipFile, ValueError):
            shaped = False  # Program's unpacking says what is wrong with it
    else:
        shaped = (path / SHAPES).is_file()
    if shaped:
        return ShapedProgram(path, **kwargs)
    if path.is_dir() and "weights" not in kwargs:
        shared = path.resolve().parent.parent  # <artifact>/buckets/<bucket>
        if (shared / SHAPES).is_file() and load_shape_table(shared).weights_sha256 is not None:
            kwargs["weights"] = WeightStore(shared / WEIGHTS)
    return Program(path, **kwargs)
