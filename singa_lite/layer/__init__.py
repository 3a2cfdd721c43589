"""Layers, with SINGA 3's names (``singa.layer``); the same classes are exported by ``autograd`` for
scripts written against SINGA's autograd layers (``autograd.Conv2d(1, 20, 5)``, ``autograd.Linear(800, 500)``).

This module only re-exports. The package:

- base.py: :class:`Layer`, the base class (calling, lazy parameters, sublayers, parameter names, states);
- basic.py: ``Linear``, ``Conv2d``, ``BatchNorm2d``, pooling, activations, losses, ``Gemm``, ``Embedding``...;
- recurrent.py: ``RNN``, ``LSTM``;
- transformer.py: ``LayerNorm``, ``MultiHeadAttention``, ``TransformerEncoderLayer``;
- cudnn_rnn.py: ``CudnnRNN`` (SINGA's cuDNN-layout RNN / LSTM / GRU, here on any device).

The layers build on the operators only: nothing here imports the data-parallel layer (``singa_lite.parallel``);
batch normalisation over every rank's batch is ``singa_lite.parallel.sync_batchnorm.SyncBatchNorm2d``.
"""
from __future__ import annotations

from .. import _moved
from .base import Layer
from .basic import (ACTIVATIONS, NO_EXTRA, PAD_MODES, Add, AvgPool1d, AvgPool2d, BatchNorm2d,  # noqa: F401
                    BinaryCrossEntropy, Cat, Conv2d, CrossEntropy, Dropout, Embedding, Flatten, Gelu, Gemm,
                    GlobalAvgPool2d, Linear, MaxPool1d, MaxPool2d, MeanSquareError, Pooling2d, ReLU, Reshape,
                    SeparableConv2d, Sigmoid, SoftMax, SoftMaxCrossEntropy, Tanh)
from .cudnn_rnn import CudnnRNN  # noqa: F401
from .recurrent import LSTM, RNN  # noqa: F401
from .transformer import LayerNorm, MultiHeadAttention, TransformerEncoderLayer  # noqa: F401

__all__ = ["Layer", "Linear", "Conv2d", "SeparableConv2d", "Pooling2d", "MaxPool2d", "AvgPool2d", "MaxPool1d",
           "AvgPool1d", "GlobalAvgPool2d", "BatchNorm2d", "ReLU", "Sigmoid", "Tanh", "Gelu", "Flatten", "Dropout",
           "SoftMax", "SoftMaxCrossEntropy", "MeanSquareError", "CrossEntropy", "BinaryCrossEntropy", "Add", "Cat",
           "Reshape", "LayerNorm", "MultiHeadAttention", "TransformerEncoderLayer"]


def __getattr__(name):
    return _moved.attribute(__name__, name)
