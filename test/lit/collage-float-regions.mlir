// RUN: collage-opt %s --split-input-file --collage-number-ops --collage-assign --collage-float-regions | filecheck %s

// A float region reads x itself where it read dequantize(quantize(x)), clamped where the quantization's
// range starts at 0 (a quantizer folded a ReLU into it: x's pair here); the weight's pair goes without
// a clamp (its constant stays outside the region); the clamp joins the region.
// CHECK-LABEL: func.func @main
// CHECK-SAME: (%[[X:.*]]: tensor<2x4xf32>)
// CHECK-NEXT: %[[W:.*]] = stablehlo.constant {collage.id = 0 : i64}
// CHECK-NEXT: %[[LO:.*]] = stablehlo.constant {collage.backend = "iree-cpu", collage.region = "r"} dense<0.000000e+00>
// CHECK-NEXT: %[[HI:.*]] = stablehlo.constant {{.*}} dense<2.550000e+01>
// CHECK-NEXT: %[[XC:.*]] = stablehlo.clamp %[[LO]], %[[X]], %[[HI]] {collage.backend = "iree-cpu", collage.region = "r"}
// CHECK-NEXT: stablehlo.dot_general %[[XC]], %[[W]]
// CHECK-NOT: uniform_
// CHECK: return
module attributes {collage.plan = {version = 1, regions = [{name = "r", backend = "iree-cpu", ops = [1, 2, 3, 4, 5], precision = "float"}]}} {
  func.func @main(%x: tensor<2x4xf32>) -> tensor<2x3xf32> {
    %w = stablehlo.constant dense<0.5> : tensor<4x3xf32>
    %wq = stablehlo.uniform_quantize %w : (tensor<4x3xf32>) -> tensor<4x3x!quant.uniform<i8:f32, 0.25>>
    %wd = stablehlo.uniform_dequantize %wq : (tensor<4x3x!quant.uniform<i8:f32, 0.25>>) -> tensor<4x3xf32>
    %q = stablehlo.uniform_quantize %x : (tensor<2x4xf32>) -> tensor<2x4x!quant.uniform<i8:f32, 0.1:-128>>
    %d = stablehlo.uniform_dequantize %q : (tensor<2x4x!quant.uniform<i8:f32, 0.1:-128>>) -> tensor<2x4xf32>
    %y = stablehlo.dot_general %d, %wd, contracting_dims = [1] x [0] : (tensor<2x4xf32>, tensor<4x3xf32>) -> tensor<2x3xf32>
    return %y : tensor<2x3xf32>
  }
}

// -----

// A pair whose result is also read outside the float region keeps serving that read; a range that does
// not start at 0 gets no clamp (saturating at a calibrated edge is quantization error).
// CHECK-LABEL: func.func @main
// CHECK-SAME: (%[[X:.*]]: tensor<4xf32>)
// CHECK-NEXT: %[[Q:.*]] = stablehlo.uniform_quantize %[[X]]
// CHECK-NEXT: %[[D:.*]] = stablehlo.uniform_dequantize %[[Q]]
// CHECK-NEXT: stablehlo.tanh %[[X]] {{.*}}collage.region = "f"
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
