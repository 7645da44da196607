// RUN: collage-opt %s --collage-number-ops | filecheck %s
// RUN: collage-opt %s --pass-pipeline="builtin.module(collage-number-ops)" | filecheck %s

// Ids run over public functions in module order; private functions and terminators get none.

// CHECK-LABEL: func.func @first
// CHECK: stablehlo.add {{.*}}{collage.id = 0 : i64}
// CHECK: stablehlo.multiply {{.*}}{collage.id = 1 : i64}
// CHECK: return
func.func @first(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.add %a, %a : tensor<4xf32>
  %1 = stablehlo.multiply %0, %a : tensor<4xf32>
  return %1 : tensor<4xf32>
}

// CHECK-LABEL: func.func private @helper
// CHECK-NOT: collage.id
func.func private @helper(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.negate %a : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// CHECK-LABEL: func.func @second
// CHECK: stablehlo.constant {collage.id = 2 : i64}
// CHECK: stablehlo.reduce{{.*}}collage.id = 3 : i64
func.func @second(%a: tensor<4xf32>) -> tensor<f32> {
  %c = stablehlo.constant dense<0.0> : tensor<f32>
  %0 = stablehlo.reduce(%a init: %c) applies stablehlo.add across dimensions = [0] : (tensor<4xf32>, tensor<f32>) -> tensor<f32>
  return %0 : tensor<f32>
}
