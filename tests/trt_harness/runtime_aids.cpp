// Logger, expression builder (runtime_aids.h).
#include "runtime_aids.h"

#include <algorithm>
#include <cstdio>

namespace harness {

void Logger::log(Severity severity, AsciiChar const* msg) noexcept
{
    if (severity <= Severity::kERROR) {
        errors.emplace_back(msg ? msg : "");
    }
    std::fprintf(stderr, "[trt log %d] %s\n", static_cast<int>(severity), msg ? msg : "");
}

ConstExpr::ConstExpr(int64_t v)
{
    impl.value = v;
    mImpl = &impl;
}

IDimensionExpr const* ExprBuilderImpl::constant(int64_t value)
{
    made.emplace_back(new ConstExpr(value));
    return made.back().get();
}

IDimensionExpr const* ExprBuilderImpl::operation(DimensionOperation op, IDimensionExpr const& first,
                                                 IDimensionExpr const& second)
{
    if (!first.isConstant() || !second.isConstant()) {
        return nullptr;
    }
    int64_t const a = first.getConstantValue(), b = second.getConstantValue();
    int64_t v = 0;
    switch (op) {
    case DimensionOperation::kSUM: v = a + b; break;
    case DimensionOperation::kPROD: v = a * b; break;
    case DimensionOperation::kMAX: v = std::max(a, b); break;
    case DimensionOperation::kMIN: v = std::min(a, b); break;
    case DimensionOperation::kSUB: v = a - b; break;
    case DimensionOperation::kEQUAL: v = a == b; break;
    case DimensionOperation::kLESS: v = a < b; break;
    case DimensionOperation::kFLOOR_DIV:
        if (b == 0) return nullptr;
        v = a / b - ((a % b != 0) && ((a < 0) != (b < 0)));
        break;
    case DimensionOperation::kCEIL_DIV:
        if (b == 0) return nullptr;
        v = a / b + ((a % b != 0) && ((a < 0) == (b < 0)));
        break;
    }
    return constant(v);
}

DimsExprs ExprBuilder::exprs(Dims const& dims)
{
    DimsExprs e{};
    e.nbDims = dims.nbDims;
    for (int32_t d = 0; d < dims.nbDims; ++d) {
        e.d[d] = impl.constant(dims.d[d]);
    }
    return e;
}

}  // namespace harness
