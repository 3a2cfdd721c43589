// Front-ends of the fused optimizer steps.
#include "ops/dispatch.h"
#include "ops/checks.h"
#include "ops/ops.h"

namespace sl {

void sgd_update_(const Tensor& param, const Tensor& grad, const Tensor& buf, const SgdStep& step) {
  const char* op = "sgd_update";
  check_defined(param, op, "param");
  check_defined(grad, op, "grad");
  check_floating(op, param);
  check_same_dtype(op, param, grad);
  check_same_device(op, param, grad);
  check_kernel_device(op, param);
  SL_CHECK(grad.shape() == param.shape(), ValueError, op, ": grad has shape ", shape_str(grad.shape()),
           " but param has shape ", shape_str(param.shape()));
  SL_CHECK(buf.defined() || step.momentum == 0, ValueError, op, ": momentum ", step.momentum,
           " needs a momentum buffer; pass buf (a tensor shaped like param)");
  SL_CHECK(!partial_overlap(param, grad) && param.data_ptr() != grad.data_ptr(), ValueError, op,
           ": grad must not share memory with param");
  if (buf.defined()) {
    check_same_dtype(op, param, buf);
    check_same_device(op, param, buf);
    SL_CHECK(buf.shape() == param.shape(), ValueError, op, ": buf has shape ", shape_str(buf.shape()),
             " but param has shape ", shape_str(param.shape()));
    SL_CHECK(!partial_overlap(buf, param) && buf.data_ptr() != param.data_ptr() &&
                 !partial_overlap(buf, grad) && buf.data_ptr() != grad.data_ptr(),
             ValueError, op, ": buf must not share memory with param or grad");
  }
  SL_KERNEL(param.device(), sgd_update, param, grad, buf, step);
}

}  // namespace sl
