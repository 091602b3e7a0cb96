// TEST DOUBLE, NOT TensorRT: declares only the subset of the TensorRT 10 plugin API that
// plugins/tensorrt uses (same names, signatures and pure virtuals as TensorRT 10), so that
// tests/test_kernels_trt_glue.py can compile and exercise the plugin glue on machines where
// the real headers cannot be installed. Real builds use the TensorRT headers (plugins/build.sh).
#pragma once
#include <cstddef>
#include <cstdint>

typedef struct CUstream_st* cudaStream_t;

namespace nvinfer1 {
using AsciiChar = char;
struct InterfaceInfo {
    char const* kind;
    int32_t major;
    int32_t minor;
};
class IVersionedInterface {
public:
    virtual InterfaceInfo getInterfaceInfo() const noexcept = 0;
    virtual ~IVersionedInterface() noexcept = default;
};
enum class PluginFieldType : int32_t {
    kFLOAT16 = 0, kFLOAT32 = 1, kFLOAT64 = 2, kINT8 = 3, kINT16 = 4, kINT32 = 5, kCHAR = 6,
    kDIMS = 7, kUNKNOWN = 8, kBF16 = 9, kINT64 = 10
};
class PluginField {
public:
    AsciiChar const* name;
    void const* data;
    PluginFieldType type;
    int32_t length;
    PluginField(AsciiChar const* name_ = nullptr, void const* data_ = nullptr,
                PluginFieldType type_ = PluginFieldType::kUNKNOWN, int32_t length_ = 0) noexcept
        : name(name_), data(data_), type(type_), length(length_) {}
};
struct PluginFieldCollection {
    int32_t nbFields{};
    PluginField const* fields{};
};
enum class TensorRTPhase : int32_t { kBUILD = 0, kRUNTIME = 1 };
enum class PluginCapabilityType : int32_t { kCORE = 0, kBUILD = 1, kRUNTIME = 2 };
enum class DataType : int32_t {
    kFLOAT = 0, kHALF = 1, kINT8 = 2, kINT32 = 3, kBOOL = 4, kUINT8 = 5, kFP8 = 6, kBF16 = 7,
    kINT64 = 8, kINT4 = 9
};
enum class TensorFormat : int32_t { kLINEAR = 0, kCHW2 = 1, kHWC8 = 2 };
class Dims64 {
public:
    static constexpr int32_t MAX_DIMS{8};
    int32_t nbDims;
    int64_t d[MAX_DIMS];
};
using Dims = Dims64;
class IDimensionExpr {
public:
    virtual bool isConstant() const noexcept = 0;
    virtual int64_t getConstantValue() const noexcept = 0;
protected:
    virtual ~IDimensionExpr() noexcept = default;
};
enum class DimensionOperation : int32_t { kSUM = 0, kPROD = 1 };
class IExprBuilder {
public:
    virtual IDimensionExpr const* constant(int64_t value) noexcept = 0;
    virtual IDimensionExpr const* operation(DimensionOperation op, IDimensionExpr const& first,
                                            IDimensionExpr const& second) noexcept = 0;
protected:
    virtual ~IExprBuilder() noexcept = default;
};
class DimsExprs {
public:
    int32_t nbDims;
    IDimensionExpr const* d[Dims::MAX_DIMS];
};
struct PluginTensorDesc {
    Dims dims;
    DataType type;
    TensorFormat format;
    float scale;
};
struct DynamicPluginTensorDesc {
    PluginTensorDesc desc;
    Dims min;
    Dims max;
    Dims opt;
};
class ILogger {
public:
    enum class Severity : int32_t { kINTERNAL_ERROR = 0, kERROR = 1, kWARNING = 2, kINFO = 3, kVERBOSE = 4 };
    virtual void log(Severity severity, AsciiChar const* msg) noexcept = 0;
    virtual ~ILogger() = default;
};
class ILoggerFinder {
public:
    virtual ILogger* findLogger() = 0;
protected:
    virtual ~ILoggerFinder() = default;
};
class IPluginResourceContext {
public:
    virtual ~IPluginResourceContext() noexcept = default;
};
class IPluginCapability : public IVersionedInterface {};
class IPluginV3 : public IVersionedInterface {
public:
    InterfaceInfo getInterfaceInfo() const noexcept override { return {"PLUGIN", 1, 0}; }
    virtual IPluginCapability* getCapabilityInterface(PluginCapabilityType type) noexcept = 0;
    virtual IPluginV3* clone() noexcept = 0;
};
class IPluginV3OneCore : public IPluginCapability {
public:
    InterfaceInfo getInterfaceInfo() const noexcept override { return {"PLUGIN_V3ONE_CORE", 1, 0}; }
    virtual AsciiChar const* getPluginName() const noexcept = 0;
    virtual AsciiChar const* getPluginVersion() const noexcept = 0;
    virtual AsciiChar const* getPluginNamespace() const noexcept = 0;
};
class IPluginV3OneBuild : public IPluginCapability {
public:
    InterfaceInfo getInterfaceInfo() const noexcept override { return {"PLUGIN_V3ONE_BUILD", 1, 0}; }
    virtual int32_t configurePlugin(DynamicPluginTensorDesc const* in, int32_t nbInputs,
                                    DynamicPluginTensorDesc const* out, int32_t nbOutputs) noexcept = 0;
    virtual int32_t getOutputDataTypes(DataType* outputTypes, int32_t nbOutputs,
                                       DataType const* inputTypes, int32_t nbInputs) const noexcept = 0;
    virtual int32_t getOutputShapes(DimsExprs const* inputs, int32_t nbInputs,
                                    DimsExprs const* shapeInputs, int32_t nbShapeInputs,
                                    DimsExprs* outputs, int32_t nbOutputs,
                                    IExprBuilder& exprBuilder) noexcept = 0;
    virtual bool supportsFormatCombination(int32_t pos, DynamicPluginTensorDesc const* inOut,
                                           int32_t nbInputs, int32_t nbOutputs) noexcept = 0;
    virtual int32_t getNbOutputs() const noexcept = 0;
    virtual size_t getWorkspaceSize(DynamicPluginTensorDesc const*, int32_t,
                                    DynamicPluginTensorDesc const*, int32_t) const noexcept { return 0; }
};
class IPluginV3OneRuntime : public IPluginCapability {
public:
    InterfaceInfo getInterfaceInfo() const noexcept override { return {"PLUGIN_V3ONE_RUNTIME", 1, 0}; }
    virtual int32_t setTactic(int32_t) noexcept { return 0; }
    virtual int32_t onShapeChange(PluginTensorDesc const* in, int32_t nbInputs,
                                  PluginTensorDesc const* out, int32_t nbOutputs) noexcept = 0;
    virtual int32_t enqueue(PluginTensorDesc const* inputDesc, PluginTensorDesc const* outputDesc,
                            void const* const* inputs, void* const* outputs, void* workspace,
                            cudaStream_t stream) noexcept = 0;
    virtual IPluginV3* attachToContext(IPluginResourceContext* context) noexcept = 0;
    virtual PluginFieldCollection const* getFieldsToSerialize() noexcept = 0;
};
class IPluginCreatorInterface : public IVersionedInterface {};
class IPluginCreatorV3One : public IPluginCreatorInterface {
public:
    InterfaceInfo getInterfaceInfo() const noexcept override { return {"PLUGIN CREATOR_V3ONE", 1, 0}; }
    virtual IPluginV3* createPlugin(AsciiChar const* name, PluginFieldCollection const* fc,
                                    TensorRTPhase phase) noexcept = 0;
    virtual PluginFieldCollection const* getFieldNames() noexcept = 0;
    virtual AsciiChar const* getPluginName() const noexcept = 0;
    virtual AsciiChar const* getPluginVersion() const noexcept = 0;
    virtual AsciiChar const* getPluginNamespace() const noexcept = 0;
};
class IPluginRegistry {
public:
    virtual bool registerCreator(IPluginCreatorInterface& creator,
                                 AsciiChar const* const pluginNamespace) noexcept = 0;
};
}  // namespace nvinfer1

extern "C" nvinfer1::IPluginRegistry* getPluginRegistry();
