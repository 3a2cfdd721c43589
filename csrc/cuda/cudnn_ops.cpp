// cuDNN convolution, pooling and batch norm (see cudnn_ops.h): argument checks, descriptors, one checked call each.
#include "cuda/cudnn_ops.h"

#include <climits>

#include "core/errors.h"
#include "cuda/allocator.h"
#include "cuda/context.h"
#include "cuda/conv_plan.h"
#include "cuda/cudnn.h"
#include "ops/checks.h"

namespace sl::cuda {
namespace {

// ----- checks (all before the first cuDNN call)
// A 4-D NCHW CUDA tensor of a dtype cuDNN takes, small enough for the 32-bit dimensions and strides of cuDNN's
// legacy descriptors.
void check_4d(const char* op, const char* name, const Tensor& t) {
  SL_CHECK(t.defined(), ValueError, op, ": ", name, " is undefined");
  SL_CHECK(t.device().is_cuda(), ValueError, op, ": ", name, " must be on a CUDA device, got ", t.device().str(),
           "; the CPU runs the own kernels (singa_lite.autograd's operators choose)");
  SL_CHECK(t.dtype() == DType::kFloat16 || t.dtype() == DType::kFloat32 || t.dtype() == DType::kFloat64, TypeError,
           op, ": ", name, " must be float16, float32 or float64, got ", dtype_name(t.dtype()));
  SL_CHECK(t.ndim() == 4, ValueError, op, ": ", name, " must be 4-D (NCHW), got shape ", shape_str(t.shape()));
  SL_CHECK(t.numel() > 0 && t.numel() <= INT_MAX, ValueError, op, ": ", name, " has ", t.numel(),
           " elements; cuDNN's descriptors take 1 to 2^31-1 (larger tensors run on the own kernels)");
}

void check_like(const char* op, const char* name, const Tensor& t, const Tensor& ref) {
  SL_CHECK(t.defined(), ValueError, op, ": ", name, " is undefined");
  SL_CHECK(t.device() == ref.device(), ValueError, op, ": ", name, " is on ", t.device().str(), ", expected ",
           ref.device().str());
  SL_CHECK(t.dtype() == ref.dtype(), TypeError, op, ": ", name, " has dtype ", dtype_name(t.dtype()), ", expected ",
           dtype_name(ref.dtype()));
}

void check_pair(const char* op, const char* what, Pair v, int64_t min) {
  SL_CHECK(v[0] >= min && v[1] >= min && v[0] <= INT_MAX && v[1] <= INT_MAX, ValueError, op, ": ", what,
           " must be >= ", min, ", got (", v[0], ", ", v[1], ")");
}

int64_t out_size(const char* op, int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
  const int64_t span = d * (k - 1) + 1;
  SL_CHECK(in + 2 * p >= span, ValueError, op, ": the padded input (", in, " + 2*", p,
           ") is smaller than the kernel's extent ", span);
  return (in + 2 * p - span) / s + 1;
}

// Checks the convolution's arguments against x's and w's shapes; returns y's shape.
Shape conv_out_shape(const char* op, const Shape& x, const Shape& w, Pair stride, Pair padding, Pair dilation,
                     int64_t groups) {
  SL_CHECK(x.size() == 4 && w.size() == 4, ValueError, op, ": expected 4-D x and w, got ", shape_str(x), " and ",
           shape_str(w));
  check_pair(op, "stride", stride, 1);
  check_pair(op, "padding", padding, 0);
  check_pair(op, "dilation", dilation, 1);
  SL_CHECK(groups >= 1 && x[1] % groups == 0 && w[0] % groups == 0 && w[1] * groups == x[1], ValueError, op,
           ": x ", shape_str(x), " and w ", shape_str(w), " do not fit groups=", groups,
           " (need C = w.shape[1] * groups, both C and OC divisible by groups)");
  return {x[0], w[0], out_size(op, x[2], w[2], stride[0], padding[0], dilation[0]),
          out_size(op, x[3], w[3], stride[1], padding[1], dilation[1])};
}

// ----- descriptors (RAII; per call, see cudnn_ops.h)
cudnnDataType_t data_type(DType t) {
  return t == DType::kFloat16 ? CUDNN_DATA_HALF : t == DType::kFloat64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
}
// Computation, scaling factors and batch-norm parameters: double for double data, float otherwise.
DType param_dtype(DType t) { return t == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32; }

struct TensorDesc {
  cudnnTensorDescriptor_t d = nullptr;
  TensorDesc(DType dtype, int64_t n, int64_t c, int64_t h, int64_t w) {
    SL_CUDNN(cudnnCreateTensorDescriptor, &d);
    try {  // packed NCHW: every tensor given to cuDNN is made contiguous first
      SL_CUDNN(cudnnSetTensor4dDescriptorEx, d, data_type(dtype), int(n), int(c), int(h), int(w), int(c * h * w),
               int(h * w), int(w), 1);
    } catch (...) {
      cudnn_api().cudnnDestroyTensorDescriptor(d);
      throw;
    }
  }
  TensorDesc(DType dtype, const Shape& s) : TensorDesc(dtype, s[0], s[1], s[2], s[3]) {}
  ~TensorDesc() { cudnn_api().cudnnDestroyTensorDescriptor(d); }
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
};

struct FilterDesc {
  cudnnFilterDescriptor_t d = nullptr;
  FilterDesc(DType dtype, const Shape& s) {
    SL_CUDNN(cudnnCreateFilterDescriptor, &d);
    try {
      SL_CUDNN(cudnnSetFilter4dDescriptor, d, data_type(dtype), CUDNN_TENSOR_NCHW, int(s[0]), int(s[1]), int(s[2]),
               int(s[3]));
    } catch (...) {
      cudnn_api().cudnnDestroyFilterDescriptor(d);
      throw;
    }
  }
  ~FilterDesc() { cudnn_api().cudnnDestroyFilterDescriptor(d); }
  FilterDesc(const FilterDesc&) = delete;
  FilterDesc& operator=(const FilterDesc&) = delete;
};

cudnnMathType_t math_type(DType t) {
  // float16: tensor cores, accumulating in the float32 compute type. float32: FMA kernels only, so that it is never
  // rounded to TF32 (cuDNN's DEFAULT_MATH allows TF32 on Ampere and later). float64: DEFAULT_MATH, which has no TF32
  // for doubles; FMA_MATH is documented for float data, and PyTorch too keeps doubles on the default.
  return t == DType::kFloat16 ? CUDNN_TENSOR_OP_MATH : t == DType::kFloat32 ? CUDNN_FMA_MATH : CUDNN_DEFAULT_MATH;
}

struct ConvDesc {
  cudnnConvolutionDescriptor_t d = nullptr;
  cudnnMathType_t math;
  ConvDesc(DType dtype, Pair stride, Pair padding, Pair dilation, int64_t groups) : math(math_type(dtype)) {
    SL_CUDNN(cudnnCreateConvolutionDescriptor, &d);
    try {
      // CROSS_CORRELATION: the kernel is not flipped, as in the CPU op (and every framework's "convolution").
      SL_CUDNN(cudnnSetConvolution2dDescriptor, d, int(padding[0]), int(padding[1]), int(stride[0]), int(stride[1]),
               int(dilation[0]), int(dilation[1]), CUDNN_CROSS_CORRELATION, data_type(param_dtype(dtype)));
      SL_CUDNN(cudnnSetConvolutionGroupCount, d, int(groups));
      SL_CUDNN(cudnnSetConvolutionMathType, d, math);
    } catch (...) {
      cudnn_api().cudnnDestroyConvolutionDescriptor(d);
      throw;
    }
  }
  ~ConvDesc() { cudnn_api().cudnnDestroyConvolutionDescriptor(d); }
  ConvDesc(const ConvDesc&) = delete;
  ConvDesc& operator=(const ConvDesc&) = delete;
};

struct PoolDesc {
  cudnnPoolingDescriptor_t d = nullptr;
  PoolDesc(PoolMode mode, Pair kernel, Pair stride, Pair padding) {
    // MAX_DETERMINISTIC: each window's gradient goes to one position, the same on every run (plain MAX may use
    // atomics across overlapping windows). PROPAGATE_NAN: a NaN in a window is its maximum, as on the CPU.
    const cudnnPoolingMode_t m = mode == PoolMode::kMax             ? CUDNN_POOLING_MAX_DETERMINISTIC
                                 : mode == PoolMode::kAvgIncludePad ? CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING
                                                                    : CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING;
    SL_CUDNN(cudnnCreatePoolingDescriptor, &d);
    try {
      SL_CUDNN(cudnnSetPooling2dDescriptor, d, m, CUDNN_PROPAGATE_NAN, int(kernel[0]), int(kernel[1]),
               int(padding[0]), int(padding[1]), int(stride[0]), int(stride[1]));
    } catch (...) {
      cudnn_api().cudnnDestroyPoolingDescriptor(d);
      throw;
    }
  }
  ~PoolDesc() { cudnn_api().cudnnDestroyPoolingDescriptor(d); }
  PoolDesc(const PoolDesc&) = delete;
  PoolDesc& operator=(const PoolDesc&) = delete;
};

// alpha = 1, beta = 0 in the type cuDNN reads them as (double for double data, float otherwise).
struct Blend {
  float f1 = 1.f, f0 = 0.f;
  double d1 = 1.0, d0 = 0.0;
  const void* one(DType t) const { return t == DType::kFloat64 ? static_cast<const void*>(&d1) : &f1; }
  const void* zero(DType t) const { return t == DType::kFloat64 ? static_cast<const void*>(&d0) : &f0; }
};

// The candidates of one convolution, best first: the heuristic's list (cudnnGetConvolution*Algorithm_v7, no timing
// runs) of those that succeeded, are deterministic where asked, are not tensor-core variants for float32 / float64,
// and whose workspace query succeeds with our descriptors (math type included); then `fallback`, which supports every
// geometry of the legacy API, unless listed already. When nothing else qualifies, the fallback's workspace query is
// checked, so a configuration cuDNN cannot do raises CudaError naming the call (workspace_call). Asked once per key
// (conv_plan.h).
template <typename Algo, typename Query, typename WorkspaceQuery>
std::vector<AlgoChoice> conv_candidates(Query query, WorkspaceQuery workspace, const char* workspace_call,
                                        DType dtype, bool deterministic, Algo fallback) {
  CudnnAlgoPerf<Algo> perf[8];
  int n = 0;
  query(8, &n, perf);
  std::vector<AlgoChoice> out;
  bool has_fallback = false;
  for (int i = 0; i < n && i < 8; ++i) {
    const CudnnAlgoPerf<Algo>& p = perf[i];
    const bool tensor_op = p.mathType == CUDNN_TENSOR_OP_MATH || p.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
    if (p.status != CUDNN_STATUS_SUCCESS || (deterministic && p.determinism != CUDNN_DETERMINISTIC) ||
        (tensor_op && dtype != DType::kFloat16))
      continue;
    bool seen = false;  // the list may name an algorithm twice (once per math type)
    for (const AlgoChoice& c : out) seen = seen || c.algo == int(p.algo);
    size_t bytes = 0;
    if (seen || workspace(p.algo, &bytes) != CUDNN_STATUS_SUCCESS) continue;
    out.push_back({int(p.algo), bytes});
    has_fallback = has_fallback || p.algo == fallback;
  }
  if (!has_fallback) {
    size_t bytes = 0;
    const cudnnStatus_t st = workspace(fallback, &bytes);
    if (out.empty()) cudnn_check(st, workspace_call, __FILE__, __LINE__);
    if (st == CUDNN_STATUS_SUCCESS) out.push_back({int(fallback), bytes});
  }
  return out;
}

ConvPlanCache& conv_plans() {
  static auto* cache = new ConvPlanCache();  // never destroyed: convolutions may run during interpreter exit
  return *cache;
}

ConvKey conv_key(int device, DType dtype, ConvDirection direction, const Shape& xs, const Shape& ws, Pair stride,
                 Pair padding, Pair dilation, int64_t groups) {
  ConvKey k;
  k.device = device;
  k.dtype = int(dtype);
  k.direction = direction;
  for (int i = 0; i < 4; ++i) {
    k.x[size_t(i)] = xs[size_t(i)];
    k.w[size_t(i)] = ws[size_t(i)];
  }
  k.stride = {stride[0], stride[1]};
  k.padding = {padding[0], padding[1]};
  k.dilation = {dilation[0], dilation[1]};
  k.groups = groups;
  return k;
}

// Runs one convolution call with the first candidate that fits (conv_plan.h, run_first_fitting): its workspace from
// the caching allocator (which empties its cache and retries before giving up), then call(algo, workspace, bytes);
// when it fails inside cuDNN for lack of memory the cache is emptied and the call repeated once (it only writes its
// output). Lack of memory moves on to the next candidate; any other failure raises CudaError naming `call_name`.
template <typename Call>
void run_conv(const char* op, const char* call_name, int device, const std::vector<AlgoChoice>& plans, Call&& call) {
  run_first_fitting(plans, [&](const AlgoChoice& c) {
    void* ws = nullptr;
    if (c.workspace) {
      try {
        ws = allocate(device, c.workspace);
      } catch (const OutOfMemory&) {
        return false;
      }
    }
    // Back to the allocator once the call is queued: later work on the same stream runs after cuDNN's kernels.
    struct Release {
      int device;
      void* p;
      size_t n;
      ~Release() {
        if (p) release(device, p, n);
      }
    } held{device, ws, c.workspace};
    const cudnnStatus_t st = retry_if_out_of_memory(device, [&] { return call(c.algo, ws, c.workspace); },
                                                    cudnn_out_of_memory);
    // Still short of memory with the cache emptied: the next candidate may need less. Any other failure (an
    // execution failure that repeated) is reported as it is, not taken for lack of memory.
    if (st == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED) return false;
    cudnn_check(st, call_name, __FILE__, __LINE__);
    return true;
  }, op, device);
}

// What the three directions of a convolution y = conv(x, w) share, set up after the arguments were checked: the
// device made current, its cuDNN handle and the descriptors of x, w, y (in backward_data x and y stand for dx and dy,
// in backward_filter w stands for dw) and of the convolution.
struct Conv {
  const int device;
  const DType dtype;
  DeviceGuard guard;
  const CudnnHandle h;  // held (exclusively) for the whole call
  const TensorDesc x, y;
  const FilterDesc w;
  const ConvDesc conv;
  const CudnnApi& api;
  const Blend blend;  // alpha = 1, beta = 0
  Conv(int dev, DType t, const Shape& xs, const Shape& ws, const Shape& ys, Pair stride, Pair padding, Pair dilation,
       int64_t groups)
      : device(dev),
        dtype(t),
        guard(dev),
        h(cudnn_handle(dev)),
        x(t, xs),
        y(t, ys),
        w(t, ws),
        conv(t, stride, padding, dilation, groups),
        api(cudnn_api()) {}
  const void* one() const { return blend.one(dtype); }
  const void* zero() const { return blend.zero(dtype); }
};

// The candidates of one direction of the convolution c describes, from the cache or (once per key) from cuDNN's
// heuristic: conv_candidates with that direction's query, workspace query and fallback.
std::vector<AlgoChoice> plans_for(const Conv& c, ConvDirection dir, const Shape& xs, const Shape& ws, Pair stride,
                                  Pair padding, Pair dilation, int64_t groups) {
  return conv_plans().get(conv_key(c.device, c.dtype, dir, xs, ws, stride, padding, dilation, groups), [&] {
    switch (dir) {
      case ConvDirection::kForward:
        return conv_candidates(
            [&](int req, int* n, cudnnConvolutionFwdAlgoPerf_t* p) {
              SL_CUDNN(cudnnGetConvolutionForwardAlgorithm_v7, c.h, c.x.d, c.w.d, c.conv.d, c.y.d, req, n, p);
            },
            [&](cudnnConvolutionFwdAlgo_t algo, size_t* bytes) {
              return c.api.cudnnGetConvolutionForwardWorkspaceSize(c.h, c.x.d, c.w.d, c.conv.d, c.y.d, algo, bytes);
            },
            // deterministic too: a run repeats bit for bit (docs/gpu.md), forward included
            "cudnnGetConvolutionForwardWorkspaceSize", c.dtype, true, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM);
      case ConvDirection::kBackwardData:
        return conv_candidates(
            [&](int req, int* n, cudnnConvolutionBwdDataAlgoPerf_t* p) {
              SL_CUDNN(cudnnGetConvolutionBackwardDataAlgorithm_v7, c.h, c.w.d, c.y.d, c.conv.d, c.x.d, req, n, p);
            },
            [&](cudnnConvolutionBwdDataAlgo_t algo, size_t* bytes) {
              return c.api.cudnnGetConvolutionBackwardDataWorkspaceSize(c.h, c.w.d, c.y.d, c.conv.d, c.x.d, algo,
                                                                        bytes);
            },
            "cudnnGetConvolutionBackwardDataWorkspaceSize", c.dtype, true, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1);
      case ConvDirection::kBackwardFilter:
        break;
    }
    return conv_candidates(
        [&](int req, int* n, cudnnConvolutionBwdFilterAlgoPerf_t* p) {
          SL_CUDNN(cudnnGetConvolutionBackwardFilterAlgorithm_v7, c.h, c.x.d, c.y.d, c.conv.d, c.w.d, req, n, p);
        },
        [&](cudnnConvolutionBwdFilterAlgo_t algo, size_t* bytes) {
          return c.api.cudnnGetConvolutionBackwardFilterWorkspaceSize(c.h, c.x.d, c.y.d, c.conv.d, c.w.d, algo, bytes);
        },
        "cudnnGetConvolutionBackwardFilterWorkspaceSize", c.dtype, true, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1);
  });
}

// Both backward directions: dy must have the shape the forward convolution gives.
void check_dy(const char* op, const Tensor& dy, const Shape& ys, const Shape& x_shape, const Shape& w_shape) {
  SL_CHECK(ys == dy.shape(), ValueError, op, ": dy has shape ", shape_str(dy.shape()), ", expected ", shape_str(ys),
           " for x ", shape_str(x_shape), " and w ", shape_str(w_shape));
}

void check_bn(const char* op, const Tensor& x, std::initializer_list<std::pair<const char*, const Tensor*>> params) {
  check_4d(op, "x", x);
  for (const auto& [name, t] : params) {
    check_like(op, name, *t, x);
    SL_CHECK(t->shape() == Shape{x.shape()[1]}, ValueError, op, ": ", name, " must have shape (", x.shape()[1],
             ",) for x ", shape_str(x.shape()), ", got ", shape_str(t->shape()));
  }
}

// A [C] parameter as cuDNN wants it: contiguous, float (double for double data).
Tensor as_param(const Tensor& t, DType pdtype) { return t.dtype() == pdtype ? t.contiguous() : t.cast(pdtype); }

}  // namespace

Tensor cudnn_conv2d_forward(const Tensor& x, const Tensor& w, Pair stride, Pair padding, Pair dilation,
                            int64_t groups) {
  const char* op = "cudnn_conv2d_forward";
  check_4d(op, "x", x);
  check_4d(op, "w", w);
  check_like(op, "w", w, x);
  const Shape ys = conv_out_shape(op, x.shape(), w.shape(), stride, padding, dilation, groups);
  const Tensor xc = x.contiguous(), wc = w.contiguous();
  Tensor y = Tensor::empty(ys, x.dtype(), x.device());
  const Conv c(x.device().index, x.dtype(), x.shape(), w.shape(), ys, stride, padding, dilation, groups);
  const auto plans = plans_for(c, ConvDirection::kForward, x.shape(), w.shape(), stride, padding, dilation, groups);
  run_conv(op, "cudnnConvolutionForward", c.device, plans, [&](int algo, void* ws, size_t bytes) {
    return c.api.cudnnConvolutionForward(c.h, c.one(), c.x.d, xc.data_ptr(), c.w.d, wc.data_ptr(), c.conv.d,
                                         cudnnConvolutionFwdAlgo_t(algo), ws, bytes, c.zero(), c.y.d, y.data_ptr());
  });
  return y;
}

Tensor cudnn_conv2d_backward_data(const Tensor& w, const Tensor& dy, const Shape& x_shape, Pair stride, Pair padding,
                                  Pair dilation, int64_t groups) {
  const char* op = "cudnn_conv2d_backward_data";
  check_4d(op, "dy", dy);
  check_4d(op, "w", w);
  check_like(op, "w", w, dy);
  const Shape ys = conv_out_shape(op, x_shape, w.shape(), stride, padding, dilation, groups);
  check_dy(op, dy, ys, x_shape, w.shape());
  const Tensor dyc = dy.contiguous(), wc = w.contiguous();
  Tensor dx = Tensor::empty(x_shape, dy.dtype(), dy.device());
  const Conv c(dy.device().index, dy.dtype(), x_shape, w.shape(), ys, stride, padding, dilation, groups);
  const auto plans = plans_for(c, ConvDirection::kBackwardData, x_shape, w.shape(), stride, padding, dilation, groups);
  run_conv(op, "cudnnConvolutionBackwardData", c.device, plans, [&](int algo, void* ws, size_t bytes) {
    return c.api.cudnnConvolutionBackwardData(c.h, c.one(), c.w.d, wc.data_ptr(), c.y.d, dyc.data_ptr(), c.conv.d,
                                              cudnnConvolutionBwdDataAlgo_t(algo), ws, bytes, c.zero(), c.x.d,
                                              dx.data_ptr());
  });
  return dx;
}

Tensor cudnn_conv2d_backward_filter(const Tensor& x, const Tensor& dy, const Shape& w_shape, Pair stride,
                                    Pair padding, Pair dilation, int64_t groups) {
  const char* op = "cudnn_conv2d_backward_filter";
  check_4d(op, "x", x);
  check_4d(op, "dy", dy);
  check_like(op, "dy", dy, x);
  const Shape ys = conv_out_shape(op, x.shape(), w_shape, stride, padding, dilation, groups);
  check_dy(op, dy, ys, x.shape(), w_shape);
  const Tensor xc = x.contiguous(), dyc = dy.contiguous();
  Tensor dw = Tensor::empty(w_shape, x.dtype(), x.device());
  const Conv c(x.device().index, x.dtype(), x.shape(), w_shape, ys, stride, padding, dilation, groups);
  const auto plans = plans_for(c, ConvDirection::kBackwardFilter, x.shape(), w_shape, stride, padding, dilation, groups);
  run_conv(op, "cudnnConvolutionBackwardFilter", c.device, plans, [&](int algo, void* ws, size_t bytes) {
    return c.api.cudnnConvolutionBackwardFilter(c.h, c.one(), c.x.d, xc.data_ptr(), c.y.d, dyc.data_ptr(), c.conv.d,
                                                cudnnConvolutionBwdFilterAlgo_t(algo), ws, bytes, c.zero(), c.w.d,
                                                dw.data_ptr());
  });
  return dw;
}

namespace {

Shape pool_out_shape(const char* op, const Shape& x, Pair kernel, Pair stride, Pair padding) {
  check_pair(op, "kernel", kernel, 1);
  check_pair(op, "stride", stride, 1);
  check_pair(op, "padding", padding, 0);
  SL_CHECK(2 * padding[0] <= kernel[0] && 2 * padding[1] <= kernel[1], ValueError, op, ": padding (", padding[0],
           ", ", padding[1], ") must be at most half the kernel (", kernel[0], ", ", kernel[1], ")");
  return {x[0], x[1], out_size(op, x[2], kernel[0], stride[0], padding[0], 1),
          out_size(op, x[3], kernel[1], stride[1], padding[1], 1)};
}

}  // namespace

Tensor cudnn_pool2d_forward(const Tensor& x, PoolMode mode, Pair kernel, Pair stride, Pair padding) {
  const char* op = "cudnn_pool2d_forward";
  check_4d(op, "x", x);
  const Shape ys = pool_out_shape(op, x.shape(), kernel, stride, padding);
  const int dev = x.device().index;
  const Tensor xc = x.contiguous();
  Tensor y = Tensor::empty(ys, x.dtype(), x.device());
  DeviceGuard guard(dev);
  const CudnnHandle h = cudnn_handle(dev);
  const DType t = x.dtype();
  TensorDesc xd(t, x.shape()), yd(t, ys);
  PoolDesc pd(mode, kernel, stride, padding);
  const Blend b;
  SL_CUDNN_ON(dev, cudnnPoolingForward, h, pd.d, b.one(t), xd.d, xc.data_ptr(), b.zero(t), yd.d, y.data_ptr());
  return y;
}

Tensor cudnn_pool2d_backward(const Tensor& x, const Tensor& y, const Tensor& dy, PoolMode mode, Pair kernel,
                             Pair stride, Pair padding) {
  const char* op = "cudnn_pool2d_backward";
  check_4d(op, "x", x);
  check_4d(op, "y", y);
  check_like(op, "y", y, x);
  check_like(op, "dy", dy, x);
  const Shape ys = pool_out_shape(op, x.shape(), kernel, stride, padding);
  SL_CHECK(y.shape() == ys && dy.shape() == ys, ValueError, op, ": y and dy must have shape ", shape_str(ys),
           " for x ", shape_str(x.shape()), ", got ", shape_str(y.shape()), " and ", shape_str(dy.shape()));
  const int dev = x.device().index;
  const Tensor xc = x.contiguous(), yc = y.contiguous(), dyc = dy.contiguous();
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
  DeviceGuard guard(dev);
  const CudnnHandle h = cudnn_handle(dev);
  const DType t = x.dtype();
  TensorDesc xd(t, x.shape()), yd(t, ys);
  PoolDesc pd(mode, kernel, stride, padding);
  const Blend b;
  SL_CUDNN_ON(dev, cudnnPoolingBackward, h, pd.d, b.one(t), yd.d, yc.data_ptr(), yd.d, dyc.data_ptr(), xd.d,
              xc.data_ptr(), b.zero(t), xd.d, dx.data_ptr());
  return dx;
}

std::tuple<Tensor, Tensor, Tensor> cudnn_batch_norm_forward_training(const Tensor& x, const Tensor& scale,
                                                                     const Tensor& bias, const Tensor& running_mean,
                                                                     const Tensor& running_var, double momentum,
                                                                     double eps) {
  const char* op = "cudnn_batch_norm_forward_training";
  check_bn(op, x, {{"scale", &scale}, {"bias", &bias}, {"running_mean", &running_mean}, {"running_var", &running_var}});
  SL_CHECK(momentum >= 0.0 && momentum <= 1.0, ValueError, op, ": momentum must be in [0, 1], got ", momentum);
  SL_CHECK(eps >= 0.0, ValueError, op, ": eps must be >= 0, got ", eps);
  SL_CHECK(x.numel() / x.shape()[1] >= 2, ValueError, op, ": training needs more than one value per channel, x has "
           "shape ", shape_str(x.shape()));
  const int dev = x.device().index;
  const DType t = x.dtype(), pt = param_dtype(t);
  const Tensor xc = x.contiguous(), sc = as_param(scale, pt), bc = as_param(bias, pt);
  // The running statistics are updated in place: work on them directly when cuDNN can, else on float copies
  // written back afterwards (float16 statistics, or non-contiguous views).
  const bool direct = running_mean.dtype() == pt && running_mean.is_contiguous() && running_var.is_contiguous();
  Tensor rm = direct ? running_mean : as_param(running_mean, pt);
  Tensor rv = direct ? running_var : as_param(running_var, pt);
  const int64_t C = x.shape()[1];
  Tensor y = Tensor::empty(x.shape(), t, x.device());
  Tensor saved_mean = Tensor::empty({C}, pt, x.device()), saved_inv_std = Tensor::empty({C}, pt, x.device());
  {
    DeviceGuard guard(dev);
    const CudnnHandle h = cudnn_handle(dev);
    TensorDesc xd(t, x.shape()), pd(pt, 1, C, 1, 1);
    const Blend b;
    SL_CUDNN(cudnnBatchNormalizationForwardTraining, h, CUDNN_BATCHNORM_SPATIAL, b.one(t), b.zero(t), xd.d,
             xc.data_ptr(), xd.d, y.data_ptr(), pd.d, sc.data_ptr(), bc.data_ptr(), momentum, rm.data_ptr(),
             rv.data_ptr(), eps, saved_mean.data_ptr(), saved_inv_std.data_ptr());
  }
  if (!direct) {
    ::sl::copy_(running_mean, rm);  // back to the caller's (float16 or strided) statistics
    ::sl::copy_(running_var, rv);
  }
  return {y, saved_mean, saved_inv_std};
}

Tensor cudnn_batch_norm_forward_inference(const Tensor& x, const Tensor& scale, const Tensor& bias,
                                          const Tensor& running_mean, const Tensor& running_var, double eps) {
  const char* op = "cudnn_batch_norm_forward_inference";
  check_bn(op, x, {{"scale", &scale}, {"bias", &bias}, {"running_mean", &running_mean}, {"running_var", &running_var}});
  SL_CHECK(eps >= 0.0, ValueError, op, ": eps must be >= 0, got ", eps);
  const int dev = x.device().index;
  const DType t = x.dtype(), pt = param_dtype(t);
  const Tensor xc = x.contiguous(), sc = as_param(scale, pt), bc = as_param(bias, pt);
  const Tensor rm = as_param(running_mean, pt), rv = as_param(running_var, pt);
  Tensor y = Tensor::empty(x.shape(), t, x.device());
  DeviceGuard guard(dev);
  const CudnnHandle h = cudnn_handle(dev);
  TensorDesc xd(t, x.shape()), pd(pt, 1, x.shape()[1], 1, 1);
  const Blend b;
  SL_CUDNN(cudnnBatchNormalizationForwardInference, h, CUDNN_BATCHNORM_SPATIAL, b.one(t), b.zero(t), xd.d,
           xc.data_ptr(), xd.d, y.data_ptr(), pd.d, sc.data_ptr(), bc.data_ptr(), rm.data_ptr(), rv.data_ptr(), eps);
  return y;
}

std::tuple<Tensor, Tensor, Tensor> cudnn_batch_norm_backward(const Tensor& x, const Tensor& dy, const Tensor& scale,
                                                             const Tensor& saved_mean, const Tensor& saved_inv_std,
                                                             double eps) {
  const char* op = "cudnn_batch_norm_backward";
  check_bn(op, x, {{"scale", &scale}});
  check_like(op, "dy", dy, x);
  SL_CHECK(dy.shape() == x.shape(), ValueError, op, ": dy has shape ", shape_str(dy.shape()), ", x ",
           shape_str(x.shape()));
  const DType t = x.dtype(), pt = param_dtype(t);
  const int64_t C = x.shape()[1];
  for (const auto& [name, s] : {std::pair<const char*, const Tensor*>{"saved_mean", &saved_mean},
                                {"saved_inv_std", &saved_inv_std}}) {
    SL_CHECK(s->defined() && s->device() == x.device() && s->dtype() == pt && s->shape() == Shape{C}, ValueError, op,
             ": ", name, " must be the (", C, ",) ", dtype_name(pt),
             " tensor cudnn_batch_norm_forward_training returned for this x");
  }
  const int dev = x.device().index;
  const Tensor xc = x.contiguous(), dyc = dy.contiguous(), sc = as_param(scale, pt);
  const Tensor mc = saved_mean.contiguous(), ic = saved_inv_std.contiguous();
  Tensor dx = Tensor::empty(x.shape(), t, x.device());
  Tensor dscale = Tensor::empty({C}, pt, x.device()), dbias = Tensor::empty({C}, pt, x.device());
  {
    DeviceGuard guard(dev);
    const CudnnHandle h = cudnn_handle(dev);
    TensorDesc xd(t, x.shape()), pd(pt, 1, C, 1, 1);
    const Blend b;
    SL_CUDNN(cudnnBatchNormalizationBackward, h, CUDNN_BATCHNORM_SPATIAL, b.one(t), b.zero(t), b.one(t), b.zero(t),
             xd.d, xc.data_ptr(), xd.d, dyc.data_ptr(), xd.d, dx.data_ptr(), pd.d, sc.data_ptr(), dscale.data_ptr(),
             dbias.data_ptr(), eps, mc.data_ptr(), ic.data_ptr());
  }
  return {dx, t == pt ? dscale : dscale.cast(t), t == pt ? dbias : dbias.cast(t)};
}

ConvPlanCache::Stats conv_plan_stats() { return conv_plans().stats(); }

std::vector<AlgoChoice> cudnn_conv2d_plans(ConvDirection direction, const Shape& x_shape, const Shape& w_shape,
                                           Pair stride, Pair padding, Pair dilation, int64_t groups, DType dtype,
                                           Device device) {
  const char* op = "cudnn_conv2d_plans";
  SL_CHECK(device.is_cuda(), ValueError, op, ": expected a CUDA device, got ", device.str());
  SL_CHECK(dtype == DType::kFloat16 || dtype == DType::kFloat32 || dtype == DType::kFloat64, TypeError, op,
           ": dtype must be float16, float32 or float64, got ", dtype_name(dtype));
  const Shape ys = conv_out_shape(op, x_shape, w_shape, stride, padding, dilation, groups);
  const Conv c(device.index, dtype, x_shape, w_shape, ys, stride, padding, dilation, groups);
  return plans_for(c, direction, x_shape, w_shape, stride, padding, dilation, groups);
}

void cudnn_provoke_error() {
  cudnnTensorDescriptor_t d = nullptr;
  SL_CUDNN(cudnnCreateTensorDescriptor, &d);
  try {
    SL_CUDNN(cudnnSetTensor4dDescriptorEx, d, CUDNN_DATA_FLOAT, -1, 1, 1, 1, 1, 1, 1, 1);
  } catch (...) {
    cudnn_api().cudnnDestroyTensorDescriptor(d);
    throw;
  }
  cudnn_api().cudnnDestroyTensorDescriptor(d);
  throw InternalError("cudnn_provoke_error: cuDNN accepted a tensor descriptor with a negative size");
}

}  // namespace sl::cuda
