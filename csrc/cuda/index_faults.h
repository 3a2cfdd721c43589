// Index checks done on the GPU and reported at the next synchronisation, instead of a blocking copy of each index
// tensor's min / max to the host before every one_hot, take and index_add (one softmax cross-entropy step, and 2 + 2P
// per sparse DistOpt step, each waiting for the whole queue). The kernels compare every index with its bound anyway;
// one that is out of range is skipped (nothing is read or written through it) and recorded in a per-device fault
// record. The host looks at a flag in mapped pinned memory whenever it waits for the device on behalf of the user
// (Device.Sync, a copy to or from the host, the sparse selection's count) and raises IndexError there, naming the op,
// the bound and the range of the bad values. This is the finiteness vote's pattern: decided on the device, read when
// the host reads anyway. The CPU keeps checking before it writes anything, with its own messages.
//
// Where the mapped flag cannot be had (pinned memory refused, e.g. by a locked-memory limit), or with
// SINGA_LITE_SYNC_INDEX_CHECKS=1 (read once) / set_deferred_index_checks(false), the front-ends check on the host
// before the kernel, as the CPU does: the error then comes from the call itself, at the cost of the syncs.
#pragma once
#include <cstdint>

namespace sl::cuda {

// What the first kernel launch that met a bad index wrote. lo / hi start at INT64_MAX / INT64_MIN.
struct IndexFault {
  unsigned long long launch;  // 0: none; else the id of the launch that owns the record (the first to fault)
  long long lo, hi;           // the range of the out-of-range values that launch saw
  long long bound;            // indices had to lie in [0, bound)
  int op;                     // IndexOp
};

enum IndexOp : int { kOneHot = 1, kTake = 2, kIndexAdd = 3 };

// Passed by value to a kernel. record == nullptr: no record could be made, so the front-end checked on the host
// already and the kernel only skips bad indices, which cannot then occur.
struct IndexFaultSlot {
  IndexFault* record;
  int* host_flag;  // device pointer of the mapped flag
  unsigned long long launch;
  long long bound;
  int op;
};

// Whether the front-ends may leave the check of indices on `device` to the kernels (the record and the mapped flag
// exist, and deferred checks are on). Creates them on first use.
bool defers_index_checks(int device);
// A slot for one launch of `op` on `device` with indices that must lie in [0, bound); record == nullptr only when
// the record cannot exist (then the front-ends always check on the host).
IndexFaultSlot index_fault_slot(int device, IndexOp op, int64_t bound);
// Called right after the host has waited for `device`'s compute stream: throws IndexError when a kernel recorded a
// fault since the last report, and clears the record. Cheap when there is none (one read of the mapped flag).
void raise_index_faults(int device);
// The switch (tests, debugging): false makes the front-ends check on the host at the call.
void set_deferred_index_checks(bool enabled);
bool deferred_index_checks_enabled();

#ifdef __CUDACC__
// Records value v (known to be out of range) for the launch that owns s. Threads of a later launch leave the first
// fault's record alone, so the report names one op and one bound.
__device__ __forceinline__ void report_index_fault(const IndexFaultSlot& s, long long v) {
  if (s.record == nullptr) return;
  const unsigned long long owner = atomicCAS(&s.record->launch, 0ull, s.launch);
  if (owner != 0ull && owner != s.launch) return;
  atomicMin(&s.record->lo, v);
  atomicMax(&s.record->hi, v);
  s.record->bound = s.bound;  // every thread of the owning launch writes the same values
  s.record->op = s.op;
  *reinterpret_cast<volatile int*>(s.host_flag) = 1;  // seen by the host once it has waited for the stream
}

__device__ __forceinline__ bool index_in_range(const IndexFaultSlot& s, long long v) {
  if (v >= 0 && v < s.bound) return true;
  report_index_fault(s, v);
  return false;
}
#endif

}  // namespace sl::cuda
