"""Framework-made models under the project's own plan strings (test/conformance/framework_models.py): every
plan collage makes compiles, runs and gives IREE alone's numbers. The default suite runs JAX's top-k/sort/
cumsum post-processing under two plans; ``-m bench`` runs every model under every plan (Hugging Face BERT
and GPT-2, JAX CNN, post-processing and encoder; ONNX exports of BERT, GPT-2, ViT, an opset-23 decoder and
a QDQ CNN; default, random:1-6 and three prefer: plans)."""

from __future__ import annotations

import sys

import pytest

from helpers import CONFORMANCE

pytest.importorskip("jax")
sys.path.insert(0, str(CONFORMANCE))
import framework_models  # noqa: E402


def test_jax_post_processing_under_two_plans(tmp_path):
    rows = framework_models.run_model("jax_post", ["default", "prefer:xla-cpu"], tmp_path)
    assert [(r.plan, r.outcome) for r in rows] == [("default", framework_models.Outcome.PASSED),
                                                  ("prefer:xla-cpu", framework_models.Outcome.PASSED)], rows


@pytest.mark.bench
def test_every_model_under_every_plan():
    pytest.importorskip("transformers")
    assert framework_models.main([]) == 0
