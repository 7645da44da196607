"""What a manifest may not make the runtime do: pick the Python code that serves a region (only executors
installed packages register run), or read a region's file outside the artifact's directory. Both are
checked on load, before any region runs. (Hash and signature checks: test_artifact_checks.py.)"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

import collage_runtime
from collage_runtime.manifest import ArtifactError


def _tampered(src: Path, dst: Path, **fields) -> Path:
    """A copy of the artifact ``src`` whose first region's manifest entry has ``fields`` changed."""
    shutil.copytree(src, dst)
    manifest = json.loads((dst / "manifest.json").read_text())
    manifest["regions"][0].update(fields)
    (dst / "manifest.json").write_text(json.dumps(manifest))
    return dst


def test_manifest_cannot_choose_the_executor_module(ort_region_artifact, tmp_path):
    art = _tampered(ort_region_artifact, tmp_path / "art", executor="this")
    sys.modules.pop("this", None)
    with pytest.raises(ArtifactError, match="executor 'this' is not registered by any installed package"):
        collage_runtime.load(art)
    assert "this" not in sys.modules  # nothing was imported on the manifest's word


def test_region_artifact_confined_to_the_artifact_dir(ort_region_artifact, tmp_path):
    art = _tampered(ort_region_artifact, tmp_path / "art", artifact="../../../../etc/passwd")
    with pytest.raises(ArtifactError, match="outside the artifact directory"):
        collage_runtime.load(art)
