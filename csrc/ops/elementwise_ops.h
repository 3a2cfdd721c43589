// The one list of element-wise ops. Everything that enumerates them is generated from here: the enums and
// their names (ops.h, ops/elementwise.cpp), the compile-time dispatch of both backends (with_binary_op /
// with_unary_op below), the module functions of the bindings, and _core.binary_ops() / unary_ops(), from which
// tensor.py and singa_lite/ops build their functions. Adding an op: a line here, its formula in
// cpu/elementwise.cpp's and cuda/elementwise.cu's apply_* (the kernels), and a test.
//
// X(enum, name) for binary ops: arithmetic first, then the comparisons (they return bool; is_comparison()
// relies on kEq being the first of them). relu_grad(y, dy) = sign(y) * dy, ReLU's backward from its output
// in one pass (the same bits as sign, then mul).
#pragma once
#include <type_traits>

#define SL_BINARY_OPS(X)                                                                              \
  X(kAdd, "add") X(kSub, "sub") X(kMul, "mul") X(kDiv, "div") X(kPow, "pow") X(kMaximum, "maximum")   \
  X(kMinimum, "minimum") X(kReluGrad, "relu_grad")                                                    \
  X(kEq, "eq") X(kNe, "ne") X(kLt, "lt") X(kLe, "le") X(kGt, "gt") X(kGe, "ge")

// X(enum, name, domain) for unary ops; domain: Numeric (every dtype but bool) or Floating (float dtypes).
#define SL_UNARY_OPS(X)                                                                                      \
  X(kNeg, "neg", Numeric) X(kAbs, "abs", Numeric) X(kSign, "sign", Numeric) X(kSquare, "square", Numeric)    \
  X(kRelu, "relu", Numeric)                                                                                  \
  X(kExp, "exp", Floating) X(kLog, "log", Floating) X(kSqrt, "sqrt", Floating) X(kTanh, "tanh", Floating)    \
  X(kSigmoid, "sigmoid", Floating) X(kReciprocal, "reciprocal", Floating) X(kSin, "sin", Floating)           \
  X(kCos, "cos", Floating) X(kFloor, "floor", Floating) X(kCeil, "ceil", Floating)                           \
  X(kRound, "round", Floating) X(kLog1p, "log1p", Floating) X(kExpm1, "expm1", Floating)                     \
  X(kErf, "erf", Floating) X(kSoftplus, "softplus", Floating)

namespace sl {

#define SL_ENUM_ENTRY(e, ...) e,
enum class BinaryOp { SL_BINARY_OPS(SL_ENUM_ENTRY) };
enum class UnaryOp { SL_UNARY_OPS(SL_ENUM_ENTRY) };
#undef SL_ENUM_ENTRY

#define SL_COUNT_ENTRY(...) +1
constexpr int kNumBinaryOps = 0 SL_BINARY_OPS(SL_COUNT_ENTRY);
constexpr int kNumUnaryOps = 0 SL_UNARY_OPS(SL_COUNT_ENTRY);
#undef SL_COUNT_ENTRY

enum class UnaryDomain { Numeric, Floating };
constexpr UnaryDomain unary_domain(UnaryOp op) {
#define SL_DOMAIN_CASE(e, name, domain) \
  case UnaryOp::e:                      \
    return UnaryDomain::domain;
  switch (op) { SL_UNARY_OPS(SL_DOMAIN_CASE) }
#undef SL_DOMAIN_CASE
  return UnaryDomain::Floating;
}

// Turns a runtime op into a compile-time one (std::integral_constant), so each (op, dtype) pair of a kernel
// gets its own tight loop. Used by both backends' kernels.
template <typename Fn>
inline void with_binary_op(BinaryOp op, Fn&& fn) {
#define SL_BINARY_CASE(e, name) \
  case BinaryOp::e:             \
    return fn(std::integral_constant<BinaryOp, BinaryOp::e>());
  switch (op) { SL_BINARY_OPS(SL_BINARY_CASE) }
#undef SL_BINARY_CASE
}

template <typename Fn>
inline void with_unary_op(UnaryOp op, Fn&& fn) {
#define SL_UNARY_CASE(e, name, domain) \
  case UnaryOp::e:                     \
    return fn(std::integral_constant<UnaryOp, UnaryOp::e>());
  switch (op) { SL_UNARY_OPS(SL_UNARY_CASE) }
#undef SL_UNARY_CASE
}

}  // namespace sl
