"""Decompositions of PyTorch's fused inference fast paths, which torch-mlir cannot lower.

``nn.TransformerEncoderLayer`` and ``nn.MultiheadAttention`` in eval mode with grad off run one native kernel
each, ``aten._transformer_encoder_layer_fwd`` and ``aten._native_multi_head_attention``, and a graph dynamo
captures under ``torch.no_grad()`` (``torch.compile(model, backend="collage")`` as inference is written) holds
them: its import failed ("failed to legalize operation 'torch.operator' ... _transformer_encoder_layer_fwd") and
the graph ran eagerly. Each is written here with the ops it computes, as ATen's CPU kernels compute them
(``transformer.cpp``, ``attention.cpp``), for ``ExportedProgram.run_decompositions`` (``decompositions``)."""

from __future__ import annotations

import math


def decompositions() -> dict:
    """torch-mlir's decomposition table, and the fast paths' (``fast_paths``)."""
    from torch_mlir.extras.fx_decomp_util import get_decomposition_table

    return get_decomposition_table() | fast_paths()


def fast_paths() -> dict:
    """The fast paths' decompositions alone (``multi_head_attention``, ``encoder_layer``): for
    ``run_decompositions`` before torch's ONNX exporter, which has no function for them either."""
    import torch

    aten = torch.ops.aten
    return {aten._native_multi_head_attention.default: multi_head_attention,
            aten._transformer_encoder_layer_fwd.default: encoder_layer}


def multi_head_attention(query, key, value, embed_dim: int, num_head: int, qkv_weight, qkv_bias, proj_weight,
                         proj_bias, mask=None, need_weights: bool = True, average_attn_weights: bool = True,
                         mask_type: int | None = None):
    """``aten._native_multi_head_attention``: batch-first (B, T, E) inputs, the projections of one packed
    ``qkv_weight``, queries scaled by 1/sqrt(head dim), ``mask`` read as booleans (nonzero: masked; a float
    mask of 0 and -inf as ``nn.MultiheadAttention`` passes it), of shape (T, T) (``mask_type`` 0), (B, T) key
    padding (1), or broadcast to (B, heads, T, T) (2); a fully masked row is NaN, as ATen's. Returns the
    output and, with ``need_weights``, the attention weights (averaged over heads)."""
    import torch
    import torch.nn.functional as F

    b, t, _ = query.shape
    head = embed_dim // num_head
    w_q, w_k, w_v = qkv_weight.split(embed_dim)
    b_q, b_k, b_v = qkv_bias.split(embed_dim)

    def heads(x, w, bias):
        return F.linear(x, w, bias).view(b, x.shape[1], num_head, head).transpose(1, 2)

    q = heads(query, w_q, b_q) / math.sqrt(head)
    k, v = heads(key, w_k, b_k), heads(value, w_v, b_v)
    scores = q @ k.transpose(-2, -1)
    if mask is not None:
        masked = mask.to(torch.bool)
        if mask_type == 1 or (mask_type is None and masked.dim() == 2 and masked.shape[0] == b
                              and masked.shape[1] == k.shape[2] and masked.shape != scores.shape[-2:]):
            masked = masked.view(b, 1, 1, k.shape[2])
        scores = scores.masked_fill(masked, float("-inf"))
    weights = torch.softmax(scores, -1)
    out = F.linear((weights @ v).transpose(1, 2).reshape(b, t, embed_dim), proj_weight, proj_bias)
    if not need_weights:
        return out, query.new_empty((0,))
    return out, weights.mean(1) if average_attn_weights else weights


def encoder_layer(src, embed_dim: int, num_heads: int, qkv_weight, qkv_bias, proj_weight, proj_bias, use_gelu: bool,
                  norm_first: bool, eps: float, norm_weight_1, norm_bias_1, norm_weight_2, norm_bias_2, ffn_weight_1,
                  ffn_bias_1, ffn_weight_2, ffn_bias_2, mask=None, mask_type: int | None = None):
    """``aten._transformer_encoder_layer_fwd``: self-attention (``multi_head_attention``) and a feed-forward
    block (exact GELU or ReLU), each added to its input, layer-normed before (``norm_first``) or after."""
    import torch.nn.functional as F

    def norm(x, weight, bias):
        return F.layer_norm(x, (embed_dim,), weight, bias, eps)

    x = norm(src, norm_weight_1, norm_bias_1) if norm_first else src
    x = multi_head_attention(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, mask,
                             False, True, mask_type)[0] + src
    if not norm_first:
        x = norm(x, norm_weight_1, norm_bias_1)
    y = norm(x, norm_weight_2, norm_bias_2) if norm_first else x
    hidden = F.linear(y, ffn_weight_1, ffn_bias_1)
    y = F.linear(F.gelu(hidden) if use_gelu else F.relu(hidden), ffn_weight_2, ffn_bias_2) + x
    return y if norm_first else norm(y, norm_weight_2, norm_bias_2)
