// Neural-network kernels that are not plain element-wise / reduction / GEMM work:
// im2col / col2im (convolution as GEMM) and 2-D pooling. Inputs are contiguous NCHW.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/errors.h"
#include "cpu/kernels.h"
#include "cpu/loop.h"

namespace sl::cpu {

namespace {

// Output columns ow whose input column ow*stride + off lies inside [0, W): [lo, hi).
inline std::pair<int64_t, int64_t> inside_range(int64_t out_w, int64_t stride, int64_t off, int64_t W) {
  auto ceil_div = [](int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); };
  const int64_t lo = std::clamp<int64_t>(ceil_div(-off, stride), 0, out_w);
  const int64_t hi = std::clamp<int64_t>(ceil_div(W - off, stride), lo, out_w);
  return {lo, hi};
}

}  // namespace

// im2col's rows are short (8 to 32 pixels in a CNN), so they are filled by plain loops, compiled inline. Both
// compilers turn such loops (and std::copy / std::fill) into memcpy / memset calls by default; the portable
// wheel's clang (zig) links its own memcpy / memset, slower than glibc's on short rows, and im2col ran 1.4x
// (conv2 of LeNet) to 1.7x slower there than in the GCC build. GCC keeps its calls into glibc.
// The rows' loops are vectorised without unrolling under clang: its default (4 vectors per iteration) leaves
// an 8-pixel row entirely to the scalar remainder loop.
#if defined(__clang__)
#define SL_INLINE_ROW_COPIES __attribute__((no_builtin("memcpy", "memmove", "memset")))
#define SL_SHORT_ROW_LOOP _Pragma("clang loop interleave_count(1)")
#else
#define SL_INLINE_ROW_COPIES
#define SL_SHORT_ROW_LOOP
#endif

namespace {

// Rows [b, e) of (n, c, i, j) of im2col; see im2col.
template <typename T>
SL_INLINE_ROW_COPIES void im2col_rows(T* __restrict dst, const T* __restrict src, int64_t N, int64_t C, int64_t H, int64_t W,
                                      const Conv2dGeometry& g, int64_t b, int64_t e) {
  const int64_t OHW = g.out_h * g.out_w, rows = C * g.kernel_h * g.kernel_w, out_w = g.out_w, sw = g.stride_w;
  const T zero = convert<T>(0.0);
  for (int64_t nr = b; nr < e; ++nr) {
    const int64_t n = nr / rows, r = nr % rows;
    const int64_t c = r / (g.kernel_h * g.kernel_w), i = (r / g.kernel_w) % g.kernel_h, j = r % g.kernel_w;
    const T* plane = src + (n * C + c) * H * W;
    T* out = dst + (r * N + n) * OHW;
    const int64_t off = j * g.dilation_w - g.pad_w;
    const auto [lo, hi] = inside_range(out_w, sw, off, W);
    for (int64_t oh = 0; oh < g.out_h; ++oh) {
      const int64_t ih = oh * g.stride_h - g.pad_h + i * g.dilation_h;
      T* orow = out + oh * out_w;
      if (ih < 0 || ih >= H) {
        SL_SHORT_ROW_LOOP
        for (int64_t ow = 0; ow < out_w; ++ow) orow[ow] = zero;
        continue;
      }
      const T* irow = plane + ih * W + off;
      for (int64_t ow = 0; ow < lo; ++ow) orow[ow] = zero;
      if (sw == 1) {
        SL_SHORT_ROW_LOOP
        for (int64_t ow = lo; ow < hi; ++ow) orow[ow] = irow[ow];
      } else {
        for (int64_t ow = lo; ow < hi; ++ow) orow[ow] = irow[ow * sw];
      }
      for (int64_t ow = hi; ow < out_w; ++ow) orow[ow] = zero;
    }
  }
}

}  // namespace

// cols[(c, i, j), (n, oh, ow)] = x[n, c, oh*sh - ph + i*dh, ow*sw - pw + j*dw] (0 outside the image).
// All images' columns sit side by side, so a convolution of the whole batch is one GEMM W[OC, K] @ cols.
void im2col(const Tensor& cols, const Tensor& x, const Conv2dGeometry& g) {
  SL_DISPATCH_FLOAT(x.dtype(), "im2col", [&] {
    const scalar_t* src = x.data<scalar_t>();
    scalar_t* dst = cols.data<scalar_t>();
    const int64_t N = x.shape()[0], C = x.shape()[1], H = x.shape()[2], W = x.shape()[3];
    const int64_t rows = C * g.kernel_h * g.kernel_w;
    parallel_range(N * rows, [&](int64_t b, int64_t e) { im2col_rows(dst, src, N, C, H, W, g, b, e); },
                   g.out_h * g.out_w);
  });
}

namespace {

// Planes [b, e) of (n, c) of col2im, accumulated in acc (H * W entries); see col2im. Short rows, as in
// im2col_rows: inline loops, and under clang a separate contiguous loop for stride 1 (clang, without run-time
// stride versioning, left the strided form scalar: col2im ran 1.6-2.5x slower than GCC's). GCC versions the
// strided loop itself and was 25% slower with the separate loop, so it keeps the one loop.
template <typename T>
SL_INLINE_ROW_COPIES void col2im_planes(T* __restrict dst, const T* __restrict src, compute_t<T>* __restrict acc,
                                        int64_t N, int64_t C, int64_t H, int64_t W, const Conv2dGeometry& g,
                                        int64_t b, int64_t e) {
  using C_t = compute_t<T>;
  const int64_t OHW = g.out_h * g.out_w, K = g.kernel_h * g.kernel_w, sw = g.stride_w;
  for (int64_t nc = b; nc < e; ++nc) {
    const int64_t n = nc / C, c = nc % C;
    SL_SHORT_ROW_LOOP
    for (int64_t p = 0; p < H * W; ++p) acc[p] = C_t(0);
    for (int64_t r = 0; r < K; ++r) {
      const int64_t i = r / g.kernel_w, j = r % g.kernel_w;
      const T* crow = src + ((c * K + r) * N + n) * OHW;
      const int64_t off = j * g.dilation_w - g.pad_w;
      const auto [lo, hi] = inside_range(g.out_w, sw, off, W);
      for (int64_t oh = 0; oh < g.out_h; ++oh) {
        const int64_t ih = oh * g.stride_h - g.pad_h + i * g.dilation_h;
        if (ih < 0 || ih >= H) continue;
        C_t* arow = acc + ih * W + off;
        const T* cr = crow + oh * g.out_w;
#if defined(__clang__)
        if (sw == 1) {
          SL_SHORT_ROW_LOOP
          for (int64_t ow = lo; ow < hi; ++ow) arow[ow] += C_t(cr[ow]);
          continue;
        }
#endif
        for (int64_t ow = lo; ow < hi; ++ow) arow[ow * sw] += C_t(cr[ow]);
      }
    }
    T* plane = dst + nc * H * W;
    SL_SHORT_ROW_LOOP
    for (int64_t p = 0; p < H * W; ++p) plane[p] = convert<T>(acc[p]);
  }
}

}  // namespace

// The adjoint of im2col: every column entry is added back to the pixel it came from.
void col2im(const Tensor& x, const Tensor& cols, const Conv2dGeometry& g) {
  SL_DISPATCH_FLOAT(x.dtype(), "col2im", [&] {
    using C_t = compute_t<scalar_t>;
    scalar_t* dst = x.data<scalar_t>();
    const scalar_t* src = cols.data<scalar_t>();
    const int64_t N = x.shape()[0], C = x.shape()[1], H = x.shape()[2], W = x.shape()[3];
    const int64_t OHW = g.out_h * g.out_w, K = g.kernel_h * g.kernel_w;
    // One (n, c) plane per task: the plane's pixels receive from all of its K column rows, so planes are
    // independent and the sum per pixel is always taken in the same order.
    parallel_range(N * C, [&](int64_t b, int64_t e) {
      std::vector<C_t> acc(static_cast<size_t>(H * W));
      col2im_planes(dst, src, acc.data(), N, C, H, W, g, b, e);
    }, K * OHW);
  });
}

namespace {

// (take ? a : b) computed with bit masks (for 4- and 8-byte types). Which element of a pooling window is
// the maximum is unpredictable on real data; compiled as a jump (which GCC does for a plain ?: here) it
// mispredicts about every other element and made max pooling 5x slower.
template <typename F>
inline F select_bits(bool take, F a, F b) {
  static_assert(sizeof(F) == 4 || sizeof(F) == 8);
  using U = std::conditional_t<sizeof(F) == 4, uint32_t, uint64_t>;
  U ia, ib;
  std::memcpy(&ia, &a, sizeof(F));
  std::memcpy(&ib, &b, sizeof(F));
  const U m = U(0) - U(take);
  const U r = (ia & m) | (ib & ~m);
  F out;
  std::memcpy(&out, &r, sizeof(F));
  return out;
}

// Max pooling of one output row over columns [lo, hi) whose windows lie wholly inside the image, float32:
// the window offsets are the outer loops and the output columns the inner one, so the inner loop has no
// dependency between iterations and compiles to SIMD compares and masked selects (the per-output loop
// above is a serial chain of compare-and-select, about 5x slower). Same tie and nan rules.
void max_pool_row_f32(float* out, int64_t* idx, const float* plane, int64_t W, int64_t hs, int64_t he,
                      int64_t kw, int64_t sw, int64_t pw, int64_t lo, int64_t hi) {
  constexpr int64_t kBlock = 64;
  alignas(64) float best[kBlock];
  alignas(64) int32_t pos[kBlock];
  for (int64_t b0 = lo; b0 < hi; b0 += kBlock) {
    const int64_t n = std::min(kBlock, hi - b0);
    const int32_t first = int32_t(hs * W + b0 * sw - pw);
    for (int64_t t = 0; t < n; ++t) {
      best[t] = plane[first + t * sw];
      pos[t] = int32_t(first + t * sw);
    }
    for (int64_t ih = hs; ih < he; ++ih)
      for (int64_t j = (ih == hs ? 1 : 0); j < kw; ++j) {
        const int32_t base = int32_t(ih * W + b0 * sw - pw + j);
        const float* row = plane + base;
        for (int64_t t = 0; t < n; ++t) {
          const float v = row[t * sw];
          const bool take = (v > best[t]) | ((v != v) & (best[t] == best[t]));
          best[t] = take ? v : best[t];
          pos[t] = take ? int32_t(base + t * sw) : pos[t];
        }
      }
    for (int64_t t = 0; t < n; ++t) {
      out[b0 + t] = best[t];
      idx[b0 + t] = pos[t];
    }
  }
}

}  // namespace

void max_pool2d(const Tensor& out, const Tensor& argmax, const Tensor& x, const Pool2dGeometry& g) {
  SL_DISPATCH_FLOAT(x.dtype(), "max_pool2d", [&] {
    using C_t = compute_t<scalar_t>;
    const scalar_t* src = x.data<scalar_t>();
    scalar_t* dst = out.data<scalar_t>();
    int64_t* idx = argmax.data<int64_t>();
    const int64_t NC = x.shape()[0] * x.shape()[1], H = x.shape()[2], W = x.shape()[3];
    // Columns whose windows lie wholly inside the image take the SIMD row kernel (float32 planes with
    // 32-bit positions); the (at most padding-wide) borders and other dtypes the per-output loop.
    const bool fast_f32 = std::is_same_v<scalar_t, float> && H * W < (int64_t(1) << 31);
    const int64_t in_lo = std::min<int64_t>((g.pad_w + g.stride_w - 1) / g.stride_w, g.out_w);
    const int64_t in_hi = std::clamp<int64_t>((W + g.pad_w - g.kernel_w) / g.stride_w + 1, in_lo, g.out_w);
    parallel_range(NC, [&](int64_t b, int64_t e) {
      for (int64_t nc = b; nc < e; ++nc) {
        const scalar_t* plane = src + nc * H * W;
        for (int64_t oh = 0; oh < g.out_h; ++oh) {
          // The window clipped to the image once per row and column, so the inner loops carry no tests
          // (padding is at most half the kernel, so no window is empty).
          const int64_t h0 = oh * g.stride_h - g.pad_h;
          const int64_t hs = std::max<int64_t>(h0, 0), he = std::min<int64_t>(h0 + g.kernel_h, H);
          const int64_t o_row = (nc * g.out_h + oh) * g.out_w;
          if (fast_f32)
            max_pool_row_f32(reinterpret_cast<float*>(dst + o_row), idx + o_row,
                             reinterpret_cast<const float*>(plane), W, hs, he, g.kernel_w, g.stride_w, g.pad_w,
                             in_lo, in_hi);
          for (int64_t ow = 0; ow < g.out_w; ++ow) {
            if (fast_f32 && ow == in_lo) ow = in_hi;  // the interior is done
            if (ow >= g.out_w) break;
            const int64_t w0 = ow * g.stride_w - g.pad_w;
            const int64_t ws = std::max<int64_t>(w0, 0), we = std::min<int64_t>(w0 + g.kernel_w, W);
            // First maximum wins; a nan wins over everything, the first nan over later ones.
            int64_t best_i = hs * W + ws;
            C_t best = C_t(plane[best_i]);
            for (int64_t ih = hs; ih < he; ++ih)
              for (int64_t iw = ws; iw < we; ++iw) {
                const C_t v = C_t(plane[ih * W + iw]);
                const bool take = (v > best) | ((v != v) & (best == best));
                best = select_bits(take, v, best);
                best_i = select_bits(take, ih * W + iw, best_i);
              }
            dst[o_row + ow] = convert<scalar_t>(best);
            idx[o_row + ow] = best_i;
          }
        }
      }
    }, g.out_h * g.out_w * g.kernel_h * g.kernel_w);
  });
}

void max_pool2d_backward(const Tensor& dx, const Tensor& dy, const Tensor& argmax) {
  SL_DISPATCH_FLOAT(dx.dtype(), "max_pool2d_backward", [&] {
    using C_t = compute_t<scalar_t>;
    scalar_t* d = dx.data<scalar_t>();
    const scalar_t* g = dy.data<scalar_t>();
    const int64_t* idx = argmax.data<int64_t>();
    const int64_t NC = dx.shape()[0] * dx.shape()[1], HW = dx.shape()[2] * dx.shape()[3];
    const int64_t OHW = dy.shape()[2] * dy.shape()[3];
    parallel_range(NC, [&](int64_t b, int64_t e) {
      std::vector<C_t> acc(static_cast<size_t>(HW));
      for (int64_t nc = b; nc < e; ++nc) {
        std::fill(acc.begin(), acc.end(), C_t(0));
        for (int64_t o = 0; o < OHW; ++o) {
          const int64_t i = idx[nc * OHW + o];
          if (i >= 0) acc[i] += C_t(g[nc * OHW + o]);
        }
        for (int64_t p = 0; p < HW; ++p) d[nc * HW + p] = convert<scalar_t>(acc[p]);
      }
    }, HW + OHW);
  });
}

// Average over the window; count_include_pad divides by the full window, otherwise by the pixels inside.
void avg_pool2d(const Tensor& out, const Tensor& x, const Pool2dGeometry& g, bool count_include_pad) {
  SL_DISPATCH_FLOAT(x.dtype(), "avg_pool2d", [&] {
    using C_t = compute_t<scalar_t>;
    const scalar_t* src = x.data<scalar_t>();
    scalar_t* dst = out.data<scalar_t>();
    const int64_t NC = x.shape()[0] * x.shape()[1], H = x.shape()[2], W = x.shape()[3];
    parallel_range(NC, [&](int64_t b, int64_t e) {
      for (int64_t nc = b; nc < e; ++nc) {
        const scalar_t* plane = src + nc * H * W;
        for (int64_t oh = 0; oh < g.out_h; ++oh)
          for (int64_t ow = 0; ow < g.out_w; ++ow) {
            C_t s = 0;
            int64_t inside = 0;
            for (int64_t i = 0; i < g.kernel_h; ++i) {
              const int64_t ih = oh * g.stride_h - g.pad_h + i;
              if (ih < 0 || ih >= H) continue;
              for (int64_t j = 0; j < g.kernel_w; ++j) {
                const int64_t iw = ow * g.stride_w - g.pad_w + j;
                if (iw < 0 || iw >= W) continue;
                s += C_t(plane[ih * W + iw]);
                ++inside;
              }
            }
            const int64_t count = count_include_pad ? g.kernel_h * g.kernel_w : std::max<int64_t>(inside, 1);
            dst[(nc * g.out_h + oh) * g.out_w + ow] = convert<scalar_t>(s / C_t(count));
          }
      }
    }, g.out_h * g.out_w * g.kernel_h * g.kernel_w);
  });
}

void avg_pool2d_backward(const Tensor& dx, const Tensor& dy, const Pool2dGeometry& g, bool count_include_pad) {
  SL_DISPATCH_FLOAT(dx.dtype(), "avg_pool2d_backward", [&] {
    using C_t = compute_t<scalar_t>;
    scalar_t* d = dx.data<scalar_t>();
    const scalar_t* gy = dy.data<scalar_t>();
    const int64_t NC = dx.shape()[0] * dx.shape()[1], H = dx.shape()[2], W = dx.shape()[3];
    parallel_range(NC, [&](int64_t b, int64_t e) {
      std::vector<C_t> acc(static_cast<size_t>(H * W));
      for (int64_t nc = b; nc < e; ++nc) {
        std::fill(acc.begin(), acc.end(), C_t(0));
        for (int64_t oh = 0; oh < g.out_h; ++oh)
          for (int64_t ow = 0; ow < g.out_w; ++ow) {
            const int64_t h0 = oh * g.stride_h - g.pad_h, w0 = ow * g.stride_w - g.pad_w;
            const int64_t hs = std::max<int64_t>(h0, 0), he = std::min<int64_t>(h0 + g.kernel_h, H);
            const int64_t ws = std::max<int64_t>(w0, 0), we = std::min<int64_t>(w0 + g.kernel_w, W);
            const int64_t inside = std::max<int64_t>((he - hs) * (we - ws), 0);
            const int64_t count = count_include_pad ? g.kernel_h * g.kernel_w : std::max<int64_t>(inside, 1);
            const C_t share = C_t(gy[(nc * g.out_h + oh) * g.out_w + ow]) / C_t(count);
            for (int64_t ih = hs; ih < he; ++ih)
              for (int64_t iw = ws; iw < we; ++iw) acc[ih * W + iw] += share;
          }
        for (int64_t p = 0; p < H * W; ++p) d[nc * H * W + p] = convert<scalar_t>(acc[p]);
      }
    }, H * W + g.out_h * g.out_w * g.kernel_h * g.kernel_w);
  });
}

}  // namespace sl::cpu
