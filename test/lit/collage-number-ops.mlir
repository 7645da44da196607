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

// Complex constants become stablehlo.complex of real and imaginary constants (the Python bindings cannot
// read a complex dense attribute), in list, splat and hex form; the new ops get ids too.
// CHECK-LABEL: func.func @complex_constants
// CHECK-NEXT: %[[R0:.*]] = stablehlo.constant {collage.id = {{[0-9]+}} : i64} dense<[1.000000e+00, 3.000000e+00]> : tensor<2xf32>
// CHECK-NEXT: %[[I0:.*]] = stablehlo.constant {collage.id = {{[0-9]+}} : i64} dense<[2.000000e+00, -4.500000e+00]> : tensor<2xf32>
// CHECK-NEXT: %[[C0:.*]] = stablehlo.complex %[[R0]], %[[I0]] {collage.id = {{[0-9]+}} : i64} : tensor<2xcomplex<f32>>
// CHECK-NEXT: stablehlo.constant {collage.id = {{[0-9]+}} : i64} dense<1.000000e+00> : tensor<2xf64>
// CHECK-NEXT: stablehlo.constant {collage.id = {{[0-9]+}} : i64} dense<-2.000000e+00> : tensor<2xf64>
// CHECK-NEXT: stablehlo.complex
// CHECK-NEXT: stablehlo.constant {collage.id = {{[0-9]+}} : i64} dense<[1.000000e+00, 3.000000e+00]> : tensor<2xf32>
// CHECK-NEXT: stablehlo.constant {collage.id = {{[0-9]+}} : i64} dense<[2.000000e+00, -4.500000e+00]> : tensor<2xf32>
// CHECK-NEXT: stablehlo.complex
// CHECK-NEXT: stablehlo.add %[[C0]]
func.func @complex_constants() -> (tensor<2xcomplex<f32>>, tensor<2xcomplex<f64>>, tensor<2xcomplex<f32>>) {
  %a = stablehlo.constant dense<[(1.0, 2.0), (3.0, -4.5)]> : tensor<2xcomplex<f32>>
  %b = stablehlo.constant dense<(1.0, -2.0)> : tensor<2xcomplex<f64>>
  %c = stablehlo.constant dense<"0x0000803F0000004000004040000090C0"> : tensor<2xcomplex<f32>>
  %d = stablehlo.add %a, %c : tensor<2xcomplex<f32>>
  return %d, %b, %c : tensor<2xcomplex<f32>>, tensor<2xcomplex<f64>>, tensor<2xcomplex<f32>>
}

// Float math on splat constants is folded (a GELU's rsqrt(2), shared by every layer, would otherwise be
// a tensor crossing region boundaries), in the element type; other operands stay.
// CHECK-LABEL: func.func @splat_math
// CHECK-NEXT: stablehlo.constant {collage.id = {{[0-9]+}} : i64} dense<0.49999997> : tensor<2x3xf32>
// CHECK-NEXT: stablehlo.multiply %arg0
// CHECK-NEXT: stablehlo.constant {collage.id = {{[0-9]+}} : i64} dense<1.000000e+00> : tensor<2x3xf16>
// CHECK-NEXT: stablehlo.rsqrt %arg0
// CHECK-NEXT: return
func.func @splat_math(%x: tensor<2x3xf32>) -> (tensor<2x3xf32>, tensor<2x3xf16>, tensor<2x3xf32>) {
  %c = stablehlo.constant dense<2.0> : tensor<2x3xf32>
  %r = stablehlo.rsqrt %c : tensor<2x3xf32>
  %n = stablehlo.negate %r : tensor<2x3xf32>
  %s = stablehlo.multiply %n, %n : tensor<2x3xf32>
  %y = stablehlo.multiply %x, %s : tensor<2x3xf32>
  %h = stablehlo.constant dense<3.0> : tensor<2x3xf16>
  %q = stablehlo.divide %h, %h : tensor<2x3xf16>
  %z = stablehlo.rsqrt %x : tensor<2x3xf32>
  return %y, %q, %z : tensor<2x3xf32>, tensor<2x3xf16>, tensor<2x3xf32>
}

// Ops that return their operand unchanged are dropped; a real broadcast or permutation stays.
// CHECK-LABEL: func.func @identity_ops
// CHECK-NEXT: %[[C:.*]] = stablehlo.compare LT, %arg0, %arg0, SIGNED {collage.id = {{[0-9]+}} : i64}
// CHECK-NEXT: stablehlo.select %[[C]], %arg0, %arg0 {collage.id
// CHECK-NEXT: stablehlo.transpose %arg1, dims = [1, 0] {collage.id
// CHECK-NEXT: stablehlo.broadcast_in_dim %arg1, dims = [1, 2] {collage.id
// CHECK-NEXT: return
func.func @identity_ops(%x: tensor<1x128xi64>, %y: tensor<2x2xf32>) -> (tensor<1x128xi64>, tensor<2x2xf32>, tensor<3x2x2xf32>) {
  %c = stablehlo.compare LT, %x, %x, SIGNED : (tensor<1x128xi64>, tensor<1x128xi64>) -> tensor<1x128xi1>
  %b = stablehlo.broadcast_in_dim %c, dims = [0, 1] : (tensor<1x128xi1>) -> tensor<1x128xi1>
  %r = stablehlo.reshape %b : (tensor<1x128xi1>) -> tensor<1x128xi1>
  %s = stablehlo.select %r, %x, %x : tensor<1x128xi1>, tensor<1x128xi64>
  %v = stablehlo.convert %y : tensor<2x2xf32>
  %t = stablehlo.transpose %v, dims = [1, 0] : (tensor<2x2xf32>) -> tensor<2x2xf32>
  %i = stablehlo.transpose %t, dims = [0, 1] : (tensor<2x2xf32>) -> tensor<2x2xf32>
  %w = stablehlo.broadcast_in_dim %y, dims = [1, 2] : (tensor<2x2xf32>) -> tensor<3x2x2xf32>
  return %s, %i, %w : tensor<1x128xi64>, tensor<2x2xf32>, tensor<3x2x2xf32>
}
