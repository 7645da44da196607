"""ONNX's backend node tests as a conformance corpus (test/conformance/onnx_nodes.py): no (case, plan) gives
wrong numbers with exit 0 or crashes, and every case IREE alone passes after import also passes under
``prefer:ort``, ``prefer:openvino`` and random plans, except the entries of
test/conformance/onnx_nodes_expected.json (each with its reason). CI runs a sample spread over op types;
the whole suite (~1,900 cases, about an hour on 2 cores) is ``-m bench``."""

from __future__ import annotations

import sys

import pytest

from helpers import CONFORMANCE

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

sys.path.insert(0, str(CONFORMANCE))
from onnx_nodes import PLANS, expand, load_expected, prepare, run_parallel, violations  # noqa: E402

#: (op module under onnx.backend.test.case.node, case): elementwise, broadcasting, a boolean select, matmul,
#: convolution and pooling, softmax, a reduction (axes as an input), an integer result, normalization,
#: indexing, a wrong lowering the import check finds and keeps as ONNX (Mod with mixed signs), one it
#: refuses (SpaceToDepth CRD: ONNX Runtime cannot run it either), a function op torch-mlir lacks (expanded),
#: an op it cannot lower (kept as ONNX, on ONNX Runtime), ONNX Runtime's own miss (DFT), and an average
#: pool counting padding (the ONNX export once folded its count to a constant); uint64 and float64 values at
#: kept nodes, an op whose folded body imports node by node but not whole (kept whole), a Gemm whose bias is
#: computed after its MatMul (the export once wrote it unsorted), a fully masked attention row (OpenVINO's
#: ReduceMax of a row of -inf is finite: its build guards it), a kept QuantizeLinear (OpenVINO, which may run
#: some kept nodes, rounds its ties its own way: it stays on ONNX Runtime).
SAMPLE = [("abs", "test_abs"), ("add", "test_add_bcast"), ("mod", "test_mod_mixed_sign_int16"),
          ("where", "test_where_example"), ("gemm", "test_gemm_default_matrix_bias"),
          ("conv", "test_conv_with_strides_padding"), ("maxpool", "test_maxpool_2d_pads"),
          ("softmax", "test_softmax_axis_1"), ("reducesum", "test_reduce_sum_keepdims_example"),
          ("argmax", "test_argmax_default_axis_example"), ("layernormalization", "test_layer_normalization_2d_axis0"),
          ("gather", "test_gather_0"), ("rmsnormalization", "test_rms_normalization_2d_axis1"),
          ("det", "test_det_2d"), ("dft", "test_dft"), ("spacetodepth", "test_spacetodepth_crd_mode_example"),
          ("averagepool", "test_averagepool_2d_precomputed_same_upper"), ("add", "test_add_uint64"),
          ("cumsum", "test_cumsum_1d"), ("softmax_cross_entropy_loss", "test_sce_mean_3d"), ("gemm", "test_gemm_beta"),
          ("attention", "test_attention_23_fullymasked_qk_matmul_output_mode3_zero_expanded"),
          ("dynamicquantizelinear", "test_dynamicquantizelinear_expanded"),
          ("reshape", "test_reshape_allowzero_reordered"), ("scan", "test_scan9_sum"),
          ("causal_conv_with_state", "test_causal_conv_with_state_silu_fp16_expanded"),
          ("averagepool", "test_averagepool_2d_ceil_last_window_starts_on_pad")]
#: Cases that pass under every plan of CI's; they, ONNX Runtime's own miss and the refused case are also run under
#: the other plans of CI's (the rest under ``default`` only: the whole sample under three plans took 164 s).
EVERY_PLAN = ("test_mod_mixed_sign_int16", "test_rms_normalization_2d_axis1", "test_det_2d", "test_add_uint64",
              "test_cumsum_1d", "test_sce_mean_3d", "test_gemm_beta",
              "test_attention_23_fullymasked_qk_matmul_output_mode3_zero_expanded", "test_dynamicquantizelinear_expanded",
              "test_reshape_allowzero_reordered", "test_scan9_sum", "test_causal_conv_with_state_silu_fp16_expanded",
              "test_averagepool_2d_ceil_last_window_starts_on_pad")
ACROSS_PLANS = (*EVERY_PLAN, "test_dft", "test_spacetodepth_crd_mode_example")
CI_PLANS = ("default", "prefer:ort", "prefer:openvino")  # random plans: the bench run and test_conformance


def _check(names, modules, plans, tmp_path, across) -> list:
    """Runs the cases ``names`` (all of ``modules``' where None) under ``plans[0]``, and those in ``across`` (all
    where None) under the other ``plans`` too; a row for each such (case, plan) and no violation of the expected."""
    def runs(case: str, plan: str) -> bool:
        return plan == plans[0] or across is None or case in across

    dirs, refused, _ = prepare(names, modules, tmp_path)
    if across is None:
        rows = expand(refused, plans) + run_parallel(dirs, plans, jobs=2)
    else:  # each case imported and checked once, in the child that runs it under all its plans
        rows = expand(refused, plans) + run_parallel([d for d in dirs if d.name in across], plans, jobs=2)
        rows += run_parallel([d for d in dirs if d.name not in across], plans[:1], jobs=2)
    cases = names or {r.case for r in rows}
    assert {(r.case, r.plan) for r in rows if runs(r.case, r.plan)} == {(n, p) for n in cases for p in plans
                                                                       if runs(n, p)}
    problems = violations(rows, load_expected())
    assert not problems, "\n".join(problems)
    return rows


def test_onnx_node_sample(tmp_path):
    rows = _check([c for _, c in SAMPLE], sorted({m for m, _ in SAMPLE}), CI_PLANS, tmp_path, across=ACROSS_PLANS)
    by = {(r.case, r.plan): r for r in rows}
    assert by[("test_spacetodepth_crd_mode_example", "default")].reason.startswith("check: "), by
    for plan in CI_PLANS:
        for case in EVERY_PLAN:
            assert by[(case, plan)].klass == "passed", by[(case, plan)]
        assert by[("test_dft", plan)].klass == "engine" and by[("test_dft", plan)].ort == "wrong", by
    assert sum(1 for r in rows if r.plan == "default" and r.klass == "passed") >= len(SAMPLE) - 3


@pytest.mark.bench
def test_onnx_node_suite(tmp_path):
    _check(None, None, PLANS, tmp_path, across=None)
