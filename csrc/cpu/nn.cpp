// Neural-network kernels that are not plain element-wise / reduction / GEMM work:
// im2col / col2im (convolution as GEMM) and 2-D pooling. Inputs are contiguous NCHW.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <type_traits>
#include <vector>

#include "core/errors.h"
#include "cpu/isa.h"
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
// wheel's clang (zig) links its own memcpy / memset, slower than glibc's on short rows, which made im2col slower
// there than in the GCC build (docs/benchmarks/cpu_core.md, "Measurements behind the kernels' design"). GCC keeps
// its calls into glibc.
// The rows' loops are vectorised without unrolling under clang: its default (4 vectors per iteration) leaves
// an 8-pixel row entirely to the scalar remainder loop.
#if defined(__clang__)
#define SL_INLINE_ROW_COPIES __attribute__((no_builtin("memcpy", "memmove", "memset")))
#define SL_SHORT_ROW_LOOP _Pragma("clang loop interleave_count(1)")
#else
#define SL_INLINE_ROW_COPIES __attribute__((optimize("no-tree-loop-distribute-patterns")))
#define SL_SHORT_ROW_LOOP
#endif

namespace {

// Copies n elements of a short row (n >= 32 bytes) in 32-byte moves, the last one overlapping the one before
// when n is not a multiple: a few moves per row, where a loop with a run-time trip count (or the memmove call
// GCC makes of it) cost about 12 cycles per row, and LeNet's second im2col has 256000 rows of 8 pixels.
template <typename T>
SL_INLINE_ROW_COPIES inline void copy_short_row(T* __restrict out, const T* __restrict in, int64_t n) {
  typedef char Bytes32 __attribute__((vector_size(32), aligned(1), may_alias));
  constexpr int64_t V = 32 / int64_t(sizeof(T));
  for (int64_t k = 0; k + V <= n; k += V)
    *reinterpret_cast<Bytes32*>(out + k) = *reinterpret_cast<const Bytes32*>(in + k);
  if (n % V != 0) *reinterpret_cast<Bytes32*>(out + n - V) = *reinterpret_cast<const Bytes32*>(in + n - V);
}

// Blocks [b, e) of (c, i, j, n) of im2col, in the order of cols: each block is one image's OH x OW columns
// for one kernel offset, and consecutive blocks are adjacent in cols, so the writes stream through memory.
// (In image order, (n, c, i, j), consecutive blocks lay N * OH * OW elements apart: every block a new page
// and new cache lines to fetch before writing.)
// The images' planes are read with a stride, but x is small next to cols and stays in cache.
template <typename T>
SL_INLINE_ROW_COPIES void im2col_rows(T* __restrict dst, const T* __restrict src, int64_t N, int64_t C, int64_t H, int64_t W,
                                      const Conv2dGeometry& g, int64_t b, int64_t e) {
  const int64_t OHW = g.out_h * g.out_w, out_w = g.out_w, sw = g.stride_w;
  const T zero = convert<T>(0.0);
  // The block's kernel offset (c, i, j) and its columns' range change once every N blocks: counted, not
  // divided out per block (seven 64-bit divisions per 64-pixel block cost more than the copying).
  int64_t r = b / N, n = b % N;
  int64_t c = 0, i = 0, j = 0, off = 0, lo = 0, hi = 0;
  // Whole rows inside the image, copied 32 bytes at a time: the common case (stride 1, no column of the
  // block in the padding). Tested per block; the rows then run without a test.
  bool whole_rows = false;
  auto offset_changed = [&] {
    c = r / (g.kernel_h * g.kernel_w), i = (r / g.kernel_w) % g.kernel_h, j = r % g.kernel_w;
    off = j * g.dilation_w - g.pad_w;
    std::tie(lo, hi) = inside_range(out_w, sw, off, W);
    whole_rows = sw == 1 && lo == 0 && hi == out_w && out_w * int64_t(sizeof(T)) >= 32;
  };
  offset_changed();
  for (int64_t rn = b; rn < e; ++rn) {
    const T* plane = src + (n * C + c) * H * W;
    T* out = dst + rn * OHW;
    int64_t oh = 0;
    if (whole_rows) {
      // Output rows whose input row lies inside the image: [oh_lo, oh_hi).
      const int64_t first = i * g.dilation_h - g.pad_h;  // ih of row 0
      int64_t oh_lo = first >= 0 ? 0 : (-first + g.stride_h - 1) / g.stride_h;
      int64_t oh_hi = first >= H ? 0 : (H - 1 - first) / g.stride_h + 1;
      oh_lo = std::min(oh_lo, g.out_h), oh_hi = std::clamp(oh_hi, oh_lo, g.out_h);
      for (; oh < oh_lo; ++oh)
        for (int64_t ow = 0; ow < out_w; ++ow) out[oh * out_w + ow] = zero;
      const T* irow = plane + (first + oh_lo * g.stride_h) * W + off;
      for (; oh < oh_hi; ++oh, irow += g.stride_h * W) copy_short_row(out + oh * out_w, irow, out_w);
      for (; oh < g.out_h; ++oh)
        for (int64_t ow = 0; ow < out_w; ++ow) out[oh * out_w + ow] = zero;
    }
    for (; oh < g.out_h; ++oh) {
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
    if (++n == N && rn + 1 < e) {
      n = 0;
      ++r;
      offset_changed();
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

// What col2im needs of one kernel offset r = (i, j), the same for every plane: the column range [lo, hi)
// inside the image, the output rows [oh_lo, oh_hi) whose input row is inside, and where row oh_lo lands.
struct Col2imOffset {
  int64_t lo, hi, oh_lo, oh_hi, first_pixel;
};

inline std::vector<Col2imOffset> col2im_offsets(int64_t H, int64_t W, const Conv2dGeometry& g) {
  std::vector<Col2imOffset> out(static_cast<size_t>(g.kernel_h * g.kernel_w));
  for (int64_t r = 0; r < g.kernel_h * g.kernel_w; ++r) {
    const int64_t i = r / g.kernel_w, j = r % g.kernel_w;
    const int64_t off = j * g.dilation_w - g.pad_w, first = i * g.dilation_h - g.pad_h;  // row 0's ih
    const auto [lo, hi] = inside_range(g.out_w, g.stride_w, off, W);
    int64_t oh_lo = first >= 0 ? 0 : (-first + g.stride_h - 1) / g.stride_h;
    int64_t oh_hi = first >= H ? 0 : (H - 1 - first) / g.stride_h + 1;
    oh_lo = std::min(oh_lo, g.out_h), oh_hi = std::clamp(oh_hi, oh_lo, g.out_h);
    out[size_t(r)] = {lo, hi, oh_lo, oh_hi, (first + oh_lo * g.stride_h) * W + off};
  }
  return out;
}

// Planes [b, e) of (n, c) of col2im, summed in acc (H * W entries, or the plane itself when T is its own
// compute type); see col2im. The geometry of each kernel offset is computed once per call (offsets), so the
// rows run without divisions or bounds tests. Short rows, as in im2col_rows: inline loops (no memmove /
// memset calls), and a separate contiguous loop for stride 1 (clang, without run-time stride versioning,
// leaves the strided form scalar).
template <typename T>
SL_INLINE_ROW_COPIES void col2im_planes(T* __restrict dst, const T* __restrict src, compute_t<T>* __restrict acc,
                                        int64_t N, int64_t C, int64_t H, int64_t W, const Conv2dGeometry& g,
                                        const Col2imOffset* offsets, int64_t b, int64_t e) {
  using C_t = compute_t<T>;
  constexpr bool direct = std::is_same_v<C_t, T>;
  const int64_t OHW = g.out_h * g.out_w, K = g.kernel_h * g.kernel_w, sw = g.stride_w, out_w = g.out_w;
  const int64_t row_step = g.stride_h * W;
  int64_t n = b / C, c = b % C;
  for (int64_t nc = b; nc < e; ++nc) {
    C_t* sum = direct ? reinterpret_cast<C_t*>(dst + nc * H * W) : acc;
    SL_SHORT_ROW_LOOP
    for (int64_t p = 0; p < H * W; ++p) sum[p] = C_t(0);
    for (int64_t r = 0; r < K; ++r) {
      const Col2imOffset& o = offsets[r];
      const T* cr = src + ((c * K + r) * N + n) * OHW + o.oh_lo * out_w;
      C_t* arow = sum + o.first_pixel;
      for (int64_t oh = o.oh_lo; oh < o.oh_hi; ++oh, cr += out_w, arow += row_step) {
        if (sw == 1) {
          SL_SHORT_ROW_LOOP
          for (int64_t ow = o.lo; ow < o.hi; ++ow) arow[ow] += C_t(cr[ow]);
        } else {
          for (int64_t ow = o.lo; ow < o.hi; ++ow) arow[ow * sw] += C_t(cr[ow]);
        }
      }
    }
    if constexpr (!direct) {
      T* plane = dst + nc * H * W;
      SL_SHORT_ROW_LOOP
      for (int64_t p = 0; p < H * W; ++p) plane[p] = convert<T>(acc[p]);
    }
    if (++c == C) c = 0, ++n;
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
    const std::vector<Col2imOffset> offsets = col2im_offsets(H, W, g);
    parallel_range(N * C, [&](int64_t b, int64_t e) {
      std::vector<C_t> acc(std::is_same_v<C_t, scalar_t> ? 0 : static_cast<size_t>(H * W));
      col2im_planes(dst, src, acc.data(), N, C, H, W, g, offsets.data(), b, e);
    }, K * OHW);
  });
}

namespace {

// (take ? a : b) computed with bit masks (for 4- and 8-byte types). Which element of a pooling window is
// the maximum is unpredictable on real data; compiled as a jump (which GCC does for a plain ?: here) it
// mispredicts about every other element, which dominates max pooling's time.
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
// above is a serial chain of compare-and-select). Same tie and nan rules.
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

// The pooling of nearly every CNN: 2x2 windows, stride 2, no padding, float32. In two passes, each a long
// loop without dependencies between iterations (so vectorised, with stride-2 loads), instead of one short
// loop per output row (12 outputs wide after LeNet's first convolution, 4 after its second): first each used
// input row's column pairs (hbest / hpos: 2*OH rows of OW), then each pair of those rows. The windows'
// elements meet in the order of the general loop (row-major: the top pair, then the bottom pair), so the
// first maximum and the first nan win as there. Planes whose rows and columns all pair up (H and W even) are
// taken kPlaneBlock elements at a time as one tall image, so small planes (8x8) do not pay a call each.
struct MaxPool2x2F32 {
  static constexpr int64_t kPlaneBlock = 8192;  // input elements per pass: the scratch stays in L1 / L2

  // v wins over best: greater, or the first nan.
  static inline bool takes(float v, float best) { return (v > best) | ((v != v) & (best == best)); }

  // Rows [0, 2*R) of an image of width W into hbest / hpos (positions counted from `image`).
  static SL_ISA_INLINE void pairs(const float* __restrict image, int64_t W, int64_t R, int64_t OW,
                                  float* __restrict hbest, int32_t* __restrict hpos) {
    if (W == 2 * OW) {  // the used rows are contiguous: one loop over all their column pairs
      for (int64_t t = 0; t < 2 * R * OW; ++t) {
        const float a = image[2 * t], b = image[2 * t + 1];
        const bool take = takes(b, a);
        hbest[t] = select_bits(take, b, a);
        hpos[t] = int32_t(2 * t) + int32_t(take);
      }
      return;
    }
    for (int64_t r = 0; r < 2 * R; ++r)
      for (int64_t ow = 0; ow < OW; ++ow) {
        const float a = image[r * W + 2 * ow], b = image[r * W + 2 * ow + 1];
        const bool take = takes(b, a);
        hbest[r * OW + ow] = select_bits(take, b, a);
        hpos[r * OW + ow] = int32_t(r * W + 2 * ow) + int32_t(take);
      }
  }

  // Output rows [0, R) from the row pairs; each row's positions less `shift(row)` (its plane's offset).
  template <typename Shift>
  static SL_ISA_INLINE void rows(float* __restrict out, int64_t* __restrict idx, int64_t R, int64_t OW,
                                 const float* __restrict hbest, const int32_t* __restrict hpos, Shift shift) {
    for (int64_t r = 0; r < R; ++r) {
      const float* top = hbest + 2 * r * OW;
      const int32_t* top_pos = hpos + 2 * r * OW;
      const int64_t base = shift(r);
      for (int64_t ow = 0; ow < OW; ++ow) {
        const bool take = takes(top[OW + ow], top[ow]);
        out[r * OW + ow] = select_bits(take, top[OW + ow], top[ow]);
        idx[r * OW + ow] = int64_t(select_bits(take, top_pos[OW + ow], top_pos[ow])) - base;
      }
    }
  }

  // Planes [0, planes) of H x W -> OH x OW. hbest / hpos hold max(kPlaneBlock, H * W) / 2 entries.
  template <Isa Level>
  static SL_ISA_INLINE void run(float* out, int64_t* idx, const float* src, int64_t planes, int64_t H, int64_t W,
                                int64_t OH, int64_t OW, float* hbest, int32_t* hpos) {
    if (H == 2 * OH && W == 2 * OW) {
      const int64_t block = std::max<int64_t>(1, kPlaneBlock / (H * W));
      for (int64_t p0 = 0; p0 < planes; p0 += block) {
        const int64_t n = std::min(block, planes - p0);
        pairs(src + p0 * H * W, W, n * OH, OW, hbest, hpos);
        rows(out + p0 * OH * OW, idx + p0 * OH * OW, n * OH, OW, hbest, hpos,
             [=](int64_t r) { return (r / OH) * H * W; });
      }
      return;
    }
    for (int64_t p = 0; p < planes; ++p) {  // a row or column left over: plane by plane
      pairs(src + p * H * W, W, OH, OW, hbest, hpos);
      rows(out + p * OH * OW, idx + p * OH * OW, OH, OW, hbest, hpos, [](int64_t) { return int64_t(0); });
    }
  }
};

// The AVX2 copy on AVX-512 CPUs too: with 16 lanes, the rows of a small image (12 outputs wide after LeNet's first
// convolution) fall to the remainder loops, which makes the AVX-512 copy the slower one
// (docs/benchmarks/cpu_core.md, "Measurements behind the kernels' design"). The results are the same bits on every
// level.
template <class... Args>
void run_pool_2x2(Args... args) {
#ifdef SL_MULTI_ISA
  if (active_isa() != Isa::kBaseline) return isa_detail::run_avx2<MaxPool2x2F32>(args...);
#endif
  MaxPool2x2F32::run<Isa::kBaseline>(args...);
}

}  // namespace

void max_pool2d(const Tensor& out, const Tensor& argmax, const Tensor& x, const Pool2dGeometry& g) {
  SL_DISPATCH_FLOAT(x.dtype(), "max_pool2d", [&] {
    using C_t = compute_t<scalar_t>;
    const scalar_t* src = x.data<scalar_t>();
    scalar_t* dst = out.data<scalar_t>();
    int64_t* idx = argmax.data<int64_t>();
    const int64_t NC = x.shape()[0] * x.shape()[1], H = x.shape()[2], W = x.shape()[3];
    if constexpr (std::is_same_v<scalar_t, float>) {
      if (g.kernel_h == 2 && g.kernel_w == 2 && g.stride_h == 2 && g.stride_w == 2 && g.pad_h == 0 &&
          g.pad_w == 0 && H * W < (int64_t(1) << 31)) {
        const int64_t OH = g.out_h, OW = g.out_w;
        parallel_range(NC, [&](int64_t b, int64_t e) {
          std::vector<float> hbest(static_cast<size_t>(std::max(MaxPool2x2F32::kPlaneBlock, H * W) / 2));
          std::vector<int32_t> hpos(hbest.size());
          run_pool_2x2(reinterpret_cast<float*>(dst + b * OH * OW), idx + b * OH * OW,
                       reinterpret_cast<const float*>(src + b * H * W), e - b, H, W, OH, OW, hbest.data(),
                       hpos.data());
        }, 2 * H * W);
        return;
      }
    }
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

// dx = 0, then dy added at each window's argmax. The positions are checked here, in the same pass (the other
// backends check them with two reductions before their kernel): one outside [-1, H*W) raises IndexError,
// naming the range of the positions given. float32 adds into dx directly; the narrower types through a
// float plane (compute_t), rounded once.
void max_pool2d_backward(const Tensor& dx, const Tensor& dy, const Tensor& argmax) {
  const int64_t NC = dx.shape()[0] * dx.shape()[1], HW = dx.shape()[2] * dx.shape()[3];
  const int64_t OHW = dy.shape()[2] * dy.shape()[3];
  const int64_t* idx = argmax.data<int64_t>();
  std::atomic<bool> bad{false};
  SL_DISPATCH_FLOAT(dx.dtype(), "max_pool2d_backward", [&] {
    using C_t = compute_t<scalar_t>;
    scalar_t* d = dx.data<scalar_t>();
    const scalar_t* g = dy.data<scalar_t>();
    parallel_range(NC, [&](int64_t b, int64_t e) {
      constexpr bool direct = std::is_same_v<C_t, scalar_t>;
      std::vector<C_t> plane(direct ? 0 : static_cast<size_t>(HW));
      bool out_of_range = false;
      for (int64_t nc = b; nc < e; ++nc) {
        C_t* acc = direct ? reinterpret_cast<C_t*>(d + nc * HW) : plane.data();
        std::fill(acc, acc + HW, C_t(0));
        const int64_t* pos = idx + nc * OHW;
        const scalar_t* grad = g + nc * OHW;
        for (int64_t o = 0; o < OHW; ++o) {
          const int64_t i = pos[o];
          // One unsigned compare for i < -1 || i >= HW; -1 (a window wholly in the padding) adds nothing.
          out_of_range |= uint64_t(i + 1) > uint64_t(HW);
          if (i >= 0 && i < HW) acc[i] += C_t(grad[o]);
        }
        if constexpr (!direct)
          for (int64_t p = 0; p < HW; ++p) d[nc * HW + p] = convert<scalar_t>(acc[p]);
      }
      if (out_of_range) bad.store(true, std::memory_order_relaxed);
    }, HW + OHW);
  });
  if (bad.load()) {
    const int64_t n = argmax.numel();
    const auto [lo, hi] = std::minmax_element(idx, idx + n);
    throw IndexError(str("max_pool2d_backward: argmax must hold positions in [-1, ", HW,
                         ") of an input image of shape ", shape_str(dx.shape()), ", got values in [", *lo, ", ", *hi,
                         "]; pass the argmax that max_pool2d returned for this input"));
  }
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
