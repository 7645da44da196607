// RUN: collage-opt %S/Inputs/mlp.mlir --collage-number-ops --collage-assign="plan=%S/Inputs/mlp-plan.json" --collage-outline --collage-lower | filecheck %s
// RUN: rm -rf %t && collage-opt %S/Inputs/mlp.mlir --collage-number-ops --collage-assign="plan=%S/Inputs/mlp-plan.json" --collage-outline --collage-lower="artifact-dir=%t" | filecheck %s --check-prefix=BUILT
// RUN: %PYTHON -c "import json, sys; p = json.load(open(sys.argv[1])); print(p['steps'])" %t/regions/layer1.onednn.json | filecheck %s --check-prefix=STEPS

// A library region becomes the import @collage_rt.<region>; a codegen region stays a body.
// CHECK-LABEL: func.func @main
// CHECK: call @collage_rt.layer1(%arg0, %arg1, %arg2)
// CHECK: call @act(
// CHECK: func.func private @collage_rt.layer1(tensor<2x8xf32>, tensor<8x16xf32>, tensor<16xf32>) -> tensor<2x16xf32> attributes {collage.backend = "onednn", collage.region = "layer1"}{{$}}
// CHECK: func.func private @act(%arg0: tensor<2x4xf32>)
// CHECK-NEXT: stablehlo.tanh

// With an artifact dir, the import names the region artifact it was built into and the executor that
// serves it (the manifest's region entries are read back from these attributes).
// BUILT: func.func private @collage_rt.layer1({{.*}}) -> tensor<2x16xf32> attributes {collage.artifact = "regions/layer1.onednn.json", collage.backend = "onednn", collage.executor = "collage_runtime.executors.torch_steps", collage.region = "layer1"}

// The oneDNN step program: one GEMM step, the bias add and relu (max with the cloned zero) folded in.
// STEPS: [{'in': [0, 1, 2], 'out': {{[0-9]+}}, 'op': 'matmul', 'transpose_rhs': False, 'bias': True, 'binary': None, 'act': 'relu', {{.*}}}]{{$}}
