// A two-layer MLP as torch-mlir emits it (weights as arguments): dot_general, bias add, relu.
func.func @main(%x: tensor<2x8xf32>, %w1: tensor<8x16xf32>, %b1: tensor<16xf32>, %w2: tensor<16x4xf32>) -> tensor<2x4xf32> {
  %zero = stablehlo.constant dense<0.0> : tensor<2x16xf32>
  %0 = stablehlo.dot_general %x, %w1, contracting_dims = [1] x [0] : (tensor<2x8xf32>, tensor<8x16xf32>) -> tensor<2x16xf32>
  %1 = stablehlo.broadcast_in_dim %b1, dims = [1] : (tensor<16xf32>) -> tensor<2x16xf32>
  %2 = stablehlo.add %0, %1 : tensor<2x16xf32>
  %3 = stablehlo.maximum %2, %zero : tensor<2x16xf32>
  %4 = stablehlo.dot_general %3, %w2, contracting_dims = [1] x [0] : (tensor<2x16xf32>, tensor<16x4xf32>) -> tensor<2x4xf32>
  %5 = stablehlo.tanh %4 : tensor<2x4xf32>
  return %5 : tensor<2x4xf32>
}
