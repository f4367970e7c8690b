#pragma once
// Shape-inference helpers shared by the op families.

#include "ir/graph.hpp"
#include "ir/op.hpp"
#include <popart/error.hpp>

#include <string>
#include <vector>

namespace popart::ir {

/// Numpy-style broadcast of \p a and \p b; throws naming \p op if incompatible.
Shape broadcastShapes(const Shape &a, const Shape &b, const Op &op);
/// \p axis in [-rank, rank) made non-negative; throws naming \p op if out of range.
int64_t normalizeAxis(int64_t axis, int64_t rank, const Op &op);
/// Each axis normalised; duplicates are an error.
std::vector<int64_t> normalizeAxes(const std::vector<int64_t> &axes, int64_t rank, const Op &op);

/// Shape arithmetic on values a model sets (attributes, dimensions): \p a + \p b, \p a * \p b, or
/// an error naming \p op, \p what and the operands if the result is past int64 (signed overflow is
/// undefined behaviour).
int64_t checkedAdd(const Op &op, int64_t a, int64_t b, const std::string &what);
int64_t checkedMul(const Op &op, int64_t a, int64_t b, const std::string &what);

/// \p v as "[a,b,c]" with negative values as they are (toString(Shape) shows them as "?", an unknown
/// dimension): for pads, starts, steps, Reshape's spec and other lists of integers in messages.
std::string intsToString(const std::vector<int64_t> &v);

/// setup(): output 0 has the info of input 0.
void setupSameAsInput0(Op &op);
/// setup(): output 0 has input 0's shape with type \p type.
void setupSameShape(Op &op, DataType type);
/// Throws naming \p op unless input \p i has one of \p types.
void requireType(const Op &op, size_t i, std::initializer_list<DataType> types);
/// Throws naming \p op unless it has between \p min and \p max inputs.
void requireInputCount(const Op &op, size_t min, size_t max);

/// Registration helper: one def over [minVersion, maxVersion] in the default domain.
OpDef makeDef(const char *type, int minVersion, int maxVersion, void (*setup)(Op &));

/// Canonicalisation helper: replaces attribute \p attr (ints) by a new constant INT64 input at
/// \p index; leaves the op unchanged if the attribute is absent.
void moveIntsAttributeToInput(Op &op, Graph &graph, const char *attr, size_t index);
/// Replaces attribute \p attr (float) by a scalar constant input of input 0's type at \p index.
void moveFloatAttributeToInput(Op &op, Graph &graph, const char *attr, size_t index, DataType type);

} // namespace popart::ir
