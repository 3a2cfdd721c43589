// CUDA versions of cpu/nn.cpp (im2col / col2im, 2-D max and average pooling) and cpu/index.cpp (one_hot).
// The front-ends (ops/nn.cpp, ops/shape.cpp) pass contiguous NCHW inputs and fresh contiguous outputs.
//
// One thread per output element in grid-stride loops. Everything that sums (col2im, both pooling
// backwards) is written as a gather: each dx element adds its contributions itself, in the order the CPU
// kernel adds them to that element, starting from 0 in the compute type, so results are deterministic and
// equal to the CPU's bit for bit (no float atomics anywhere). Index arithmetic runs in int32 when every
// quantity involved stays below 2^30 (int64 division costs several times more) and in int64 otherwise.
#include <climits>
#include <cmath>
#include <cstdint>
#include <initializer_list>

#include "cuda/common.cuh"
#include "cuda/index_faults.h"
#include "cuda/kernels.h"

namespace sl::cuda {
namespace {

// ----- shared helpers

// Below this every index, product and sum the kernels form fits int32 with room for the grid-stride step.
constexpr int64_t kInt32Limit = int64_t(1) << 30;

bool fits_int32(std::initializer_list<int64_t> values) {
  for (int64_t v : values)
    if (v < 0 || v >= kInt32Limit) return false;
  return true;
}

// f(tag) with decltype(tag) the index type the kernels should use.
template <typename F>
void with_index_type(bool small, F&& f) {
  if (small) f(int32_t{});
  else f(int64_t{});
}

template <typename I>
__device__ __forceinline__ I first_index() {
  return I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x);
}
template <typename I>
__device__ __forceinline__ I grid_step() {
  return I(gridDim.x) * I(blockDim.x);
}

template <typename I>
__host__ __device__ __forceinline__ I imin(I a, I b) { return a < b ? a : b; }
template <typename I>
__host__ __device__ __forceinline__ I imax(I a, I b) { return a > b ? a : b; }

// Queues kernel over n items on the device's compute stream (the caller has skipped n == 0).
template <typename... Params, typename... Args>
void launch(const char* name, int64_t n, int device, void (*kernel)(Params...), Args&&... args) {
  const Launch l = launch_for(n, device);
  kernel<<<l.blocks, l.threads, 0, stream(device)>>>(static_cast<Params>(args)...);
  SL_CUDA_LAUNCHED(name);
}

// ----- im2col / col2im

template <typename I>
struct ConvDims {
  I N, C, H, W, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW;
};

template <typename I>
ConvDims<I> conv_dims(const Shape& x, const Conv2dGeometry& g) {
  return {I(x[0]),       I(x[1]),       I(x[2]),     I(x[3]),     I(g.kernel_h),   I(g.kernel_w), I(g.stride_h),
          I(g.stride_w), I(g.pad_h),    I(g.pad_w),  I(g.dilation_h), I(g.dilation_w), I(g.out_h), I(g.out_w)};
}

bool conv_fits_int32(const Shape& x, int64_t cols_numel, const Conv2dGeometry& g) {
  // Padded extents bound every input coordinate formed (oh*sh - ph + i*dh and the col2im inverse).
  return fits_int32({cols_numel, x[0] * x[1] * x[2] * x[3], x[2] + 2 * g.pad_h, x[3] + 2 * g.pad_w, g.kernel_h,
                     g.kernel_w, g.stride_h, g.stride_w, g.dilation_h, g.dilation_w});
}

// cols[(c, i, j), (n, oh, ow)] = x[n, c, oh*sh - ph + i*dh, ow*sw - pw + j*dw], 0 outside the image.
// One thread per cols entry; consecutive threads write consecutive ow (coalesced stores).
template <typename T, typename I>
__global__ void im2col_kernel(T* cols, const T* x, ConvDims<I> d, I total) {
  const T zero = store_as<T>(compute_of<T>(0));
  for (I e = first_index<I>(); e < total; e += grid_step<I>()) {
    const I ow = e % d.OW;
    I t = e / d.OW;
    const I oh = t % d.OH;
    t /= d.OH;
    const I n = t % d.N;
    t /= d.N;  // t = (c*kh + i)*kw + j, the cols row
    const I j = t % d.kw;
    t /= d.kw;
    const I i = t % d.kh;
    const I c = t / d.kh;
    const I ih = oh * d.sh - d.ph + i * d.dh, iw = ow * d.sw - d.pw + j * d.dw;
    const bool inside = ih >= 0 && ih < d.H && iw >= 0 && iw < d.W;
    cols[e] = inside ? x[((n * d.C + c) * d.H + ih) * d.W + iw] : zero;
  }
}

// The adjoint: x[n, c, h, w] = sum of the cols entries copied from it. The CPU adds the cols rows
// r = i*kw + j in ascending order (for a fixed (i, j) at most one (oh, ow) lands on a pixel), so the gather
// visits (i, j) in that order: the same additions in the same order.
template <typename T, typename I>
__global__ void col2im_kernel(T* x, const T* cols, ConvDims<I> d, I total) {
  using C = compute_of<T>;
  const I OHW = d.OH * d.OW;
  for (I e = first_index<I>(); e < total; e += grid_step<I>()) {
    const I w = e % d.W;
    I t = e / d.W;
    const I h = t % d.H;
    t /= d.H;
    const I c = t % d.C;
    const I n = t / d.C;
    C acc = C(0);
    for (I i = 0; i < d.kh; ++i) {
      const I hp = h + d.ph - i * d.dh;  // = oh*sh for the output row whose window tap i covers h
      if (hp < 0) break;                 // hp only decreases with i
      if (hp % d.sh != 0) continue;
      const I oh = hp / d.sh;
      if (oh >= d.OH) continue;
      for (I j = 0; j < d.kw; ++j) {
        const I wp = w + d.pw - j * d.dw;
        if (wp < 0) break;
        if (wp % d.sw != 0) continue;
        const I ow = wp / d.sw;
        if (ow >= d.OW) continue;
        const I row = (c * d.kh + i) * d.kw + j;
        acc += load(cols + (row * d.N + n) * OHW + oh * d.OW + ow);
      }
    }
    x[e] = store_as<T>(acc);
  }
}

// ----- pooling

template <typename I>
struct PoolDims {
  I NC, H, W, kh, kw, sh, sw, ph, pw, OH, OW;
};

template <typename I>
PoolDims<I> pool_dims(const Shape& x, const Pool2dGeometry& g) {
  return {I(x[0] * x[1]), I(x[2]),     I(x[3]),     I(g.kernel_h), I(g.kernel_w), I(g.stride_h),
          I(g.stride_w),  I(g.pad_h), I(g.pad_w), I(g.out_h),    I(g.out_w)};
}

bool pool_fits_int32(const Shape& x, int64_t out_numel, const Pool2dGeometry& g) {
  return fits_int32({out_numel, x[0] * x[1] * x[2] * x[3], x[2] + 2 * g.pad_h + g.kernel_h,
                     x[3] + 2 * g.pad_w + g.kernel_w, g.stride_h, g.stride_w});
}

// The window of output (oh, ow) clipped to the image: rows [hs, he), columns [ws, we).
template <typename I>
struct Window {
  I hs, he, ws, we;
};
template <typename I>
__device__ __forceinline__ Window<I> window(const PoolDims<I>& d, I oh, I ow) {
  const I h0 = oh * d.sh - d.ph, w0 = ow * d.sw - d.pw;
  return {imax(h0, I(0)), imin(h0 + d.kh, d.H), imax(w0, I(0)), imin(w0 + d.kw, d.W)};
}

// The CPU's divisor: the full window with count_include_pad, else the pixels inside (at least 1).
template <typename I>
__device__ __forceinline__ int64_t avg_count(const PoolDims<I>& d, const Window<I>& win, bool include_pad) {
  const int64_t inside = imax(int64_t(win.he - win.hs) * int64_t(win.we - win.ws), int64_t(0));
  return include_pad ? int64_t(d.kh) * int64_t(d.kw) : imax(inside, int64_t(1));
}

// Maximum over the clipped window in row-major order, the CPU's rule: v replaces the best when v > best,
// or when v is nan and the best is not; so the first maximum wins and the first nan beats everything.
// argmax is the flat ih*W + iw within the image plane.
template <typename T, typename I>
__global__ void max_pool_kernel(T* y, int64_t* argmax, const T* x, PoolDims<I> d, I total) {
  using C = compute_of<T>;
  for (I o = first_index<I>(); o < total; o += grid_step<I>()) {
    const I ow = o % d.OW;
    const I t = o / d.OW;
    const I oh = t % d.OH;
    const I nc = t / d.OH;
    const Window<I> win = window(d, oh, ow);
    if (win.hs >= win.he || win.ws >= win.we) {
      // Only an image of height or width 0 (padding at most half the kernel keeps every window of a
      // non-empty image non-empty). The CPU would read out of bounds here; give the empty max, -inf, and
      // the argmax -1 that the backward skips.
      y[o] = store_as<T>(-C(INFINITY));
      argmax[o] = -1;
      continue;
    }
    const T* plane = x + nc * d.H * d.W;
    I best_i = win.hs * d.W + win.ws;
    C best = load(plane + best_i);
    for (I ih = win.hs; ih < win.he; ++ih)
      for (I iw = win.ws; iw < win.we; ++iw) {
        const C v = load(plane + ih * d.W + iw);
        if (v > best || (v != v && best == best)) {
          best = v;
          best_i = ih * d.W + iw;
        }
      }
    y[o] = plane[best_i];  // the element itself: what the CPU stores, without a round trip through C
    argmax[o] = int64_t(best_i);
  }
}

// Sum over the window in row-major order (the CPU's order), divided once by the count.
template <typename T, typename I>
__global__ void avg_pool_kernel(T* y, const T* x, PoolDims<I> d, bool include_pad, I total) {
  using C = compute_of<T>;
  for (I o = first_index<I>(); o < total; o += grid_step<I>()) {
    const I ow = o % d.OW;
    const I t = o / d.OW;
    const I oh = t % d.OH;
    const I nc = t / d.OH;
    const Window<I> win = window(d, oh, ow);
    const T* plane = x + nc * d.H * d.W;
    C s = C(0);
    for (I ih = win.hs; ih < win.he; ++ih)
      for (I iw = win.ws; iw < win.we; ++iw) s += load(plane + ih * d.W + iw);
    y[o] = store_as<T>(s / C(avg_count(d, win, include_pad)));
  }
}

// dx[h, w] = sum over the windows (oh, ow) containing (h, w), in ascending (oh, ow) as the CPU visits
// them, of dy[oh, ow] / count(oh, ow) (the share computed and rounded exactly as the CPU does).
template <typename T, typename I>
__global__ void avg_pool_backward_kernel(T* dx, const T* dy, PoolDims<I> d, bool include_pad, I total) {
  using C = compute_of<T>;
  for (I e = first_index<I>(); e < total; e += grid_step<I>()) {
    const I w = e % d.W;
    const I t = e / d.W;
    const I h = t % d.H;
    const I nc = t / d.H;
    // Window oh covers h when oh*sh - ph <= h < oh*sh - ph + kh.
    const I hq = h + d.ph - d.kh, wq = w + d.pw - d.kw;
    const I oh_lo = hq < 0 ? I(0) : hq / d.sh + 1, oh_hi = imin((h + d.ph) / d.sh, d.OH - 1);
    const I ow_lo = wq < 0 ? I(0) : wq / d.sw + 1, ow_hi = imin((w + d.pw) / d.sw, d.OW - 1);
    const T* g = dy + nc * d.OH * d.OW;
    C acc = C(0);
    for (I oh = oh_lo; oh <= oh_hi; ++oh)
      for (I ow = ow_lo; ow <= ow_hi; ++ow) {
        const C share = load(g + oh * d.OW + ow) / C(avg_count(d, window(d, oh, ow), include_pad));
        acc += share;
      }
    dx[e] = store_as<T>(acc);
  }
}

// ----- max pooling backward
//
// The contract passes no geometry here (only dx, dy and argmax), so the windows containing a pixel are
// not known. The gather instead bounds its search with the argmax data itself, in three small passes
// over int64 scratch (integer min/max atomics, whose results do not depend on their order):
//  1. for each output row oh, the lowest and highest image row any plane's argmax points to, and the same
//     for output columns ow;
//  2. for each image row h, the lowest and highest oh whose range from 1 contains h (same for columns);
//  3. each dx[h, w] scans the outputs in those ranges, oh then ow ascending (the CPU's order), and adds
//     dy where argmax == h*W + w.
// Every output whose argmax is (h, w) lies in the scanned rectangle by construction, whatever argmax holds.
// For argmax produced by max_pool2d the ranges of 1 lie inside each window, so 3 scans at most the
// windows containing the pixel: about ceil(kh/sh) * ceil(kw/sw) outputs.
// Argmax entries outside [0, H*W) are skipped (the CPU skips negative ones; larger ones would be out of
// bounds there).

// Scratch layout (long long): [row_lo OH | col_lo OW | h_lo H | w_lo W | row_hi OH | col_hi OW | h_hi H | w_hi W];
// the *_lo half starts at LLONG_MAX, the *_hi half at -1 (an empty range).
struct MaxBackScratch {
  long long *row_lo, *col_lo, *h_lo, *w_lo, *row_hi, *col_hi, *h_hi, *w_hi;
};

MaxBackScratch split_scratch(long long* s, int64_t OH, int64_t OW, int64_t H, int64_t W) {
  const int64_t half = OH + OW + H + W;
  MaxBackScratch r;
  r.row_lo = s;
  r.col_lo = r.row_lo + OH;
  r.h_lo = r.col_lo + OW;
  r.w_lo = r.h_lo + H;
  r.row_hi = s + half;
  r.col_hi = r.row_hi + OH;
  r.h_hi = r.col_hi + OW;
  r.w_hi = r.h_hi + H;
  return r;
}

__global__ void init_scratch_kernel(long long* s, int64_t half) {
  for (int64_t i = first_index<int64_t>(); i < 2 * half; i += grid_step<int64_t>()) s[i] = i < half ? LLONG_MAX : -1;
}

// Atomic min / max that first reads the current value (from L2) and skips the atomic when it cannot
// change it: the stored value only moves one way, so a stale read never skips a needed update, and once
// the extremes are found almost no thread issues an atomic on the few contended addresses.
__device__ __forceinline__ void lower_to(long long* p, long long v) {
  if (v < __ldcg(p)) atomicMin(p, v);
}
__device__ __forceinline__ void raise_to(long long* p, long long v) {
  if (v > __ldcg(p)) atomicMax(p, v);
}

// Pass 1: image row / column ranges of the argmax entries per output row / column.
template <typename I>
__global__ void argmax_extent_kernel(MaxBackScratch s, const int64_t* argmax, I OH, I OW, I H, I W, I total) {
  const int64_t HW = int64_t(H) * int64_t(W);
  for (I o = first_index<I>(); o < total; o += grid_step<I>()) {
    const int64_t a = argmax[o];
    if (a < 0 || a >= HW) continue;
    const I ow = o % OW, oh = (o / OW) % OH;
    const I r = I(a) / W, c = I(a) - r * W;
    lower_to(s.row_lo + oh, r);
    raise_to(s.row_hi + oh, r);
    lower_to(s.col_lo + ow, c);
    raise_to(s.col_hi + ow, c);
  }
}

// Pass 2: one thread per output row (then column) marks the image rows (columns) of its range.
__global__ void candidate_range_kernel(MaxBackScratch s, int64_t OH, int64_t OW) {
  for (int64_t t = first_index<int64_t>(); t < OH + OW; t += grid_step<int64_t>()) {
    const bool is_row = t < OH;
    const long long o = is_row ? t : t - OH;
    const long long lo = is_row ? s.row_lo[o] : s.col_lo[o], hi = is_row ? s.row_hi[o] : s.col_hi[o];
    long long* cand_lo = is_row ? s.h_lo : s.w_lo;
    long long* cand_hi = is_row ? s.h_hi : s.w_hi;
    for (long long p = lo; p <= hi; ++p) {  // empty when no argmax of this row / column was valid
      lower_to(cand_lo + p, o);
      raise_to(cand_hi + p, o);
    }
  }
}

// Pass 3: the gather.
template <typename T, typename I>
__global__ void max_pool_backward_kernel(T* dx, const T* dy, const int64_t* argmax, MaxBackScratch s, I OH, I OW,
                                         I H, I W, I total) {
  using C = compute_of<T>;
  for (I e = first_index<I>(); e < total; e += grid_step<I>()) {
    const I w = e % W;
    const I t = e / W;
    const I h = t % H;
    const I nc = t / H;
    const long long oh_lo = s.h_lo[h], oh_hi = s.h_hi[h], ow_lo = s.w_lo[w], ow_hi = s.w_hi[w];
    C acc = C(0);
    if (oh_lo <= oh_hi && ow_lo <= ow_hi) {  // else no output points here (and the bounds are sentinels)
      const int64_t target = int64_t(h) * int64_t(W) + int64_t(w);
      const I base = nc * OH * OW;
      for (I oh = I(oh_lo); oh <= I(oh_hi); ++oh)
        for (I ow = I(ow_lo); ow <= I(ow_hi); ++ow) {
          const I o = base + oh * OW + ow;
          if (argmax[o] == target) acc += load(dy + o);
        }
    }
    dx[e] = store_as<T>(acc);
  }
}

// ----- one_hot

// out[i, k] = (indices[i] == k): every element written once, so no separate zero fill is needed. An index outside
// [0, depth) gives a row of zeros (no write outside out) and is reported once, by its row's first element
// (index_faults.h).
template <typename T, typename Idx, typename I>
__global__ void one_hot_kernel(T* out, const Idx* indices, I depth, I total, IndexFaultSlot faults) {
  const T one = store_as<T>(compute_of<T>(1)), zero = store_as<T>(compute_of<T>(0));
  for (I e = first_index<I>(); e < total; e += grid_step<I>()) {
    const I i = e / depth;
    const I k = e - i * depth;
    const long long v = (long long)indices[i];
    if (k == 0) index_in_range(faults, v);
    out[e] = v == (long long)k ? one : zero;
  }
}

}  // namespace

// ----- entry points (contract in cuda/kernels.h)

void im2col(const Tensor& cols, const Tensor& x, const Conv2dGeometry& g) {
  const int64_t total = cols.numel();
  if (total == 0) return;  // x may be empty while cols is not (an image of height 0 with padding): all zeros
  const int device = cols.device().index;
  DeviceGuard guard(device);
  SL_CUDA_DISPATCH_FLOAT(x.dtype(), "im2col", [&] {
    with_index_type(conv_fits_int32(x.shape(), total, g), [&](auto tag) {
      using I = decltype(tag);
      launch("im2col", total, device, im2col_kernel<scalar_t, I>, cols.data<scalar_t>(), x.data<scalar_t>(),
             conv_dims<I>(x.shape(), g), I(total));
    });
  });
}

void col2im(const Tensor& x, const Tensor& cols, const Conv2dGeometry& g) {
  const int64_t total = x.numel();
  if (total == 0) return;
  const int device = x.device().index;
  DeviceGuard guard(device);
  SL_CUDA_DISPATCH_FLOAT(x.dtype(), "col2im", [&] {
    with_index_type(conv_fits_int32(x.shape(), cols.numel(), g), [&](auto tag) {
      using I = decltype(tag);
      launch("col2im", total, device, col2im_kernel<scalar_t, I>, x.data<scalar_t>(), cols.data<scalar_t>(),
             conv_dims<I>(x.shape(), g), I(total));
    });
  });
}

void max_pool2d(const Tensor& out, const Tensor& argmax, const Tensor& x, const Pool2dGeometry& g) {
  const int64_t total = out.numel();
  if (total == 0) return;
  const int device = out.device().index;
  DeviceGuard guard(device);
  SL_CUDA_DISPATCH_FLOAT(x.dtype(), "max_pool2d", [&] {
    with_index_type(pool_fits_int32(x.shape(), total, g), [&](auto tag) {
      using I = decltype(tag);
      launch("max_pool2d", total, device, max_pool_kernel<scalar_t, I>, out.data<scalar_t>(),
             argmax.data<int64_t>(), x.data<scalar_t>(), pool_dims<I>(x.shape(), g), I(total));
    });
  });
}

void max_pool2d_backward(const Tensor& dx, const Tensor& dy, const Tensor& argmax) {
  const int64_t total = dx.numel();
  if (total == 0) return;
  const int device = dx.device().index;
  DeviceGuard guard(device);
  const int64_t H = dx.shape()[2], W = dx.shape()[3], OH = dy.shape()[2], OW = dy.shape()[3];
  const int64_t outputs = dy.numel();
  const int64_t half = OH + OW + H + W;
  // Freed when this returns; the caching allocator hands it out again only to work queued after ours.
  Tensor scratch = Tensor::empty({2 * half}, DType::kInt64, dx.device());
  long long* const scratch_ptr = reinterpret_cast<long long*>(scratch.data<int64_t>());  // same 8 bytes
  const MaxBackScratch s = split_scratch(scratch_ptr, OH, OW, H, W);
  launch("max_pool2d_backward (init)", 2 * half, device, init_scratch_kernel, scratch_ptr, half);
  SL_CUDA_DISPATCH_FLOAT(dx.dtype(), "max_pool2d_backward", [&] {
    with_index_type(fits_int32({total, outputs, H, W, OH, OW}), [&](auto tag) {
      using I = decltype(tag);
      if (outputs > 0) {  // without outputs every range stays empty and dx comes out 0
        launch("max_pool2d_backward (extent)", outputs, device, argmax_extent_kernel<I>, s,
               argmax.data<int64_t>(), I(OH), I(OW), I(H), I(W), I(outputs));
        launch("max_pool2d_backward (ranges)", OH + OW, device, candidate_range_kernel, s, OH, OW);
      }
      launch("max_pool2d_backward", total, device, max_pool_backward_kernel<scalar_t, I>, dx.data<scalar_t>(),
             dy.data<scalar_t>(), argmax.data<int64_t>(), s, I(OH), I(OW), I(H), I(W), I(total));
    });
  });
}

void avg_pool2d(const Tensor& out, const Tensor& x, const Pool2dGeometry& g, bool count_include_pad) {
  const int64_t total = out.numel();
  if (total == 0) return;
  const int device = out.device().index;
  DeviceGuard guard(device);
  SL_CUDA_DISPATCH_FLOAT(x.dtype(), "avg_pool2d", [&] {
    with_index_type(pool_fits_int32(x.shape(), total, g), [&](auto tag) {
      using I = decltype(tag);
      launch("avg_pool2d", total, device, avg_pool_kernel<scalar_t, I>, out.data<scalar_t>(), x.data<scalar_t>(),
             pool_dims<I>(x.shape(), g), count_include_pad, I(total));
    });
  });
}

void avg_pool2d_backward(const Tensor& dx, const Tensor& dy, const Pool2dGeometry& g, bool count_include_pad) {
  const int64_t total = dx.numel();
  if (total == 0) return;
  const int device = dx.device().index;
  DeviceGuard guard(device);
  SL_CUDA_DISPATCH_FLOAT(dx.dtype(), "avg_pool2d_backward", [&] {
    with_index_type(pool_fits_int32(dx.shape(), dy.numel(), g), [&](auto tag) {
      using I = decltype(tag);
      launch("avg_pool2d_backward", total, device, avg_pool_backward_kernel<scalar_t, I>, dx.data<scalar_t>(),
             dy.data<scalar_t>(), pool_dims<I>(dx.shape(), g), count_include_pad, I(total));
    });
  });
}

void one_hot(const Tensor& out, const Tensor& indices, int64_t depth) {
  const int64_t total = out.numel();
  if (total == 0) return;
  const int device = out.device().index;
  DeviceGuard guard(device);
  SL_CUDA_DISPATCH_ALL(out.dtype(), "one_hot", [&] {
    with_index_type(fits_int32({total, depth}), [&](auto tag) {
      using I = decltype(tag);
      // indices is contiguous (the front-end passes indices.contiguous()), int32 or int64.
      const IndexFaultSlot faults = index_fault_slot(device, kOneHot, depth);
      if (indices.dtype() == DType::kInt32)
        launch("one_hot", total, device, one_hot_kernel<scalar_t, int32_t, I>, out.data<scalar_t>(),
               indices.data<int32_t>(), I(depth), I(total), faults);
      else
        launch("one_hot", total, device, one_hot_kernel<scalar_t, int64_t, I>, out.data<scalar_t>(),
               indices.data<int64_t>(), I(depth), I(total), faults);
    });
  });
}

}  // namespace sl::cuda
