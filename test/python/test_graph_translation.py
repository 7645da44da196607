"""Graph backends take whole models: the ONNX translation is simplified to what torch.onnx.export
writes (batch norm folded into the convolution, constants folded), and a ResNet-style CNN and a
BERT-style encoder (embedding gathers, an iota, an i1 ``and`` reduction in attention) each go to
ort, openvino and xla-cpu as one region, matching IREE alone within the backend's tolerance."""

from __future__ import annotations

import collections

import numpy as np
import pytest

import collage_runtime
from collage_mlir.backends import get_backend
from collage_mlir.backends.onnx_export import translate
from collage_mlir.frontends.torch import import_torch
from collage_mlir.graph import Graph
from collage_mlir.iree import compile_module
from collage_mlir.ir import new_context
from collage_mlir.passes.number_ops import NumberOpsPass
from collage_mlir.plan import Plan, Region

GRAPH_BACKENDS = {"ort": "onnxruntime", "openvino": "openvino", "xla-cpu": "jaxlib"}


def resnet(width: int = 8):
    """Stem (conv 7x7/2, batch norm, relu, max pool), one bottleneck with a projection shortcut, head.
    Batch-norm statistics are randomised so folding them into the conv is visible in the numbers."""
    import torch
    from torch import nn

    class Bottleneck(nn.Module):
        def __init__(self, cin, mid, stride):
            super().__init__()
            cout = 4 * mid
            self.body = nn.Sequential(
                nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(),
                nn.Conv2d(mid, mid, 3, stride, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(),
                nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            return torch.relu(self.body(x) + self.down(x))

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                          nn.MaxPool2d(3, 2, 1), Bottleneck(width, width, 2),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * width, 10)).eval()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.5, 0.5)
    return model, torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def encoder(vocab: int = 64, d: int = 32, heads: int = 2, layers: int = 1, seq: int = 16):
    """BERT-style: token, position and segment embeddings, layer norm, post-norm layers of masked
    attention (a boolean padding mask) and a GELU feed-forward."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
            self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)

        def forward(self, x, mask):
            b, t, _ = x.shape
            q, k, v = self.qkv(x).view(b, t, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            x = self.n1(x + self.out(a.transpose(1, 2).reshape(b, t, d)))
            return self.n2(x + self.down(F.gelu(self.up(x))))

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos, self.seg = nn.Embedding(vocab, d), nn.Embedding(seq, d), nn.Embedding(2, d)
            self.norm = nn.LayerNorm(d)
            self.layers = nn.ModuleList(Layer() for _ in range(layers))

        def forward(self, ids):
            x = self.tok(ids) + self.pos(torch.arange(ids.shape[1]))[None] + self.seg(torch.zeros_like(ids))
            x = self.norm(x)
            mask = (ids != 0)[:, None, None, :]  # padding tokens are id 0
            for layer in self.layers:
                x = layer(x, mask)
            return x

    torch.manual_seed(0)
    ids = torch.randint(1, vocab, (1, seq), generator=torch.Generator().manual_seed(1))
    ids[0, -3:] = 0
    return Encoder().eval(), ids


MODELS = {"resnet": resnet, "encoder": encoder}


def _main(module):
    return next(f for f in module.body.operations if str(f.attributes["sym_name"]).strip('"') == "main")


def whole_model_plan(module, backend: str) -> Plan:
    """One region holding every op of the module, on ``backend``."""
    NumberOpsPass().run(module)
    return Plan([Region("whole", backend, frozenset(Graph(module).nodes))], source=f"whole:{backend}")


def test_resnet_onnx_is_as_small_as_torch_export(torch):
    """Batch norm folds into the convolutions, relu is Relu, the head is one Gemm: the node count is
    torch.onnx.export's (give or take a reshape), and the simplified graph computes the same."""
    ort = pytest.importorskip("onnxruntime")
    model, x = resnet()
    module = import_torch(model, [x], new_context())
    raw, simple = translate(_main(module), simplify=False), translate(_main(module))
    ops = collections.Counter(n.op_type for n in simple.graph.node)
    assert len(raw.graph.node) > 100  # op by op: 5x as many nodes before simplification
    assert ops["Conv"] == 5 and ops["Relu"] == 4 and ops["Gemm"] == 1 and ops["ReduceMean"] == 1, ops
    assert not {"Sub", "Mul", "Div", "Expand", "Sqrt", "Max", "Identity"} & set(ops), ops  # no batch norm left
    assert len(simple.graph.node) <= 14, ops  # torch.onnx.export writes 14 nodes for this model
    with torch.no_grad():
        want = model(x).numpy()
    for m in (raw, simple):
        session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        np.testing.assert_allclose(session.run(None, {"in0": x.numpy()})[0], want, rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def references(torch, tmp_path_factory):
    """Per model: (input, IREE-alone output)."""
    refs = {}
    for name, build in MODELS.items():
        model, x = build()
        art = compile_module(import_torch(model, [x], new_context()), "default", tmp_path_factory.mktemp(name))
        with collage_runtime.load(art.out_dir) as prog:
            (y,) = prog.invoke("main", x.numpy())
            refs[name] = (x.numpy(), np.array(y))
        with torch.no_grad():
            np.testing.assert_allclose(refs[name][1], model(x).numpy(), rtol=1e-4, atol=1e-4)  # sanity
    return refs


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("backend", sorted(GRAPH_BACKENDS))
def test_whole_model_in_one_region(model, backend, references, tmp_path):
    pytest.importorskip(GRAPH_BACKENDS[backend])
    net, x = MODELS[model]()
    module = import_torch(net, [x], new_context())
    art = compile_module(module, whole_model_plan(module, backend), tmp_path)
    assert [r["backend"] for r in art.manifest["regions"]] == [backend]
    x, want = references[model]
    with collage_runtime.load(art.out_dir) as prog:
        (got,) = prog.invoke("main", x)
        got = np.array(got)
    tol = get_backend(backend).tolerance
    np.testing.assert_allclose(np.asarray(got), want, rtol=tol.rtol, atol=tol.atol)
