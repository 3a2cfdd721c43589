// The mpi backend's hot path (singa_lite/comm/mpi_hot.py): the per-call work of a collective, which costs more
// in Python than a small all_reduce itself (docs/benchmarks/communication.md, "the per-call work in C++"):
// counting the call on the arrival board, packing and starting the call-signature check, polling MPI_Test
// until done or the timeout (with the GIL released), comparing the signatures, and the small all_reduce fused
// into the check.
//
// MPI is not linked: the functions come by dlsym from the libmpi that mpi4py already loaded (dlopen of its
// path with RTLD_NOLOAD), and handles are those of mpi4py's objects. That is only sound for the MPICH ABI
// (MPICH, Intel MPI, MVAPICH: handles are C ints, MPI_IN_PLACE is (void*)-1, MPI_STATUS_IGNORE is
// (MPI_Status*)1); mpi.py checks the ABI before it makes one of these and otherwise keeps its Python path.
// Policies (which calls fuse, the messages, what a mismatch breaks) stay in mpi.py: this only returns a
// status that mpi.py turns into its exception.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace sl::comm {

// What a call of MpiHotPath ended with; mpi.py raises accordingly.
enum class MpiStatus : int {
  kDone = 0,          // finished (and the signatures matched)
  kTimeout = 1,       // not finished within the timeout: the communicator is broken
  kMismatch = 2,      // the ranks' signatures differ (the slots hold every rank's): mpi.py builds the message
  kMpiError = 3,      // an MPI call returned an error code: last_error()
  kReduceInPython = 4,  // fused all_reduce gathered and checked; mpi.py reduces the rows (float max / min)
  kNotHandled = 5       // nothing done: mpi.py's Python path does this call
};

// Handles and buffers of one MpiCommunicator, all owned by its Python side (which outlives this object).
struct MpiHotSetup {
  std::string library;           // path of the loaded MPICH-ABI libmpi (libmpi.so.12)
  int comm = 0;                  // MPI_Comm of the communicator's own Dup
  int win = 0;                   // MPI_Win of the arrival board
  intptr_t check_request = 0;    // address of the persistent signature all-gather's MPI_Request (in mpi4py's
                                 // object, so that mpi4py sees what MPI_Start / MPI_Test do to it); 0: none
  intptr_t slot = 0;             // this rank's slot: 6 int64 signature, then the fused data
  intptr_t slots = 0;            // every rank's slot after the all-gather, world_size rows
  int64_t slot_bytes = 0;        // bytes per slot (signature included)
  int world_size = 1;
  intptr_t entered = 0;          // int64: this rank's entry on the arrival board (window memory)
  intptr_t progress = 0;         // int64 slot on the watcher's progress board, 0: none
  std::vector<int> dtype_codes;  // DType -> the signature's dtype code (index in communicator.DTYPES), -1: none
  std::vector<int> mpi_types;    // DType -> MPI_Datatype for MPI's own reductions; 0: none (halves: Python)
  std::vector<int> mpi_ops;      // op code (communicator.REDUCE_OPS) -> MPI_Op ("avg" -> MPI_SUM)
  int all_reduce_kind = 0;       // the signature's kind code of all_reduce
  int avg_op = 1;                // the op code of "avg"
  int max_op = 2, min_op = 3;    // op codes whose float reduction stays in numpy (NaN and signed-zero bits)
  int request_null = 0;          // MPI_REQUEST_NULL
  int64_t spin_ns = 10'000;      // poll without yielding this long, then sched_yield ...
  int64_t yield_ns = 50'000'000; // ... until this long, then sleep between polls (as mpi.py's SPIN_S)
};

class MpiHotPath {
 public:
  // Throws ValueError when the library or one of its functions cannot be found.
  MpiHotPath(MpiHotSetup setup, std::function<void()> check_signals);
  ~MpiHotPath();
  MpiHotPath(const MpiHotPath&) = delete;
  MpiHotPath& operator=(const MpiHotPath&) = delete;

  // Counts a call on the arrival board; when `check`, packs its signature (kind, dtype code, count, root,
  // op code, call number) and `payload` (a fused all_reduce's data) into the slot and starts the check.
  void enter(int kind, int dtype_code, int64_t count, int root, int op, bool check, const void* payload = nullptr,
             size_t payload_bytes = 0);

  // An all_reduce, in place, by the same rules as mpi.py's Python path: with `check` and when it fits the
  // check's slot (nbytes <= slot_bytes - 48) the data rides in the check's all-gather and every rank's row is
  // reduced here in rank order (kReduceInPython for float max / min and the 2-byte floats); otherwise
  // MPI_Iallreduce started next to the check, "avg" divided after. kNotHandled, before anything is done,
  // for what mpi.py does itself: a tensor not contiguous on the CPU, "avg" of integers, 2-byte floats that do
  // not fit, more than INT_MAX elements. On kMismatch the data request stays pending: drain() waits for it.
  MpiStatus all_reduce(const Tensor& t, int op, bool check, double timeout);

  // Waits for the check started by enter() (if any: it is compared first; a mismatch returns at once) and for
  // the MPI_Request at `request` (an mpi4py object's handle; 0: none), at most `timeout` seconds.
  MpiStatus wait(intptr_t request, double timeout);

  // After kMismatch from all_reduce(): whether its data request ended within `seconds` (MPI errors count as
  // ended: a truncated message ends the collective).
  bool drain(double seconds);

  bool check_active() const { return check_active_; }
  int last_error() const { return last_error_; }
  // Whether a fused all_reduce of this tensor's dtype can reduce here (else kReduceInPython).
  bool reduces_here(DType dtype, int op) const;

  struct Api;  // the dlsym'd entry points (mpi_hot.cpp)

 private:
  template <typename Settled>
  MpiStatus poll(Settled&& settled, double timeout);
  int test(int* request, bool* done);  // MPI_Test; returns the MPI error code
  MpiStatus settle_check(bool* pending);
  void reduce_rows(const Tensor& t, int op) const;
  MpiStatus fused_all_reduce(const Tensor& t, int op, double timeout);
  MpiStatus mpi_all_reduce(const Tensor& t, int op, bool check, double timeout);

  MpiHotSetup s_;
  std::function<void()> check_signals_;
  std::unique_ptr<Api> api_;
  bool check_active_ = false;
  int pending_;  // the data request of all_reduce(); request_null when none
  int last_error_ = 0;
};

}  // namespace sl::comm
