// Element-wise reduction of P staged buffers, the arithmetic core of the shm collectives.
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace sl::comm {

enum class CommOp : int32_t { kSum = 0, kAvg, kMax, kMin, kProd };
const char* comm_op_name(CommOp op);

// dst[i] = srcs[0][i] (op) srcs[1][i] (op) ... (op) srcs[n-1][i] for i < count, folded in exactly that
// order so that the result does not depend on timing or on which rank computes it. float16 and
// bfloat16 are accumulated in float32 and rounded once; avg divides the sum by n in the accumulation type, so it
// overflows only where the float32 sum would (the wide-sum branch of the avg rule, singa_lite/comm/averaging.py:
// no division before summing here). Integer sum and prod wrap around like numpy's.
// max and min propagate NaN like numpy.maximum / numpy.minimum. dst may be one of the sources.
void reduce_into(DType dtype, CommOp op, const char* const* srcs, int n, char* dst, int64_t count);

}  // namespace sl::comm
