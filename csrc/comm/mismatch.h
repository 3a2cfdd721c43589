// The one error every communicator raises when the ranks' calls of a collective differ.
#pragma once
#include "core/errors.h"

namespace sl::comm {

// The ranks called a collective with different arguments (operation, dtype, element count, root or op). Every
// rank raises it alike, naming what each rank passed. In Python: singa_lite.comm.CollectiveMismatch, a
// ValueError (bind_comm.cpp registers it), which the mpi and tcp backends raise too.
struct CollectiveMismatch : ValueError {
  using ValueError::ValueError;
};

}  // namespace sl::comm
