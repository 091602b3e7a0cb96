// What TensorRT hands a plugin and the harness must therefore provide itself: a logger (through
// an ILoggerFinder), a dimension-expression builder that evaluates constant shapes, and a
// resource context for attachToContext. Implemented behind the headers' real interfaces.
#ifndef IRPE_TRT_HARNESS_RUNTIME_AIDS_H
#define IRPE_TRT_HARNESS_RUNTIME_AIDS_H

#include <NvInferRuntime.h>

#include <memory>
#include <string>
#include <vector>

namespace harness {

using namespace nvinfer1;

struct Logger : ILogger {
    std::vector<std::string> errors;  // kERROR and worse
    void log(Severity severity, AsciiChar const* msg) noexcept override;
};

struct LoggerFinder : ILoggerFinder {
    Logger logger;
    ILogger* findLogger() noexcept override { return &logger; }
};

// A constant dimension expression (every shape the harness feeds is known).
struct ConstExprImpl : apiv::VDimensionExpr {
    int64_t value = 0;
    bool isConstant() const override { return true; }
    int64_t getConstantValue() const override { return value; }
    bool isSizeTensor() const override { return false; }
};
struct ConstExpr : IDimensionExpr {
    ConstExprImpl impl;
    explicit ConstExpr(int64_t v);
};

// Evaluates constant(), operation() on constants; declareSizeTensor is not supported (nullptr).
struct ExprBuilderImpl : apiv::VExprBuilder {
    std::vector<std::unique_ptr<ConstExpr>> made;
    IDimensionExpr const* constant(int64_t value) override;
    IDimensionExpr const* operation(DimensionOperation op, IDimensionExpr const& first,
                                    IDimensionExpr const& second) override;
    IDimensionExpr const* declareSizeTensor(int32_t, IDimensionExpr const&,
                                            IDimensionExpr const&) override { return nullptr; }
};
struct ExprBuilder : IExprBuilder {
    ExprBuilderImpl impl;
    ExprBuilder() { mImpl = &impl; }
    DimsExprs exprs(Dims const& dims);  // constant expressions of concrete dims
};

// attachToContext's argument (TensorRT's own object; the headers say users do not derive from
// it, which is what TensorRT does): no GPU allocator, no error recorder.
struct ResourceContext : IPluginResourceContext {
    IGpuAllocator* getGpuAllocator() const noexcept override { return nullptr; }
    IErrorRecorder* getErrorRecorder() const noexcept override { return nullptr; }
};

}  // namespace harness

#endif  // IRPE_TRT_HARNESS_RUNTIME_AIDS_H
