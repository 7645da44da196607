"""A StableHLO chain of ``links`` (n×n matmul by one shared weight, then tanh): the probe the runtime's
thread and boundary measurements use (``@main(%x, %w)``)."""

from __future__ import annotations


def matmul_tanh_chain(n: int, links: int) -> str:
    """MLIR text of ``x -> tanh(x @ w) -> tanh(. @ w) -> ...`` with ``links`` links on n×n f32."""
    t = f"tensor<{n}x{n}xf32>"
    body, value = [], "%x"
    for k in range(links):
        body.append(f"  %d{k} = stablehlo.dot_general {value}, %w, contracting_dims = [1] x [0] : ({t}, {t}) -> {t}")
        body.append(f"  %t{k} = stablehlo.tanh %d{k} : {t}")
        value = f"%t{k}"
    return f"func.func @main(%x: {t}, %w: {t}) -> {t} {{\n" + "\n".join(body) + f"\n  return {value} : {t}\n}}\n"
