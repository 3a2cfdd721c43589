// cuDNN RNNs (see cudnn_rnn.h): argument checks, descriptors, the weight layout, one checked call per pass.
#include "cuda/cudnn_rnn.h"

#include <algorithm>
#include <climits>
#include <cstring>

#include "core/errors.h"
#include "cuda/context.h"
#include "cuda/cudnn.h"
#include "ops/checks.h"
#include "ops/ops.h"

namespace sl::cuda {

int rnn_gates(RnnMode mode) { return mode == RnnMode::kLstm ? 4 : mode == RnnMode::kGru ? 3 : 1; }

namespace {

const char* mode_name(RnnMode m) {
  switch (m) {
    case RnnMode::kRelu: return "relu";
    case RnnMode::kTanh: return "tanh";
    case RnnMode::kLstm: return "lstm";
    case RnnMode::kGru: return "gru";
  }
  return "?";
}

cudnnRNNMode_t cell_mode(RnnMode m) {
  switch (m) {
    case RnnMode::kRelu: return CUDNN_RNN_RELU;
    case RnnMode::kTanh: return CUDNN_RNN_TANH;
    case RnnMode::kLstm: return CUDNN_LSTM;
    case RnnMode::kGru: return CUDNN_GRU;
  }
  return CUDNN_LSTM;
}

cudnnDataType_t data_type(DType t) {
  return t == DType::kFloat16 ? CUDNN_DATA_HALF : t == DType::kFloat64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
}

// float16 data is computed in float32 on tensor cores; float32 on FMA kernels only (cuDNN's default math may round
// float32 to TF32 on Ampere and later, which the CPU path does not); float64 on the default, which has no TF32.
cudnnMathType_t math_type(DType t) {
  return t == DType::kFloat16 ? CUDNN_TENSOR_OP_MATH : t == DType::kFloat32 ? CUDNN_FMA_MATH : CUDNN_DEFAULT_MATH;
}

int dirs(const RnnSpec& s) { return s.bidirectional ? 2 : 1; }

void check_spec(const char* op, const RnnSpec& s) {
  SL_CHECK(s.hidden_size >= 1 && s.hidden_size <= INT_MAX, ValueError, op, ": hidden_size must be in [1, 2^31-1], "
           "got ", s.hidden_size);
  SL_CHECK(s.num_layers >= 1 && s.num_layers <= INT_MAX, ValueError, op, ": num_layers must be >= 1, got ",
           s.num_layers);
}

void check_dtype(const char* op, DType t) {
  SL_CHECK(t == DType::kFloat16 || t == DType::kFloat32 || t == DType::kFloat64, TypeError, op,
           ": cuDNN's RNNs take float16, float32 or float64, got ", dtype_name(t),
           "; other dtypes run on the CPU path (layer.CudnnRNN chooses)");
}

// The sizes of one call, from x and the spec, checked.
struct Dims {
  int64_t T = 0, B = 0, F = 0, H = 0, L = 0, D = 1, G = 1;
};

Dims dims_of(const char* op, const RnnSpec& s, const Tensor& x) {
  check_spec(op, s);
  SL_CHECK(x.defined(), ValueError, op, ": x is undefined");
  SL_CHECK(x.device().is_cuda(), ValueError, op, ": x must be on a CUDA device, got ", x.device().str(),
           "; the CPU runs layer.CudnnRNN's own LSTM / GRU");
  check_dtype(op, x.dtype());
  SL_CHECK(x.ndim() == 3, ValueError, op, ": x must be 3-D ", s.batch_first ? "(batch, seq, features)" :
           "(seq, batch, features)", ", got shape ", shape_str(x.shape()));
  Dims d;
  d.T = x.shape()[s.batch_first ? 1 : 0];
  d.B = x.shape()[s.batch_first ? 0 : 1];
  d.F = x.shape()[2];
  d.H = s.hidden_size;
  d.L = s.num_layers;
  d.D = dirs(s);
  d.G = rnn_gates(s.mode);
  SL_CHECK(d.T >= 1 && d.B >= 1 && d.F >= 1, ValueError, op, ": x ", shape_str(x.shape()),
           " must have at least one step, one sequence and one feature");
  SL_CHECK(d.T <= INT_MAX && d.B <= INT_MAX && d.F <= INT_MAX && d.L * d.D <= INT_MAX, ValueError, op,
           ": x ", shape_str(x.shape()), " is larger than cuDNN's 32-bit sizes");
  // cuDNN indexes each tensor with 32-bit offsets: the largest one (y, or x) must fit.
  SL_CHECK(d.T * d.B * std::max(d.F, d.H * d.D) <= INT_MAX, ValueError, op, ": x ", shape_str(x.shape()),
           " with hidden ", d.H, " x ", d.D, " directions has more than 2^31-1 elements per tensor");
  return d;
}

void check_like(const char* op, const char* name, const Tensor& t, const Tensor& x) {
  SL_CHECK(t.device() == x.device(), ValueError, op, ": ", name, " is on ", t.device().str(), ", x on ",
           x.device().str());
  SL_CHECK(t.dtype() == x.dtype(), TypeError, op, ": ", name, " has dtype ", dtype_name(t.dtype()), ", x ",
           dtype_name(x.dtype()));
}

void check_state(const char* op, const char* name, const Tensor& s, const Tensor& x, const Dims& d) {
  if (!s.defined()) return;
  check_like(op, name, s, x);
  const Shape want{d.L * d.D, d.B, d.H};
  SL_CHECK(s.shape() == want, ValueError, op, ": ", name, " must have shape (num_layers * directions, batch, "
           "hidden) = ", shape_str(want), ", got ", shape_str(s.shape()));
}

void check_weight(const char* op, const RnnSpec& s, const Tensor& w, const Tensor& x, const Dims& d) {
  SL_CHECK(w.defined(), ValueError, op, ": w is undefined");
  check_like(op, "w", w, x);
  const int64_t n = rnn_weights_size(s, d.F);
  SL_CHECK(w.ndim() == 1 && w.numel() == n, ValueError, op, ": w must be the flat weight of ", n, " elements for ",
           mode_name(s.mode), " with ", d.F, " features, hidden ", d.H, ", ", d.L, " layers, ", d.D,
           " directions; got shape ", shape_str(w.shape()));
}

std::vector<int> lengths_of(const char* op, const std::vector<int32_t>& given, const Dims& d) {
  if (given.empty()) return std::vector<int>(size_t(d.B), int(d.T));
  SL_CHECK(int64_t(given.size()) == d.B, ValueError, op, ": seq_lengths has ", given.size(),
           " lengths for a batch of ", d.B);
  for (int32_t n : given)
    SL_CHECK(n >= 1 && n <= d.T, ValueError, op, ": every sequence length must be in [1, ", d.T, "], got ", n);
  return std::vector<int>(given.begin(), given.end());
}

// ----- descriptors (RAII, per call: host-side structs that cost microseconds)
struct DropoutDesc {
  cudnnDropoutDescriptor_t d = nullptr;
  explicit DropoutDesc(cudnnHandle_t h) {
    SL_CUDNN(cudnnCreateDropoutDescriptor, &d);
    try {  // dropout 0 needs no random states
      SL_CUDNN(cudnnSetDropoutDescriptor, d, h, 0.f, nullptr, 0, 0ull);
    } catch (...) {
      cudnn_api().cudnnDestroyDropoutDescriptor(d);
      throw;
    }
  }
  ~DropoutDesc() { cudnn_api().cudnnDestroyDropoutDescriptor(d); }
  DropoutDesc(const DropoutDesc&) = delete;
  DropoutDesc& operator=(const DropoutDesc&) = delete;
};

struct RnnDesc {
  cudnnRNNDescriptor_t d = nullptr;
  RnnDesc(const RnnSpec& s, DType t, int64_t input_size, cudnnDropoutDescriptor_t dropout) {
    SL_CUDNN(cudnnCreateRNNDescriptor, &d);
    try {
      const cudnnDataType_t dt = data_type(t);
      const cudnnDataType_t prec = t == DType::kFloat64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
      const int32_t H = int32_t(s.hidden_size);
      SL_CUDNN(cudnnSetRNNDescriptor_v8, d, CUDNN_RNN_ALGO_STANDARD, cell_mode(s.mode), CUDNN_RNN_DOUBLE_BIAS,
               s.bidirectional ? CUDNN_BIDIRECTIONAL : CUDNN_UNIDIRECTIONAL, CUDNN_LINEAR_INPUT, dt, prec,
               math_type(t), int32_t(input_size), H, H /* projSize = hidden: no projection */,
               int32_t(s.num_layers), dropout, kCudnnRnnPaddedIoEnabled);
    } catch (...) {
      cudnn_api().cudnnDestroyRNNDescriptor(d);
      throw;
    }
  }
  ~RnnDesc() { cudnn_api().cudnnDestroyRNNDescriptor(d); }
  RnnDesc(const RnnDesc&) = delete;
  RnnDesc& operator=(const RnnDesc&) = delete;
};

struct DataDesc {
  cudnnRNNDataDescriptor_t d = nullptr;
  DataDesc(DType t, bool batch_first, const Dims& dm, int64_t vector, const std::vector<int>& lengths) {
    SL_CUDNN(cudnnCreateRNNDataDescriptor, &d);
    try {
      double fill = 0.0;  // zero bits: 0 in every float type; what padded steps of y hold
      SL_CUDNN(cudnnSetRNNDataDescriptor, d, data_type(t),
               batch_first ? CUDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED : CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED,
               int(dm.T), int(dm.B), int(vector), lengths.data(), &fill);
    } catch (...) {
      cudnn_api().cudnnDestroyRNNDataDescriptor(d);
      throw;
    }
  }
  ~DataDesc() { cudnn_api().cudnnDestroyRNNDataDescriptor(d); }
  DataDesc(const DataDesc&) = delete;
  DataDesc& operator=(const DataDesc&) = delete;
};

// An N-d tensor descriptor: packed dims (the hidden states), or empty for cuDNN to fill (cudnnGetRNNWeightParams).
struct NdDesc {
  cudnnTensorDescriptor_t d = nullptr;
  NdDesc() { SL_CUDNN(cudnnCreateTensorDescriptor, &d); }
  NdDesc(DType t, const std::vector<int>& dims) : NdDesc() {
    std::vector<int> strides(dims.size(), 1);
    for (size_t i = dims.size() - 1; i > 0; --i) strides[i - 1] = strides[i] * dims[i];
    try {
      SL_CUDNN(cudnnSetTensorNdDescriptor, d, data_type(t), int(dims.size()), dims.data(), strides.data());
    } catch (...) {
      cudnn_api().cudnnDestroyTensorDescriptor(d);
      throw;
    }
  }
  // The element count of what cuDNN wrote into this descriptor; 0 when it wrote none.
  int64_t numel() const {
    cudnnDataType_t t{};
    int n = 0, dims[8] = {0}, strides[8] = {0};
    SL_CUDNN(cudnnGetTensorNdDescriptor, d, 8, &t, &n, dims, strides);
    if (n <= 0) return 0;
    int64_t p = 1;
    for (int i = 0; i < n && i < 8; ++i) p *= dims[i];
    return p;
  }
  ~NdDesc() { cudnn_api().cudnnDestroyTensorDescriptor(d); }
  NdDesc(const NdDesc&) = delete;
  NdDesc& operator=(const NdDesc&) = delete;
};

// Scratch memory of `bytes` from the caching allocator, as a tensor so that it goes back when dropped.
Tensor scratch(size_t bytes, Device device) {
  return Tensor::empty({int64_t((bytes + 3) / 4)}, DType::kInt32, device);
}
void* ptr_or_null(const Tensor& t) { return t.defined() && t.numel() > 0 ? t.data_ptr() : nullptr; }

// What every call shares once the arguments are checked: the device made current, its cuDNN handle (held for the
// whole call), the RNN descriptor and cuDNN's weight space size.
struct Rnn {
  const int device;
  const DType dtype;
  DeviceGuard guard;
  const CudnnHandle h;
  const DropoutDesc dropout;
  const RnnDesc rnn;
  size_t weight_bytes = 0;
  Rnn(const RnnSpec& s, DType t, Device dev, int64_t input_size)
      : device(dev.index),
        dtype(t),
        guard(dev.index),
        h(cudnn_handle(dev.index)),
        dropout(h),
        rnn(s, t, input_size, dropout.d) {
    SL_CUDNN(cudnnGetRNNWeightSpaceSize, h, rnn.d, &weight_bytes);
  }
};

// singa_lite's layout next to cuDNN's, asked of cudnnGetRNNWeightParams with `base` standing for the weight space
// (cuDNN only adds offsets to it).
RnnWeightLayout weight_layout(const Rnn& r, const RnnSpec& s, int64_t input_size, const void* base) {
  RnnWeightLayout out;
  const int64_t G = rnn_gates(s.mode), H = s.hidden_size, D = dirs(s), isz = int64_t(itemsize(r.dtype));
  out.ours_numel = rnn_weights_size(s, input_size);
  SL_CHECK(r.weight_bytes % size_t(isz) == 0, InternalError, "cuDNN's RNN weight space (", r.weight_bytes,
           " bytes) is not a whole number of ", dtype_name(r.dtype), " elements");
  out.cudnn_numel = int64_t(r.weight_bytes) / isz;
  out.same = out.cudnn_numel == out.ours_numel;
  NdDesc m, b;
  int64_t off = 0;  // the pseudo-layer's start in our layout
  for (int64_t p = 0; p < s.num_layers * D; ++p) {
    const int64_t n_in = p < D ? input_size : H * D;
    for (int64_t lin = 0; lin < 2 * G; ++lin) {
      RnnWeightBlock blk;
      blk.pseudo_layer = int(p);
      blk.lin_id = int(lin);
      blk.ours_matrix = lin < G ? off + lin * H * n_in : off + G * H * n_in + (lin - G) * H * H;
      blk.ours_bias = off + G * H * (n_in + H) + lin * H;
      blk.matrix_numel = lin < G ? H * n_in : H * H;
      blk.bias_numel = H;
      void* maddr = nullptr;
      void* baddr = nullptr;
      SL_CUDNN(cudnnGetRNNWeightParams, r.h, r.rnn.d, int32_t(p), r.weight_bytes, base, int32_t(lin), m.d, &maddr,
               b.d, &baddr);
      SL_CHECK(maddr && baddr, InternalError, "cudnnGetRNNWeightParams gave no matrix or bias for pseudo-layer ", p,
               ", linear layer ", lin, " of a ", mode_name(s.mode), " with biases");
      const int64_t mn = m.numel(), bn = b.numel();
      SL_CHECK(mn == blk.matrix_numel && bn == blk.bias_numel, InternalError, "cuDNN's RNN weight of pseudo-layer ",
               p, ", linear layer ", lin, " has ", mn, " + ", bn, " elements, expected ", blk.matrix_numel, " + ",
               blk.bias_numel);
      const auto offset = [&](const void* a) {
        const std::ptrdiff_t bytes = static_cast<const char*>(a) - static_cast<const char*>(base);
        SL_CHECK(bytes >= 0 && bytes % isz == 0, InternalError, "cuDNN put an RNN weight at byte ", bytes,
                 " of its weight space, not on an element");
        return int64_t(bytes) / isz;
      };
      blk.cudnn_matrix = offset(maddr);
      blk.cudnn_bias = offset(baddr);
      SL_CHECK(blk.cudnn_matrix + mn <= out.cudnn_numel && blk.cudnn_bias + bn <= out.cudnn_numel, InternalError,
               "cuDNN put an RNN weight past the end of its weight space");
      out.same = out.same && blk.cudnn_matrix == blk.ours_matrix && blk.cudnn_bias == blk.ours_bias;
      out.blocks.push_back(blk);
    }
    off += G * H * (n_in + H) + 2 * G * H;
  }
  return out;
}

Tensor flat(const Tensor& t, int64_t start, int64_t n) { return t.slice(0, start, start + n, 1); }

// W (our layout) -> a weight space of cuDNN's size, block by block; unused bytes zero.
Tensor pack(const RnnWeightLayout& l, const Tensor& w) {
  Tensor ws = Tensor::empty({l.cudnn_numel}, w.dtype(), w.device());
  ::sl::fill_(ws, 0.0);
  for (const RnnWeightBlock& b : l.blocks) {
    ::sl::copy_(flat(ws, b.cudnn_matrix, b.matrix_numel), flat(w, b.ours_matrix, b.matrix_numel));
    ::sl::copy_(flat(ws, b.cudnn_bias, b.bias_numel), flat(w, b.ours_bias, b.bias_numel));
  }
  return ws;
}

// A weight space of cuDNN's layout -> our layout (every element of ours belongs to one block).
Tensor unpack(const RnnWeightLayout& l, const Tensor& ws) {
  Tensor w = Tensor::empty({l.ours_numel}, ws.dtype(), ws.device());
  for (const RnnWeightBlock& b : l.blocks) {
    ::sl::copy_(flat(w, b.ours_matrix, b.matrix_numel), flat(ws, b.cudnn_matrix, b.matrix_numel));
    ::sl::copy_(flat(w, b.ours_bias, b.bias_numel), flat(ws, b.cudnn_bias, b.bias_numel));
  }
  return w;
}

// Everything a forward or backward call describes: the Rnn, the data and state descriptors, the lengths on the
// host and on the device (cuDNN reads them from both), and the weight layout.
struct Call {
  const Dims dm;
  Rnn r;
  const std::vector<int> lengths;
  const DataDesc x, y;
  const NdDesc h;  // hx, hy, cx, cy: (L * D, B, H)
  Tensor dev_lengths;
  RnnWeightLayout layout;
  Call(const RnnSpec& s, const Tensor& xt, const Tensor& w, const Dims& d, const std::vector<int>& lens)
      : dm(d),
        r(s, xt.dtype(), xt.device(), d.F),
        lengths(lens),
        x(xt.dtype(), s.batch_first, d, d.F, lengths),
        y(xt.dtype(), s.batch_first, d, d.H * d.D, lengths),
        h(xt.dtype(), {int(d.L * d.D), int(d.B), int(d.H)}) {
    Tensor host = Tensor::empty({d.B}, DType::kInt32, Device::cpu());
    std::memcpy(host.data_ptr(), lengths.data(), lengths.size() * sizeof(int));
    dev_lengths = host.to(xt.device());
    layout = weight_layout(r, s, d.F, w.data_ptr());
  }
  const int32_t* seq() const { return dev_lengths.data<int32_t>(); }
};

Shape y_shape(const RnnSpec& s, const Dims& d) {
  return s.batch_first ? Shape{d.B, d.T, d.H * d.D} : Shape{d.T, d.B, d.H * d.D};
}

}  // namespace

int64_t rnn_weights_size(const RnnSpec& s, int64_t input_size) {
  const int64_t G = rnn_gates(s.mode), H = s.hidden_size, D = dirs(s);
  int64_t n = 0;
  for (int64_t layer = 0; layer < s.num_layers; ++layer) {
    const int64_t n_in = layer == 0 ? input_size : H * D;
    n += D * (G * H * (n_in + H) + 2 * G * H);
  }
  return n;
}

RnnForwardResult cudnn_rnn_forward(const RnnSpec& spec, const Tensor& x, const Tensor& w, const Tensor& hx,
                                   const Tensor& cx, const std::vector<int32_t>& seq_lengths, bool training) {
  const char* op = "cudnn_rnn_forward";
  const Dims d = dims_of(op, spec, x);
  check_weight(op, spec, w, x, d);
  check_state(op, "hx", hx, x, d);
  check_state(op, "cx", cx, x, d);
  SL_CHECK(!cx.defined() || spec.mode == RnnMode::kLstm, ValueError, op, ": cx is the LSTM's cell state; a ",
           mode_name(spec.mode), " has none");
  const std::vector<int> lengths = lengths_of(op, seq_lengths, d);
  const Tensor xc = x.contiguous(), wc = w.contiguous();
  const Tensor hxc = hx.defined() ? hx.contiguous() : Tensor(), cxc = cx.defined() ? cx.contiguous() : Tensor();
  const DType t = x.dtype();
  const Device dev = x.device();
  Call c(spec, xc, wc, d, lengths);
  const Tensor ws_w = c.layout.same ? wc : pack(c.layout, wc);

  RnnForwardResult out;
  out.y = Tensor::empty(y_shape(spec, d), t, dev);
  out.hy = Tensor::empty({d.L * d.D, d.B, d.H}, t, dev);
  if (spec.mode == RnnMode::kLstm) out.cy = Tensor::empty({d.L * d.D, d.B, d.H}, t, dev);
  const cudnnForwardMode_t mode = training ? CUDNN_FWD_MODE_TRAINING : CUDNN_FWD_MODE_INFERENCE;
  size_t work_bytes = 0, reserve_bytes = 0;
  SL_CUDNN(cudnnGetRNNTempSpaceSizes, c.r.h, c.r.rnn.d, mode, c.x.d, &work_bytes, &reserve_bytes);
  const Tensor work = scratch(work_bytes, dev);
  if (training) out.reserve = scratch(reserve_bytes, dev);
  // Writes only its outputs (and the fresh reserve): may be repeated when cuDNN's own allocation failed.
  SL_CUDNN_ON(c.r.device, cudnnRNNForward, c.r.h, c.r.rnn.d, mode, c.seq(), c.x.d, xc.data_ptr(), c.y.d,
              out.y.data_ptr(), c.h.d, ptr_or_null(hxc), out.hy.data_ptr(), c.h.d, ptr_or_null(cxc),
              ptr_or_null(out.cy), c.r.weight_bytes, ws_w.data_ptr(), work_bytes, ptr_or_null(work),
              training ? reserve_bytes : 0, training ? ptr_or_null(out.reserve) : nullptr);
  return out;
}

RnnGrads cudnn_rnn_backward(const RnnSpec& spec, const Tensor& x, const Tensor& w, const Tensor& hx, const Tensor& cx,
                            const Tensor& y, const Tensor& dy, const Tensor& reserve,
                            const std::vector<int32_t>& seq_lengths, bool need_dw) {
  const char* op = "cudnn_rnn_backward";
  const Dims d = dims_of(op, spec, x);
  check_weight(op, spec, w, x, d);
  check_state(op, "hx", hx, x, d);
  check_state(op, "cx", cx, x, d);
  SL_CHECK(!cx.defined() || spec.mode == RnnMode::kLstm, ValueError, op, ": cx is the LSTM's cell state; a ",
           mode_name(spec.mode), " has none");
  const Shape ys = y_shape(spec, d);
  for (const auto& [name, given] : {std::pair<const char*, const Tensor*>{"y", &y}, {"dy", &dy}}) {
    SL_CHECK(given->defined(), ValueError, op, ": ", name, " is undefined");
    check_like(op, name, *given, x);
    SL_CHECK(given->shape() == ys, ValueError, op, ": ", name, " must have shape ", shape_str(ys), ", got ",
             shape_str(given->shape()));
  }
  SL_CHECK(reserve.defined() && reserve.dtype() == DType::kInt32 && reserve.device() == x.device() &&
               reserve.ndim() == 1 && reserve.is_contiguous(),
           ValueError, op, ": reserve must be what cudnn_rnn_forward(training=True) returned for this call");
  const std::vector<int> lengths = lengths_of(op, seq_lengths, d);
  const Tensor xc = x.contiguous(), wc = w.contiguous(), yc = y.contiguous(), dyc = dy.contiguous();
  const Tensor hxc = hx.defined() ? hx.contiguous() : Tensor(), cxc = cx.defined() ? cx.contiguous() : Tensor();
  const DType t = x.dtype();
  const Device dev = x.device();
  Call c(spec, xc, wc, d, lengths);
  const Tensor ws_w = c.layout.same ? wc : pack(c.layout, wc);
  size_t work_bytes = 0, reserve_bytes = 0;
  SL_CUDNN(cudnnGetRNNTempSpaceSizes, c.r.h, c.r.rnn.d, CUDNN_FWD_MODE_TRAINING, c.x.d, &work_bytes, &reserve_bytes);
  SL_CHECK(reserve.nbytes() >= reserve_bytes, ValueError, op, ": reserve has ", reserve.nbytes(), " bytes, this "
           "call needs ", reserve_bytes, "; pass the reserve of the training forward with the same arguments");
  const Tensor work = scratch(work_bytes, dev);

  RnnGrads g;
  g.dx = Tensor::empty(x.shape(), t, dev);
  if (hx.defined()) g.dhx = Tensor::empty(hx.shape(), t, dev);
  if (cx.defined()) g.dcx = Tensor::empty(cx.shape(), t, dev);
  // Not repeated on failure: the reserve is read and written. dhy = dcy = 0 (NULL): y is the only output used.
  SL_CUDNN(cudnnRNNBackwardData_v8, c.r.h, c.r.rnn.d, c.seq(), c.y.d, yc.data_ptr(), dyc.data_ptr(), c.x.d,
           g.dx.data_ptr(), c.h.d, ptr_or_null(hxc), nullptr, ptr_or_null(g.dhx), c.h.d, ptr_or_null(cxc), nullptr,
           ptr_or_null(g.dcx), c.r.weight_bytes, ws_w.data_ptr(), work_bytes, ptr_or_null(work), reserve_bytes,
           ptr_or_null(reserve));
  if (need_dw) {
    // cuDNN adds the weight gradient to dweightSpace (CUDNN_WGRAD_MODE_ADD): it starts at zero.
    Tensor dws = Tensor::empty({c.layout.cudnn_numel}, t, dev);
    ::sl::fill_(dws, 0.0);
    SL_CUDNN(cudnnRNNBackwardWeights_v8, c.r.h, c.r.rnn.d, CUDNN_WGRAD_MODE_ADD, c.seq(), c.x.d, xc.data_ptr(),
             c.h.d, ptr_or_null(hxc), c.y.d, yc.data_ptr(), c.r.weight_bytes, dws.data_ptr(), work_bytes,
             ptr_or_null(work), reserve_bytes, ptr_or_null(reserve));
    g.dw = (c.layout.same ? dws : unpack(c.layout, dws)).view(w.shape());
  }
  return g;
}

RnnWeightLayout cudnn_rnn_weight_layout(const RnnSpec& spec, int64_t input_size, DType dtype, Device device) {
  const char* op = "cudnn_rnn_weight_layout";
  check_spec(op, spec);
  check_dtype(op, dtype);
  SL_CHECK(device.is_cuda(), ValueError, op, ": expected a CUDA device, got ", device.str());
  SL_CHECK(input_size >= 1 && input_size <= INT_MAX, ValueError, op, ": input_size must be in [1, 2^31-1], got ",
           input_size);
  Rnn r(spec, dtype, device, input_size);
  // cuDNN only adds offsets to the base; a real weight space keeps the call as the ops make it.
  const Tensor space = scratch(r.weight_bytes, device);
  return weight_layout(r, spec, input_size, space.data_ptr());
}

}  // namespace sl::cuda
