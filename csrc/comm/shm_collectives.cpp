// The collectives of ShmComm: local argument checks, then chunked data movement through the slots.
//
// Every collective moves its data in chunks that fit a slot, with the same two-step pattern:
//   stage:   each rank copies its part of the chunk into its own slot      -> sync
//   combine: ranks read the slots (reduce, copy out) or write `result`     -> sync
//   (all_reduce / reduce only: every rank, or the root, copies `result` out)
// Two rules make one sync per step enough, across chunks and across calls:
//   (a) before a call's first sync a rank writes only its own slot and its own descriptor;
//   (b) after a call's last sync a rank reads only `result`, which nobody writes before the next
//       call's first sync (which needs this rank to have arrived, i.e. finished reading).
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

// Per chunk: stage it in my slot; sync; reduce my 1/P share of it over all slots into `result`; sync;
// copy `result` out. Every rank does 1/P of the arithmetic, and each element is reduced exactly once.
void ShmComm::all_reduce_impl(Op& op, char* data, int64_t n, DType dtype, CommOp cop, bool copy_out) {
  const size_t isz = itemsize(dtype);
  const int64_t cap = int64_t(seg_.layout().slot_bytes / isz);
  const int64_t align = int64_t(64 / isz);  // shares start on cache lines: no two ranks write one line
  std::array<const char*, kMaxWorldSize> srcs;
  for (int64_t off = 0; off < n; off += cap) {
    const int64_t c = std::min(cap, n - off);
    std::memcpy(seg_.slot(rank_), data + off * isz, size_t(c) * isz);
    sync(op);
    const int64_t share = ceil_div(ceil_div(c, P_), align) * align;
    const int64_t b = std::min(c, rank_ * share);
    const int64_t e = std::min(c, b + share);
    if (b < e) {
      for (int q = 0; q < P_; ++q) srcs[q] = seg_.slot(q) + b * isz;
      reduce_into(dtype, cop, srcs.data(), P_, seg_.result() + b * isz, e - b);
    }
    sync(op);
    if (copy_out) std::memcpy(data + off * isz, seg_.result(), size_t(c) * isz);
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
  const int64_t n = t.numel(), cap = int64_t(seg_.layout().slot_bytes / isz);
  char* data = bytes_of(t);
  for (int64_t off = 0; off < n; off += cap) {
    const size_t bytes = size_t(std::min(cap, n - off)) * isz;
    if (rank_ == root) std::memcpy(seg_.slot(root), data + off * isz, bytes);
    sync(op);
    if (rank_ != root) std::memcpy(data + off * isz, seg_.slot(root), bytes);
    sync(op);  // everyone has read the slot before the root refills it
  }
  finish(op);
}

// ---------------------------------------------------------------- all_gather / gather

void ShmComm::all_gather(const Tensor& out, const Tensor& in) {
  check_tensor(out, "all_gather", "out");
  check_tensor(in, "all_gather", "input");
  check_same_dtype(out, in, "all_gather");
  check_blocks(out, in, P_, rank_, "all_gather", "out", "input");
  std::lock_guard<std::mutex> lock(op_mutex_);
  Op op = begin(OpKind::kAllGather, int32_t(in.dtype()), in.numel(), -1, -1);
  const size_t isz = in.itemsize();
  const int64_t n = in.numel(), cap = int64_t(seg_.layout().slot_bytes / isz);
  for (int64_t off = 0; off < n; off += cap) {
    const size_t bytes = size_t(std::min(cap, n - off)) * isz;
    std::memcpy(seg_.slot(rank_), bytes_of(in) + off * isz, bytes);
    sync(op);
    for (int q = 0; q < P_; ++q) std::memcpy(bytes_of(out) + (q * n + off) * isz, seg_.slot(q), bytes);
    sync(op);
  }
  finish(op);
}

void ShmComm::gather(const Tensor& out, const Tensor& in, int root) {
  check_tensor(in, "gather", "input");
  check_root(root, P_, "gather");
  if (rank_ == root) {
    check_tensor(out, "gather", "out (on the root)");
    check_same_dtype(out, in, "gather");
    check_blocks(out, in, P_, rank_, "gather", "out", "input");
  }
  std::lock_guard<std::mutex> lock(op_mutex_);
  Op op = begin(OpKind::kGather, int32_t(in.dtype()), in.numel(), root, -1);
  const size_t isz = in.itemsize();
  const int64_t n = in.numel(), cap = int64_t(seg_.layout().slot_bytes / isz);
  for (int64_t off = 0; off < n; off += cap) {
    const size_t bytes = size_t(std::min(cap, n - off)) * isz;
    std::memcpy(seg_.slot(rank_), bytes_of(in) + off * isz, bytes);
    sync(op);
    if (rank_ == root)
      for (int q = 0; q < P_; ++q) std::memcpy(bytes_of(out) + (q * n + off) * isz, seg_.slot(q), bytes);
    sync(op);
  }
  finish(op);
}

// ---------------------------------------------------------------- reduce_scatter / scatter

// Per chunk of the output: stage the chunk's P pieces (one per destination rank) in my slot; sync;
// rank r reduces piece r of every slot straight into its output; sync.
void ShmComm::reduce_scatter(const Tensor& out, const Tensor& in, CommOp cop) {
  check_tensor(out, "reduce_scatter", "out");
  check_tensor(in, "reduce_scatter", "input");
  check_same_dtype(out, in, "reduce_scatter");
  check_reduce_op(cop, in.dtype(), "reduce_scatter");
  check_blocks(in, out, P_, rank_, "reduce_scatter", "input", "out");
  std::lock_guard<std::mutex> lock(op_mutex_);
  Op op = begin(OpKind::kReduceScatter, int32_t(in.dtype()), out.numel(), -1, int32_t(cop));
  const size_t isz = in.itemsize();
  const int64_t n = out.numel(), cap = int64_t(seg_.layout().slot_bytes / (isz * size_t(P_)));
  std::array<const char*, kMaxWorldSize> srcs;
  for (int64_t off = 0; off < n; off += cap) {
    const int64_t c = std::min(cap, n - off);
    for (int q = 0; q < P_; ++q)
      std::memcpy(seg_.slot(rank_) + q * c * isz, bytes_of(in) + (q * n + off) * isz, size_t(c) * isz);
    sync(op);
    for (int q = 0; q < P_; ++q) srcs[q] = seg_.slot(q) + rank_ * c * isz;
    reduce_into(in.dtype(), cop, srcs.data(), P_, bytes_of(out) + off * isz, c);
    sync(op);
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
  const int64_t n = out.numel(), cap = int64_t(seg_.layout().slot_bytes / (isz * size_t(P_)));
  for (int64_t off = 0; off < n; off += cap) {
    const int64_t c = std::min(cap, n - off);
    if (rank_ == root)
      for (int q = 0; q < P_; ++q)
        std::memcpy(seg_.slot(root) + q * c * isz, bytes_of(in) + (q * n + off) * isz, size_t(c) * isz);
    sync(op);
    std::memcpy(bytes_of(out) + off * isz, seg_.slot(root) + rank_ * c * isz, size_t(c) * isz);
    sync(op);
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
