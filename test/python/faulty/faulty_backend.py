"""A backend that fails on purpose, registered by test_measure through its own entry points (this
directory holds a dist-info): ``faulty-crash`` aborts the process when run, ``faulty-hang`` never
returns, ``faulty-wrong`` returns results off by one, ``faulty-build`` fails to build, ``faulty-raise`` raises when
run. Its executor is registered the same way (``collage_runtime.executors``)."""

from __future__ import annotations

import json
from pathlib import Path

from collage_mlir.backends.base import BackendKind, OpSetBackend, RegionArtifact
from collage_mlir.backends.patterns import OpPattern


class _Faulty(OpSetBackend):
    kind = BackendKind.LIBRARY
    patterns = (OpPattern("add", "stablehlo.add", ()), OpPattern("multiply", "stablehlo.multiply", ()))
    max_region_ops = 1
    mode = ""

    def version(self) -> str:
        return "faulty-1"

    def build(self, func, out_dir: Path, region: str) -> RegionArtifact:
        if self.mode == "build":
            raise RuntimeError("this backend cannot build anything")
        file = f"regions/{region}.faulty.json"
        (Path(out_dir) / file).parent.mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / file).write_text(json.dumps({"mode": self.mode, "op": func.regions[0].blocks[0].operations[0].name}))
        return RegionArtifact(file, "faulty_executor")


class Crash(_Faulty):
    name, mode = "faulty-crash", "crash"


class Hang(_Faulty):
    name, mode = "faulty-hang", "hang"


class Wrong(_Faulty):
    name, mode = "faulty-wrong", "wrong"


class BuildFails(_Faulty):
    name, mode = "faulty-build", "build"


class Raise(_Faulty):
    name, mode = "faulty-raise", "raise"
