"""BERT and GPT-2 from Hugging Face ``transformers`` (random weights from the config, nothing downloaded),
wrapped to take token ids and return the last hidden state as one tensor.

Attention is transformers' ``eager`` implementation (explicit matmul, softmax, matmul) so every contender
runs the same math."""

from __future__ import annotations

import torch
from torch import nn

from ..errors import CollageError


def _transformers():
    try:
        import transformers
    except ImportError as exc:
        raise CollageError(f"BERT and GPT-2 need Hugging Face transformers ({exc}); "
                           "run `pip install 'collage-mlir[bench]'`") from None
    return transformers


class LastHidden(nn.Module):
    """``model(input_ids).last_hidden_state``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids).last_hidden_state


def bert(layers: int = 12, hidden: int = 768, heads: int = 12) -> nn.Module:
    """``BertModel(BertConfig())`` (BERT-base for the defaults)."""
    tf = _transformers()
    config = tf.BertConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                           intermediate_size=4 * hidden, attn_implementation="eager")
    model = tf.BertModel(config, add_pooling_layer=False)
    return LastHidden(model)


def gpt2(layers: int = 12, hidden: int = 768, heads: int = 12) -> nn.Module:
    """``GPT2Model(GPT2Config())`` (GPT-2 small for the defaults), no key/value cache."""
    tf = _transformers()
    config = tf.GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads, use_cache=False,
                           attn_implementation="eager")
    model = tf.GPT2Model(config)
    return LastHidden(model)


def token_ids(seq: int, vocab: int = 30522) -> torch.Tensor:
    """A batch of one sequence of ``seq`` token ids (int64)."""
    return torch.randint(0, vocab, (1, seq), dtype=torch.int64)
