// The collectives of ShmComm: local argument checks, then chunked data movement through the slots.
//
// Data moves in chunks that fit half a slot. Chunk k (counted over the communicator's life, the same on
// every rank) uses half k % 2 of every slot and of `result`:
//   stage:   each rank copies its part of the chunk into its own slot half   -> sync
//   read:    ranks read the slot halves (copy out, or reduce into their output)
// all_reduce above the small size (kSmallReduceBytes) splits the arithmetic instead:
//   stage -> sync -> rank r reduces its 1/P share into the result half -> sync -> every rank copies out.
// Why one sync per step is enough, across chunks and across calls: a rank writes a half for chunk k + 2
// only after the first sync of chunk k + 1, which every rank reaches only after it has finished reading
// chunk k. So no chunk needs a trailing "everyone has read" sync.
// The first sync of every call also compares the descriptors of all ranks (ShmComm::sync).
#include <algorithm>
#include <array>
#include <cstring>

#include "comm/shm_comm.h"
#include "core/errors.h"

namespace sl::comm {

namespace {

char* bytes_of(const Tensor& t) { return static_cast<char*>(t.data_ptr()); }

void check_tensor(const Tensor& t, const char* op, const char* what) {
  SL_CHECK(t.defined(), ValueError, op, ": ", what, " is None (undefined); pass a tensor");
  SL_CHECK(t.device().is_cpu(), ValueError, op, ": ", what, " is on ", t.device().str(),
           ", but the shm backend moves CPU tensors; copy it with .to(cpu) or use the nccl backend");
  SL_CHECK(t.dtype() != DType::kBool, TypeError, op, ": ", what,
           " is a bool tensor, which the shm backend does not reduce or move; cast it to int32 first");
  SL_CHECK(t.is_contiguous(), ValueError, op, ": ", what, " is not contiguous (shape ", shape_str(t.shape()),
           ", strides ", shape_str(t.strides()), "); pass a contiguous copy (contiguous()) and copy the result back");
}

void check_root(int root, int P, const char* op, const char* what = "root") {
  SL_CHECK(root >= 0 && root < P, ValueError, op, ": ", what, " must be in [0, ", P, "), got ", root);
}

void check_reduce_op(CommOp cop, DType dtype, const char* op) {
  SL_CHECK(!(cop == CommOp::kAvg && !is_floating(dtype)), TypeError, op, ": op 'avg' needs a floating dtype, got ",
           dtype_name(dtype), "; use op 'sum' and divide, or cast to float32 first");
}

void check_same_dtype(const Tensor& out, const Tensor& in, const char* op) {
  SL_CHECK(out.dtype() == in.dtype(), TypeError, op, ": dtypes differ (out is ", dtype_name(out.dtype()),
           ", input is ", dtype_name(in.dtype()), "); pass tensors of one dtype");
}

// `big` holds P blocks of small.numel() elements. `small` may be this rank's own block of `big` (an
// in-place call) or lie outside it; any other overlap would be read after it has been overwritten.
void check_blocks(const Tensor& big, const Tensor& small, int P, int rank, const char* op, const char* big_name,
                  const char* small_name) {
  const int64_t n = small.numel();
  SL_CHECK(big.numel() == int64_t(P) * n, ValueError, op, ": ", big_name, " must have world_size * ", small_name,
           ".numel() = ", P, " * ", n, " = ", int64_t(P) * n, " elements, got ", big.numel());
  if (n == 0) return;
  const char* b0 = bytes_of(big);
  const char* b1 = b0 + big.nbytes();
  const char* s0 = bytes_of(small);
  const char* s1 = s0 + small.nbytes();
  const bool disjoint = s1 <= b0 || b1 <= s0;
  SL_CHECK(disjoint || s0 == b0 + size_t(rank) * small.nbytes(), ValueError, op, ": ", small_name, " overlaps ",
           big_name, " other than as this rank's block ", big_name, "[", rank, " * n : (", rank,
           " + 1) * n]; pass separate tensors");
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// While P * bytes is at most this, an all_reduce takes one sync and every rank reduces the whole chunk
// itself: P times the arithmetic, but on a few KiB that costs less than a second sync (a futex round
// trip when ranks outnumber cores). The fold is the same either way, so results are bitwise the same.
constexpr size_t kSmallReduceBytes = 64 << 10;

}  // namespace

// ---------------------------------------------------------------- all_reduce / reduce

void ShmComm::all_reduce(const Tensor& t, CommOp cop) {
  check_tensor(t, "all_reduce", "tensor");
  check_reduce_op(cop, t.dtype(), "all_reduce");
  std::lock_guard<std::mutex> lock(op_mutex_);
  Op op = begin(OpKind::kAllReduce, int32_t(t.dtype()), t.numel(), -1, int32_t(cop));
  all_reduce_impl(op, bytes_of(t), t.numel(), t.dtype(), cop, /*copy_out=*/true);
}

void ShmComm::reduce(const Tensor& t, int root, CommOp cop) {
  check_tensor(t, "reduce", "tensor");
  check_root(root, P_, "reduce");
  check_reduce_op(cop, t.dtype(), "reduce");
  std::lock_guard<std::mutex> lock(op_mutex_);
  Op op = begin(OpKind::kReduce, int32_t(t.dtype()), t.numel(), root, int32_t(cop));
  // The same reduction as all_reduce (so the root's result is bitwise the all_reduce result); only the
  // root copies it out.
  all_reduce_impl(op, bytes_of(t), t.numel(), t.dtype(), cop, /*copy_out=*/rank_ == root);
}

// Per chunk, with [b, e) my 1/P share of it: stage the rest of the chunk in my slot half (nobody else
// reads my share of my data); sync; reduce my share over all ranks, reading my own part from `data`, and
// write it to `result` (and, when copying out, straight into `data`); sync; copy the other ranks'
// shares out of `result`. Every rank does 1/P of the arithmetic, and each element is reduced once.
// Leaving my share out of the staging and the copy-out saves a fifth of the memory traffic at P = 2.
void ShmComm::all_reduce_impl(Op& op, char* data, int64_t n, DType dtype, CommOp cop, bool copy_out) {
  const size_t isz = itemsize(dtype);
  const int64_t cap = int64_t(seg_.layout().half_bytes() / isz);
  std::array<const char*, kMaxWorldSize> srcs;
  if (n > 0 && size_t(n) * isz * size_t(P_) <= kSmallReduceBytes && size_t(n) * isz <= seg_.layout().half_bytes()) {
    const uint32_t h = next_half();
    std::memcpy(seg_.slot(rank_, h), data, size_t(n) * isz);
    sync(op);
    if (copy_out) {
      for (int q = 0; q < P_; ++q) srcs[q] = seg_.slot(q, h);
      reduce_into(dtype, cop, srcs.data(), P_, data, n);
    }
    return;
  }
  const int64_t align = int64_t(64 / isz);  // shares start on cache lines: no two ranks write one line
  for (int64_t off = 0; off < n; off += cap) {
    const int64_t c = std::min(cap, n - off);
    const int64_t share = ceil_div(ceil_div(c, P_), align) * align;
    const int64_t b = std::min(c, rank_ * share);
    const int64_t e = std::min(c, b + share);
    char* chunk = data + off * isz;
    const uint32_t h = next_half();
    char* mine = seg_.slot(rank_, h);
    std::memcpy(mine, chunk, size_t(b) * isz);
    std::memcpy(mine + e * isz, chunk + e * isz, size_t(c - e) * isz);
    sync(op);
    if (b < e) {
      for (int q = 0; q < P_; ++q) srcs[q] = q == rank_ ? chunk + b * isz : seg_.slot(q, h) + b * isz;
      char* res = seg_.result(h) + b * isz;
      if (copy_out) {  // in place: each block of my part is read before it is overwritten (reduce_into)
        reduce_into(dtype, cop, srcs.data(), P_, chunk + b * isz, e - b);
        std::memcpy(res, chunk + b * isz, size_t(e - b) * isz);
      } else {
        reduce_into(dtype, cop, srcs.data(), P_, res, e - b);
      }
    }
    sync(op);
    if (copy_out) {
      std::memcpy(chunk, seg_.result(h), size_t(b) * isz);
      std::memcpy(chunk + e * isz, seg_.result(h) + e * isz, size_t(c - e) * isz);
    }
  }
  finish(op);
}

// ---------------------------------------------------------------- broadcast

void ShmComm::broadcast(const Tensor& t, int root) {
  check_tensor(t, "broadcast", "tensor");
  check_root(root, P_, "broadcast");
  std::lock_guard<std::mutex> lock(op_mutex_);
  Op op = begin(OpKind::kBroadcast, int32_t(t.dtype()), t.numel(), root, -1);
  const size_t isz = t.itemsize();
  const int64_t n = t.numel(), cap = int64_t(seg_.layout().half_bytes() / isz);
  char* data = bytes_of(t);
  for (int64_t off = 0; off < n; off += cap) {
    const size_t bytes = size_t(std::min(cap, n - off)) * isz;
    const uint32_t h = next_half();
    if (rank_ == root) std::memcpy(seg_.slot(root, h), data + off * isz, bytes);
    sync(op);
    if (rank_ != root) std::memcpy(data + off * isz, seg_.slot(root, h), bytes);
  }
  finish(op);
}

// ---------------------------------------------------------------- all_gather / gather

void ShmComm::all_gather(const Tensor& out, const Tensor& in) {
  check_tensor(out, "all_gather", "out");
  check_tensor(in, "all_gather", "input");
  check_same_dtype(out, in, "all_gather");
  check_blocks(out, in, P_, rank_, "all_gather", "out", "input");
  gather_blocks(OpKind::kAllGather, out, in, -1);
}

void ShmComm::gather(const Tensor& out, const Tensor& in, int root) {
  check_tensor(in, "gather", "input");
  check_root(root, P_, "gather");
  if (rank_ == root) {
    check_tensor(out, "gather", "out (on the root)");
    check_same_dtype(out, in, "gather");
    check_blocks(out, in, P_, rank_, "gather", "out", "input");
  }
  gather_blocks(OpKind::kGather, out, in, root);
}

// Per chunk: every rank stages its block in its slot half; sync; the receivers (every rank, or the root)
// copy all P blocks out.
void ShmComm::gather_blocks(OpKind kind, const Tensor& out, const Tensor& in, int root) {
  std::lock_guard<std::mutex> lock(op_mutex_);
  Op op = begin(kind, int32_t(in.dtype()), in.numel(), root, -1);
  const bool receives = root < 0 || rank_ == root;
  const size_t isz = in.itemsize();
  const int64_t n = in.numel(), cap = int64_t(seg_.layout().half_bytes() / isz);
  for (int64_t off = 0; off < n; off += cap) {
    const size_t bytes = size_t(std::min(cap, n - off)) * isz;
    const uint32_t h = next_half();
    std::memcpy(seg_.slot(rank_, h), bytes_of(in) + off * isz, bytes);
    sync(op);
    if (receives)
      for (int q = 0; q < P_; ++q) std::memcpy(bytes_of(out) + (q * n + off) * isz, seg_.slot(q, h), bytes);
  }
  finish(op);
}

// ---------------------------------------------------------------- reduce_scatter / scatter

// Per chunk of the output: stage the chunk's pieces for the other ranks in my slot half; sync; rank r
// reduces piece r of every slot (its own from `in`) straight into its output.
void ShmComm::reduce_scatter(const Tensor& out, const Tensor& in, CommOp cop) {
  check_tensor(out, "reduce_scatter", "out");
  check_tensor(in, "reduce_scatter", "input");
  check_same_dtype(out, in, "reduce_scatter");
  check_reduce_op(cop, in.dtype(), "reduce_scatter");
  check_blocks(in, out, P_, rank_, "reduce_scatter", "input", "out");
  std::lock_guard<std::mutex> lock(op_mutex_);
  Op op = begin(OpKind::kReduceScatter, int32_t(in.dtype()), out.numel(), -1, int32_t(cop));
  const size_t isz = in.itemsize();
  const int64_t n = out.numel(), cap = int64_t(seg_.layout().half_bytes() / (isz * size_t(P_)));
  std::array<const char*, kMaxWorldSize> srcs;
  for (int64_t off = 0; off < n; off += cap) {
    const int64_t c = std::min(cap, n - off);
    const uint32_t h = next_half();
    for (int q = 0; q < P_; ++q)  // my own piece is read by me only: straight from `in` below
      if (q != rank_)
        std::memcpy(seg_.slot(rank_, h) + q * c * isz, bytes_of(in) + (q * n + off) * isz, size_t(c) * isz);
    sync(op);
    for (int q = 0; q < P_; ++q)
      srcs[q] = q == rank_ ? bytes_of(in) + (rank_ * n + off) * isz : seg_.slot(q, h) + rank_ * c * isz;
    // An in-place call (out is block `rank` of in) reads each block before overwriting it (reduce_into).
    reduce_into(in.dtype(), cop, srcs.data(), P_, bytes_of(out) + off * isz, c);
  }
  finish(op);
}

void ShmComm::scatter(const Tensor& out, const Tensor& in, int root) {
  check_tensor(out, "scatter", "out");
  check_root(root, P_, "scatter");
  if (rank_ == root) {
    check_tensor(in, "scatter", "input (on the root)");
    check_same_dtype(out, in, "scatter");
    check_blocks(in, out, P_, rank_, "scatter", "input", "out");
  }
  std::lock_guard<std::mutex> lock(op_mutex_);
  Op op = begin(OpKind::kScatter, int32_t(out.dtype()), out.numel(), root, -1);
  const size_t isz = out.itemsize();
  const int64_t n = out.numel(), cap = int64_t(seg_.layout().half_bytes() / (isz * size_t(P_)));
  for (int64_t off = 0; off < n; off += cap) {
    const int64_t c = std::min(cap, n - off);
    const uint32_t h = next_half();
    if (rank_ == root)
      for (int q = 0; q < P_; ++q)
        std::memcpy(seg_.slot(root, h) + q * c * isz, bytes_of(in) + (q * n + off) * isz, size_t(c) * isz);
    sync(op);
    std::memcpy(bytes_of(out) + off * isz, seg_.slot(root, h) + rank_ * c * isz, size_t(c) * isz);
  }
  finish(op);
}

// ---------------------------------------------------------------- barrier

void ShmComm::barrier() {
  std::lock_guard<std::mutex> lock(op_mutex_);
  Op op = begin(OpKind::kBarrier, -1, 0, -1, -1);
  finish(op);
}

}  // namespace sl::comm
