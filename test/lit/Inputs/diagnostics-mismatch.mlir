// Input of collage-assign-diagnostics.mlir: verification must fail on each chunk.
module attributes {collage.plan = {version = 1, regions = [{name = "r", backend = "iree-cpu", ops = [42]}]}} {
  func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.negate %a : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}

// -----

// expected-warning @+1 {{unsupported plan version 7}}
module attributes {collage.plan = {version = 7, regions = []}} {
  func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {
    return %a : tensor<4xf32>
  }
}

// -----

func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {
  return %a : tensor<4xf32>  // expected-error {{this is never said}}
}
