"""``load``: an artifact, a directory or one packed ``.collage`` file, as the program that runs it: a
``Program`` (one static shape, ``manifest.json``) or a ``ShapedProgram`` (shape buckets, ``shapes.json``)."""

from __future__ import annotations

import zipfile
from pathlib import Path

from .package import is_package
from .program import Program
from .shaped import ShapedProgram
from .shapes import SHAPES


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
    return ShapedProgram(path, **kwargs) if shaped else Program(path, **kwargs)
