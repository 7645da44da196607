// RUN: collage-opt %s --split-input-file --verify-diagnostics --collage-number-ops --collage-assign | filecheck %s

// An ONNX node kept as ONNX that the plan leaves to the default backend runs alone on ONNX Runtime.
// CHECK-LABEL: func.func @main
// CHECK: stablehlo.negate {{.*}}{collage.id = 0 : i64}
// CHECK: stablehlo.custom_call @collage.onnx_node({{.*}}) {{{.*}}collage.backend = "ort", collage.id = 1 : i64, collage.region = "onnx_node_1"{{.*}}}
// CHECK: stablehlo.tanh {{.*}}{collage.id = 2 : i64}
module attributes {collage.plan = {version = 1, regions = []}} {
  func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.negate %a : tensor<4xf32>
    %1 = stablehlo.custom_call @collage.onnx_node(%0) {backend_config = "", has_side_effect = false} : (tensor<4xf32>) -> tensor<4xf32>
    %2 = stablehlo.tanh %1 : tensor<4xf32>
    return %2 : tensor<4xf32>
  }
}

// -----

// A plan region on a backend that cannot run it is refused.
module attributes {collage.plan = {version = 1, regions = [{name = "r", backend = "iree-cpu", ops = [1]}]}} {
  func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.negate %a : tensor<4xf32>
    // expected-error @+1 {{region 'r': backend 'iree-cpu' cannot take it}}
    %1 = stablehlo.custom_call @collage.onnx_node(%0) {backend_config = "", has_side_effect = false} : (tensor<4xf32>) -> tensor<4xf32>
    return %1 : tensor<4xf32>
  }
}

// -----

// A region on ONNX Runtime may hold it with its neighbours.
// CHECK-LABEL: func.func @main
// CHECK: stablehlo.negate {{.*}}{collage.backend = "ort", collage.id = 0 : i64, collage.region = "g"}
// CHECK: stablehlo.custom_call @collage.onnx_node({{.*}}) {{{.*}}collage.backend = "ort", collage.id = 1 : i64, collage.region = "g"{{.*}}}
module attributes {collage.plan = {version = 1, regions = [{name = "g", backend = "ort", ops = [0, 1]}]}} {
  func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.negate %a : tensor<4xf32>
    %1 = stablehlo.custom_call @collage.onnx_node(%0) {backend_config = "", has_side_effect = false} : (tensor<4xf32>) -> tensor<4xf32>
    return %1 : tensor<4xf32>
  }
}
