// Recurrent layers through cuDNN 9's RNN API (cudnn_adv.h: cudnnRNNForward, cudnnRNNBackwardData_v8,
// cudnnRNNBackwardWeights_v8) for CUDA tensors: SINGA's layer.CudnnRNN on a GPU. singa_lite/layer/cudnn_rnn.py calls
// these when the input is on a GPU and cudnn_available() (cuda/cudnn.h); otherwise, and always on the CPU, the layer
// runs its own LSTM / GRU / RNN of autograd operators with the same flat weight and the same equations.
//
// What is described to cuDNN: CUDNN_RNN_ALGO_STANDARD, CUDNN_LINEAR_INPUT, CUDNN_RNN_DOUBLE_BIAS (an input and a
// recurrent bias per gate), no projection, a dropout descriptor with dropout 0 (the layer runs its own path when it
// must drop between layers), and the padded ("unpacked") data layouts with CUDNN_RNN_PADDED_IO_ENABLED:
// x (batch, seq, features) when batch_first, else (seq, batch, features); y likewise with hidden * directions
// features, the forward direction's hidden values first. Per-sequence lengths (the layer's use_mask) go in the data
// descriptors; padded steps of y are written as 0 and leave the state as it was, which is what the CPU path does.
// hx / cx are (num_layers * directions, batch, hidden), zeros when undefined. float32 runs with CUDNN_FMA_MATH (no
// TF32 rounding), float16 with tensor cores and float32 compute, float64 with CUDNN_DEFAULT_MATH.
//
// The flat weight W is singa_lite's layout (singa_lite/layer/cudnn_rnn.py, the same as torch's): per pseudo-layer
// (layer 0 forward, layer 0 backward, layer 1 forward, ...) the G input matrices (G*hidden, input) row-major, the G
// recurrent matrices (G*hidden, hidden), the G input biases, the G recurrent biases; gates in cuDNN's linear-layer
// order (LSTM: input, forget, cell, output; GRU: reset, update, new). Every call asks cudnnGetRNNWeightParams where
// cuDNN keeps each matrix and bias; when that is exactly this layout (and cuDNN's weight space has this size), W is
// given to cuDNN as it is and dW comes back in place. Otherwise W is copied block by block into a weight space of
// cuDNN's size and dW back out of one, so the result never depends on how a cuDNN version packs its weights.
//
// Every argument is checked before the first cuDNN call (ValueError / TypeError). Workspaces and the reserve space
// come from the caching allocator; the reserve is returned by the training forward and must be given, unchanged,
// to the backward of the same call (cuDNN keeps the forward's intermediate values there).
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace sl::cuda {

enum class RnnMode { kRelu, kTanh, kLstm, kGru };

struct RnnSpec {
  RnnMode mode = RnnMode::kLstm;
  int64_t hidden_size = 0;
  int64_t num_layers = 1;
  bool bidirectional = false;
  bool batch_first = true;
};

// Gates per cell: 4 (LSTM), 3 (GRU), 1 (vanilla RNN).
int rnn_gates(RnnMode mode);
// Elements of the flat weight for `input_size` features, in singa_lite's layout.
int64_t rnn_weights_size(const RnnSpec& spec, int64_t input_size);

struct RnnForwardResult {
  Tensor y;        // (batch, seq, hidden * directions) when batch_first, else (seq, batch, ...)
  Tensor hy, cy;   // the last state of every pseudo-layer (cy: LSTM only, else undefined)
  Tensor reserve;  // training only: what the backward needs (opaque, int32 words); undefined in inference
};
// x: the input; w: the flat weight; hx, cx: the initial states or undefined (zeros); seq_lengths: empty (every
// sequence is full) or one length in [1, seq] per sequence; training: keep the reserve space for a backward.
RnnForwardResult cudnn_rnn_forward(const RnnSpec& spec, const Tensor& x, const Tensor& w, const Tensor& hx,
                                   const Tensor& cx, const std::vector<int32_t>& seq_lengths, bool training);

struct RnnGrads {
  Tensor dx;        // x's shape
  Tensor dhx, dcx;  // defined when hx / cx were
  Tensor dw;        // w's shape, when asked for
};
// The gradients of a training forward's outputs y given dy (y's shape), with the same spec, x, w, hx, cx and
// seq_lengths, and the reserve it returned. The final states get no gradient (dhy = dcy = 0).
RnnGrads cudnn_rnn_backward(const RnnSpec& spec, const Tensor& x, const Tensor& w, const Tensor& hx, const Tensor& cx,
                            const Tensor& y, const Tensor& dy, const Tensor& reserve,
                            const std::vector<int32_t>& seq_lengths, bool need_dw);

// Where cuDNN keeps one weight matrix and its bias (cudnnGetRNNWeightParams) next to where singa_lite's layout has
// them, in elements from the start of the flat weight; for tests and for looking at a cuDNN version's packing.
struct RnnWeightBlock {
  int pseudo_layer = 0, lin_id = 0;  // lin_id < gates: an input matrix; else a recurrent one
  int64_t cudnn_matrix = 0, ours_matrix = 0, matrix_numel = 0;
  int64_t cudnn_bias = 0, ours_bias = 0, bias_numel = 0;
};
struct RnnWeightLayout {
  int64_t cudnn_numel = 0;  // cuDNN's weight space, in elements
  int64_t ours_numel = 0;   // rnn_weights_size
  bool same = false;        // W is given to cuDNN as it is
  std::vector<RnnWeightBlock> blocks;
};
RnnWeightLayout cudnn_rnn_weight_layout(const RnnSpec& spec, int64_t input_size, DType dtype, Device device);

}  // namespace sl::cuda
