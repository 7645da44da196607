// RUN: collage-opt %s --split-input-file --collage-number-ops --collage-assign --collage-float-regions | filecheck %s

// A float region reads x itself where it read dequantize(quantize(x)): the activation's pair and the
// weight's (a constant expression outside the region) are gone.
// CHECK-LABEL: func.func @main
// CHECK-SAME: (%[[X:.*]]: tensor<2x4xf32>)
// CHECK-NEXT: %[[W:.*]] = stablehlo.constant
// CHECK-NEXT: stablehlo.dot_general %[[X]], %[[W]]
// CHECK-NOT: uniform_
// CHECK: return
module attributes {collage.plan = {version = 1, regions = [{name = "r", backend = "iree-cpu", ops = [1, 2, 3, 4, 5], precision = "float"}]}} {
  func.func @main(%x: tensor<2x4xf32>) -> tensor<2x3xf32> {
    %w = stablehlo.constant dense<0.5> : tensor<4x3xf32>
    %wq = stablehlo.uniform_quantize %w : (tensor<4x3xf32>) -> tensor<4x3x!quant.uniform<i8:f32, 0.25>>
    %wd = stablehlo.uniform_dequantize %wq : (tensor<4x3x!quant.uniform<i8:f32, 0.25>>) -> tensor<4x3xf32>
    %q = stablehlo.uniform_quantize %x : (tensor<2x4xf32>) -> tensor<2x4x!quant.uniform<i8:f32, 0.1>>
    %d = stablehlo.uniform_dequantize %q : (tensor<2x4x!quant.uniform<i8:f32, 0.1>>) -> tensor<2x4xf32>
    %y = stablehlo.dot_general %d, %wd, contracting_dims = [1] x [0] : (tensor<2x4xf32>, tensor<4x3xf32>) -> tensor<2x3xf32>
    return %y : tensor<2x3xf32>
  }
}

// -----

// The model's precision (no "precision", or "model") keeps every pair; a pair whose result is also read
// outside the float region keeps serving that read.
// CHECK-LABEL: func.func @main
// CHECK-SAME: (%[[X:.*]]: tensor<4xf32>)
// CHECK: %[[Q:.*]] = stablehlo.uniform_quantize %[[X]]
// CHECK: %[[D:.*]] = stablehlo.uniform_dequantize %[[Q]]
// CHECK: stablehlo.tanh %[[X]] {{.*}}collage.region = "f"
// CHECK: stablehlo.negate %[[D]]
module attributes {collage.plan = {version = 1, regions = [{name = "f", backend = "iree-cpu", ops = [0, 1, 2], precision = "float"}]}} {
  func.func @main(%x: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
    %q = stablehlo.uniform_quantize %x : (tensor<4xf32>) -> tensor<4x!quant.uniform<i8:f32, 0.1>>
    %d = stablehlo.uniform_dequantize %q : (tensor<4x!quant.uniform<i8:f32, 0.1>>) -> tensor<4xf32>
    %t = stablehlo.tanh %d : tensor<4xf32>
    %n = stablehlo.negate %d : tensor<4xf32>
    return %t, %n : tensor<4xf32>, tensor<4xf32>
  }
}
