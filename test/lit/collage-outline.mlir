// RUN: collage-opt %S/Inputs/mlp.mlir --collage-number-ops --collage-assign="plan=%S/Inputs/mlp-plan.json" --collage-outline | filecheck %s
// RUN: collage-opt %s --split-input-file --collage-outline | filecheck %s --check-prefix=ORDER

// Each region becomes a private function called where it was; the small zero constant is cloned
// into the region (a backend must see it is a relu), weights stay arguments.
// CHECK-LABEL: func.func @main
// CHECK-NEXT: %[[L1:.*]] = call @layer1(%arg0, %arg1, %arg2) : (tensor<2x8xf32>, tensor<8x16xf32>, tensor<16xf32>) -> tensor<2x16xf32>
// CHECK-NEXT: %[[D:.*]] = stablehlo.dot_general %[[L1]], %arg3
// CHECK-NEXT: %[[A:.*]] = call @act(%[[D]])
// CHECK-NEXT: return %[[A]]
// CHECK-LABEL: func.func private @layer1
// CHECK-SAME: attributes {collage.backend = "onednn", collage.region = "layer1"}
// CHECK-NEXT: stablehlo.constant {{.*}}dense<0.000000e+00>
// CHECK-NEXT: stablehlo.dot_general %arg0, %arg1
// CHECK: stablehlo.maximum
// CHECK-NEXT: return
// CHECK-LABEL: func.func private @act
// CHECK-SAME: collage.backend = "iree-cpu"
// CHECK-NEXT: stablehlo.tanh %arg0

// An op sitting between a region's ops that uses the region's first result moves after the call.
// ORDER-LABEL: func.func @between
// ORDER-NEXT: %[[R:.*]]:2 = call @r(%arg0) : (tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>)
// ORDER-NEXT: %[[M:.*]] = stablehlo.multiply %[[R]]#0, %[[R]]#0
// ORDER-NEXT: %[[S:.*]] = stablehlo.add %[[M]], %[[R]]#1
// ORDER-NEXT: return %[[S]]
// ORDER-LABEL: func.func private @r(%arg0: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>)
// ORDER-NEXT: stablehlo.negate %arg0
// ORDER-NEXT: stablehlo.exponential %arg0
func.func @between(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.negate %a {collage.backend = "iree-cpu", collage.region = "r"} : tensor<4xf32>
  %1 = stablehlo.multiply %0, %0 : tensor<4xf32>
  %2 = stablehlo.exponential %a {collage.backend = "iree-cpu", collage.region = "r"} : tensor<4xf32>
  %3 = stablehlo.add %1, %2 : tensor<4xf32>
  return %3 : tensor<4xf32>
}

// -----

// A constant expression another region owns (here its convert) is copied for the region that reads
// it, and sunk into it: no f64 crosses into the library region's signature.
// ORDER-LABEL: func.func @shared_constant
// ORDER-NEXT: %[[C:.*]] = call @owner()
// ORDER-NEXT: %[[R:.*]] = call @reader(%arg0)
// ORDER-LABEL: func.func private @owner() -> tensor<f32>
// ORDER-LABEL: func.func private @reader(%arg0: tensor<4xf32>) -> tensor<4xi1>
// ORDER-NEXT: %[[K:.*]] = stablehlo.constant dense<2.000000e+00> : tensor<f64>
// ORDER-NEXT: %[[KF:.*]] = stablehlo.convert %[[K]] : (tensor<f64>) -> tensor<f32>
// ORDER-NEXT: %[[KB:.*]] = stablehlo.broadcast_in_dim %[[KF]]
// ORDER-NEXT: stablehlo.compare GT, %arg0, %[[KB]]
func.func @shared_constant(%a: tensor<4xf32>) -> (tensor<f32>, tensor<4xi1>) {
  %k = stablehlo.constant dense<2.0> : tensor<f64>
  %kf = stablehlo.convert %k {collage.backend = "iree-cpu", collage.region = "owner"} : (tensor<f64>) -> tensor<f32>
  %kb = stablehlo.broadcast_in_dim %kf, dims = [] {collage.backend = "onednn", collage.region = "reader"} : (tensor<f32>) -> tensor<4xf32>
  %c = stablehlo.compare GT, %a, %kb {collage.backend = "onednn", collage.region = "reader"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xi1>
  return %kf, %c : tensor<f32>, tensor<4xi1>
}

// -----

// Regions in two public functions; a region name clashing with a symbol is an error.
// ORDER-LABEL: func.func @f
// ORDER-NEXT: call @rf(%arg0)
// ORDER-LABEL: func.func @g
// ORDER-NEXT: call @rg(%arg0)
func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.abs %a {collage.backend = "iree-cpu", collage.region = "rf"} : tensor<4xf32>
  return %0 : tensor<4xf32>
}
func.func @g(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.floor %a {collage.backend = "iree-cpu", collage.region = "rg"} : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// A graph engine's region (ort) gets the weight only it reads as a constant, even a large one (the
// engine prepacks it); a library region (onednn) gets its weight as an argument, and so does a region
// whose weight another op outside it also reads.
// ORDER-LABEL: func.func @weights
// ORDER-NEXT: %[[W2:.*]] = stablehlo.constant dense_resource<w2>
// ORDER-NEXT: %[[W3:.*]] = stablehlo.constant dense_resource<w3>
// ORDER-NEXT: %[[E:.*]] = call @embedded(%arg0) : (tensor<2x8xf32>) -> tensor<2x8xf32>
// ORDER-NEXT: %[[L:.*]] = call @library(%[[E]], %[[W2]])
// ORDER-NEXT: %[[S:.*]] = call @shared(%[[L]], %[[W3]])
// ORDER-NEXT: stablehlo.add %[[S]], %[[W3]]
// ORDER-LABEL: func.func private @embedded(%arg0: tensor<2x8xf32>) -> tensor<2x8xf32>
// ORDER-NEXT: %[[W1:.*]] = stablehlo.constant dense_resource<w1> : tensor<8x8xf32>
// ORDER-NEXT: stablehlo.dot_general %arg0, %[[W1]]
// ORDER-LABEL: func.func private @library(%arg0: tensor<2x8xf32>, %arg1: tensor<8x8xf32>)
// ORDER-LABEL: func.func private @shared(%arg0: tensor<2x8xf32>, %arg1: tensor<2x8xf32>)
func.func @weights(%x: tensor<2x8xf32>) -> tensor<2x8xf32> {
  %w1 = stablehlo.constant dense_resource<w1> : tensor<8x8xf32>
  %w2 = stablehlo.constant dense_resource<w2> : tensor<8x8xf32>
  %w3 = stablehlo.constant dense_resource<w3> : tensor<2x8xf32>
  %0 = stablehlo.dot_general %x, %w1, contracting_dims = [1] x [0] {collage.backend = "ort", collage.region = "embedded"} : (tensor<2x8xf32>, tensor<8x8xf32>) -> tensor<2x8xf32>
  %1 = stablehlo.dot_general %0, %w2, contracting_dims = [1] x [0] {collage.backend = "onednn", collage.region = "library"} : (tensor<2x8xf32>, tensor<8x8xf32>) -> tensor<2x8xf32>
  %2 = stablehlo.multiply %1, %w3 {collage.backend = "ort", collage.region = "shared"} : tensor<2x8xf32>
  %3 = stablehlo.add %2, %w3 : tensor<2x8xf32>
  return %3 : tensor<2x8xf32>
}
{-#
  dialect_resources: {
    builtin: {
      w1: "0x0400000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
      w2: "0x0400000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
      w3: "0x0400000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
    }
  }
#-}

// -----

// Two values the region reads are constant expressions sharing ops (%b2 reshapes %b1): both are
// sunk, and each shared op is erased once, after its last user (outlining used to touch an op it had
// already erased and kill the process: a JAX CNN's tuned plan).
// ORDER-LABEL: func.func @shared_chain
// ORDER-NEXT: %[[R:.*]] = call @s(%arg0)
// ORDER-NEXT: return %[[R]]
// ORDER-LABEL: func.func private @s(%arg0: tensor<8xf32>) -> tensor<2x4xf32>
// ORDER-NEXT: stablehlo.constant dense<0.000000e+00> : tensor<f32>
// ORDER-NEXT: stablehlo.broadcast_in_dim
// ORDER-NEXT: stablehlo.reshape
// ORDER-NEXT: stablehlo.constant dense<0.000000e+00> : tensor<f32>
// ORDER-NEXT: stablehlo.broadcast_in_dim
// ORDER-NEXT: stablehlo.add %arg0
// ORDER-NEXT: stablehlo.reshape
// ORDER-NEXT: stablehlo.maximum
func.func @shared_chain(%a: tensor<8xf32>) -> tensor<2x4xf32> {
  %c = stablehlo.constant dense<0.0> : tensor<f32>
  %b1 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<f32>) -> tensor<2x4xf32>
  %b2 = stablehlo.reshape %b1 : (tensor<2x4xf32>) -> tensor<8xf32>
  %0 = stablehlo.add %a, %b2 {collage.backend = "ort", collage.region = "s"} : tensor<8xf32>
  %1 = stablehlo.reshape %0 {collage.backend = "ort", collage.region = "s"} : (tensor<8xf32>) -> tensor<2x4xf32>
  %2 = stablehlo.maximum %1, %b1 {collage.backend = "ort", collage.region = "s"} : tensor<2x4xf32>
  return %2 : tensor<2x4xf32>
}
