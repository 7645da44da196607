# lit configuration for collage-mlir: `lit test/lit` (or `cmake --build build --target check-collage`).
import os
import sys

import lit.formats

config.name = "collage"
config.test_format = lit.formats.ShTest()
config.suffixes = [".mlir", ".py"]
# lit 23: with ".py" a test suffix, the config itself must be excluded.
config.excludes = ["lit.cfg.py", "Inputs", "Output"]
config.test_source_root = os.path.dirname(os.path.abspath(__file__))
config.environment["PYTHONUNBUFFERED"] = "1"
for var in ("HOME", "PATH", "COLLAGE_CACHE_DIR", "XDG_CACHE_HOME"):
    if var in os.environ:
        config.environment[var] = os.environ[var]

python = sys.executable
config.substitutions.append(("%PYTHON", python))
config.substitutions.append(("collage-opt", f"{python} -m collage_mlir.tools.collage_opt"))
config.substitutions.append(("filecheck", "filecheck"))
