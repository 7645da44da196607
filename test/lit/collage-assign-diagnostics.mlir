// RUN: collage-opt %s --split-input-file --verify-diagnostics --collage-number-ops --collage-assign
// RUN: not collage-opt %S/Inputs/diagnostics-mismatch.mlir --split-input-file --verify-diagnostics --collage-number-ops --collage-assign 2>&1 | filecheck %s --check-prefix=MISMATCH

// Bad plans given as the module's collage.plan attribute: each error is an MLIR diagnostic on the op
// of the region it is about, or on the module when no op of the module is (ops ids are 0..3 here).

// expected-error @+1 {{collage.plan: region 'r': unknown op id 42 (the module has ids 0..3)}}
module attributes {collage.plan = {version = 1, regions = [{name = "r", backend = "iree-cpu", ops = [42]}]}} {
  func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.negate %a : tensor<4xf32>
    %1 = stablehlo.tanh %0 : tensor<4xf32>
    %2 = stablehlo.exponential %1 : tensor<4xf32>
    %3 = stablehlo.add %0, %2 : tensor<4xf32>
    return %3 : tensor<4xf32>
  }
}

// -----

// expected-error @+1 {{unsupported plan version 7}}
module attributes {collage.plan = {version = 7, regions = []}} {
  func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.negate %a : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}

// -----

module attributes {collage.plan = {version = 1, regions = [{name = "r", backend = "tpu-magic", ops = [1]}]}} {
  func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.negate %a : tensor<4xf32>
    // expected-error @+1 {{region 'r': unknown backend 'tpu-magic'; known backends: cublas, cudnn, glsl, iree-cpu}}
    %1 = stablehlo.tanh %0 : tensor<4xf32>
    return %1 : tensor<4xf32>
  }
}

// -----

// The path 0 → 1 → 2 → 3 leaves the region {0, 3} and comes back.
module attributes {collage.plan = {version = 1, regions = [{name = "r", backend = "iree-cpu", ops = [0, 3]}]}} {
  func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.negate %a : tensor<4xf32>  // expected-error {{region 'r': ops are not a convex set}}
    %1 = stablehlo.tanh %0 : tensor<4xf32>
    %2 = stablehlo.exponential %1 : tensor<4xf32>
    %3 = stablehlo.add %0, %2 : tensor<4xf32>
    return %3 : tensor<4xf32>
  }
}

// -----

module attributes {collage.plan = {version = 1, regions = [{name = "a", backend = "iree-cpu", ops = [0, 1]},
                                                            {name = "b", backend = "iree-cpu", ops = [1, 2]}]}} {
  func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.negate %a : tensor<4xf32>
    // expected-error-re @below {{region 'b': op {{[0-9]+}} is also in region 'a'}}
    %1 = stablehlo.tanh %0 : tensor<4xf32>
    %2 = stablehlo.exponential %1 : tensor<4xf32>
    return %2 : tensor<4xf32>
  }
}

// -----

// An op the backend refuses: onednn has no pattern for tanh.
module attributes {collage.plan = {version = 1, regions = [{name = "r", backend = "onednn", ops = [1]}]}} {
  func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.negate %a : tensor<4xf32>
    %1 = stablehlo.tanh %0 : tensor<4xf32>
    // expected-error @above {{region 'r': backend 'onednn' cannot take it}}
    return %1 : tensor<4xf32>
  }
}

// -----

// A plan that is not a dictionary.
// expected-error @+1 {{not a collage plan}}
module attributes {collage.plan = "plan.json"} {
  func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {
    return %a : tensor<4xf32>
  }
}

// -----

// No plan at all: the pass names both ways to give one.
// expected-error @+1 {{--collage-assign needs a plan}}
module {
  func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {
    return %a : tensor<4xf32>
  }
}

// -----

// Parse errors are diagnostics too.
func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {
  return %b : tensor<4xf32>  // expected-error {{use of undeclared SSA value name}}
}

// The verifier itself: a diagnostic nobody expects, an expectation nothing meets, a wrong severity.
// MISMATCH: diagnostics-mismatch.mlir:{{[0-9]+}}:{{[0-9]+}}: error: unexpected error: {{.*}}unknown op id 42
// MISMATCH: diagnostics-mismatch.mlir:{{[0-9]+}}:1: error: 'error' diagnostic emitted when expecting a 'warning'
// MISMATCH: diagnostics-mismatch.mlir:{{[0-9]+}}:1: error: expected error "this is never said" was not produced

// -----

module attributes {collage.plan = {version = 1, regions = [{name = "r", backend = "iree-cpu", ops = [0], precision = "float"}]}} {
  func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {
    // expected-error @+1 {{precision 'float' removes quantize/dequantize pairs, and the region dequantizes nothing}}
    %0 = stablehlo.negate %a : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}

// -----

// expected-error @+1 {{region 'r': "precision" must be one of 'model', 'float', not 'int4'}}
module attributes {collage.plan = {version = 1, regions = [{name = "r", backend = "iree-cpu", ops = [0], precision = "int4"}]}} {
  func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.negate %a : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}
