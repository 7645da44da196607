"""Translate a region function of StableHLO into an ONNX model: one translator, two consumers
(`ort` runs the model with ONNX Runtime, `openvino` reads the same model with OpenVINO).

Every supported op maps to a few ONNX nodes (opset 18, ``ir_version`` 10 — ONNX Runtime 1.31 reads
no newer). Constants become initializers; ``dense_resource`` blobs (how torch-mlir stores weights)
are read back by printing a scratch module holding just the constants, whose resource section carries
the blobs as hex. ``OPS`` is the data table of supported ops and their constraints, which each op
family's module fills (``register``); the backends use it as their single-op patterns, so an op that
cannot be translated is simply not proposed.

Graph inputs are named ``in0..``, outputs ``out0..`` (in function argument / result order). Each node's
``doc_string`` names the StableHLO ops it computes (``collage.id 14 17``: their ``collage.id``, after the
simplification too, ``op_ids``), so an engine's per-node profile can be charged to the model's ops
(``collage_mlir.measure.profile``); engines ignore it.

Modules: ``registry`` (the op table, ``register``, the constraints rules share), ``builder`` (the graph
under construction, the walk over a block's ops), ``values`` (element types, readers of values); the rules
by op family: ``elementwise``, ``constants``, ``gather``, ``movement``, ``loops`` (with ``loop_form``, and
``recurrent`` for LSTM/GRU layers), ``cond``, ``sort``, ``reduce``, ``conv`` (with pooling), ``matmul``,
``quant`` (uniform quantize/dequantize), ``kept`` (an ONNX node kept as ONNX, back into the graph);
``op_ids``; ``optimize`` (the simplification); ``export`` (``translate``).
"""

from __future__ import annotations

# Each op family's module registers its rules when imported, in this order: the order of ``OPS``, which
# `collage backends` lists.
from . import elementwise  # noqa: F401
from . import constants  # noqa: F401
from . import gather  # noqa: F401
from . import loops  # noqa: F401
from . import cond  # noqa: F401
from . import sort  # noqa: F401
from . import movement  # noqa: F401
from . import reduce  # noqa: F401
from . import conv  # noqa: F401
from . import matmul  # noqa: F401
from . import quant  # noqa: F401
from . import kept  # noqa: F401
from .export import IR_VERSION, OPSET, translate
from .op_ids import OP_IDS_DOC, op_ids
from .registry import OPS, NestedOps, OnnxOp, register
from .values import DTYPES, FLOATS

__all__ = ["DTYPES", "FLOATS", "IR_VERSION", "NestedOps", "OPS", "OPSET", "OP_IDS_DOC", "OnnxOp", "op_ids",
           "register", "translate"]
