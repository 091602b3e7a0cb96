// TensorRT IPluginV3 plugins RPEGather and RPEScatter (namespace "irpe", version "1"), and
// RPEGatherGrid / RPEScatterGrid, the same ops with bucket ids computed on the fly.
//
// Thin glue: validate fields and shapes, map TensorRT types to the kernels' C ABI and call
// irpe_gather / irpe_scatter (or their on-the-fly *_grid variants) on the enqueue stream.
// Fields (ONNX node attributes of the same name; see plugins/tensorrt/README.md). Each creator
// advertises exactly the fields of its mode, so the ONNX parser warns about none:
//   num_buckets INT32   K: scatter output [B,H,Lq,K] (required); gather: checked against the
//                       table's last dim when set (export/ always sets it)
//   method      CHAR    *Grid only: euc|quant|product|cross_rows|cross_cols; input 1 is then any
//                       tensor whose last two dims are the grid (H, W). Without it (RPEGather,
//                       RPEScatter) input 1 is an index [Lq,Lk] (int32/int64)
//   ratio       FLOAT32 *Grid only: alpha = ratio, beta = 2 ratio, gamma = 8 ratio
//   skip        INT32   *Grid only: leading non-grid tokens (cls), default 0
#ifndef IRPE_TRT_RPE_PLUGIN_H
#define IRPE_TRT_RPE_PLUGIN_H

#include <NvInferRuntime.h>
#include <NvInferVersion.h>

#include <string>
#include <vector>

namespace irpe_trt {

using namespace nvinfer1;

enum class Op { kGather, kScatter };

char const* const kNamespace = "irpe";
char const* const kVersion = "1";

// Creation state of one plugin: exactly its serialized fields (int32, as getFieldsToSerialize
// points at them). irpe_ort::RPEConfig (plugins/onnxruntime/rpe_ort.h) is the same concept for
// an ONNX Runtime node: int64 attributes plus the forms fused at session load.
struct RPEConfig {
    Op op = Op::kGather;
    int32_t num_buckets = 0;
    std::string method;  // empty: index tensor input
    float ratio = 0.0f;
    int32_t skip = 0;

    bool on_the_fly() const { return !method.empty(); }
    int method_id() const;  // IRPE_METHOD_* of `method`, -1 if unknown
    // Empty when the fields make a usable plugin, else what is wrong.
    std::string validate() const;
};

// Parse a PluginFieldCollection (from the ONNX parser or a serialized engine).
bool parse_fields(PluginFieldCollection const* fc, RPEConfig& config, std::string& error);

// Creator / plugin name: RPEGather, RPEScatter, or with on-the-fly ids RPEGatherGrid, ...
char const* plugin_name(Op op, bool grid);

// ABI guard. A plugin library is tied to the TensorRT major whose headers compiled it (11.x
// moved ILogger / IVersionedInterface slots). IRPE_TRT_RUNTIME_MAJOR is the major that the
// runtime's getInferLibVersion() must report (CMake: the headers' major for libnvinfer, 1 for
// TensorRT-RTX built with 11.x headers).
#ifndef IRPE_TRT_RUNTIME_MAJOR
#define IRPE_TRT_RUNTIME_MAJOR NV_TENSORRT_MAJOR
#endif
// True when the loaded runtime has the expected major; otherwise says why on stderr, once.
bool runtime_compatible();

// Report an error through the logger TensorRT handed to setLoggerFinder (stderr otherwise).
void log_error(std::string const& message);
void set_logger_finder(ILoggerFinder* finder);

class RpePlugin : public IPluginV3,
                  public IPluginV3OneCore,
                  public IPluginV3OneBuild,
                  public IPluginV3OneRuntime {
public:
    explicit RpePlugin(RPEConfig config);

    // IPluginV3
    IPluginCapability* getCapabilityInterface(PluginCapabilityType type) noexcept override;
    IPluginV3* clone() noexcept override;

    // IPluginV3OneCore
    char const* getPluginName() const noexcept override;
    char const* getPluginVersion() const noexcept override;
    char const* getPluginNamespace() const noexcept override;

    // IPluginV3OneBuild
    int32_t configurePlugin(DynamicPluginTensorDesc const* in, int32_t nbInputs,
                            DynamicPluginTensorDesc const* out, int32_t nbOutputs) noexcept override;
    int32_t getOutputDataTypes(DataType* outputTypes, int32_t nbOutputs,
                               DataType const* inputTypes, int32_t nbInputs) const noexcept override;
    int32_t getOutputShapes(DimsExprs const* inputs, int32_t nbInputs, DimsExprs const* shapeInputs,
                            int32_t nbShapeInputs, DimsExprs* outputs, int32_t nbOutputs,
                            IExprBuilder& exprBuilder) noexcept override;
    bool supportsFormatCombination(int32_t pos, DynamicPluginTensorDesc const* inOut,
                                   int32_t nbInputs, int32_t nbOutputs) noexcept override;
    int32_t getNbOutputs() const noexcept override;

    // IPluginV3OneRuntime
    int32_t onShapeChange(PluginTensorDesc const* in, int32_t nbInputs, PluginTensorDesc const* out,
                          int32_t nbOutputs) noexcept override;
    int32_t enqueue(PluginTensorDesc const* inputDesc, PluginTensorDesc const* outputDesc,
                    void const* const* inputs, void* const* outputs, void* workspace,
                    cudaStream_t stream) noexcept override;
    IPluginV3* attachToContext(IPluginResourceContext* context) noexcept override;
    PluginFieldCollection const* getFieldsToSerialize() noexcept override;

private:
    // Empty when the input/output dims fit this plugin, else the reason.
    std::string check_dims(Dims const& a, Dims const& b, Dims const& out) const;

    RPEConfig mConfig;
    std::vector<PluginField> mFields;  // views of mConfig for getFieldsToSerialize
    PluginFieldCollection mFieldCollection{};
};

class RpeCreator : public IPluginCreatorV3One {
public:
    RpeCreator(Op op, bool grid);

    IPluginV3* createPlugin(char const* name, PluginFieldCollection const* fc,
                            TensorRTPhase phase) noexcept override;
    PluginFieldCollection const* getFieldNames() noexcept override;
    char const* getPluginName() const noexcept override;
    char const* getPluginVersion() const noexcept override;
    char const* getPluginNamespace() const noexcept override;

private:
    Op mOp;
    bool mGrid;
    std::vector<PluginField> mFieldNames;
    PluginFieldCollection mFieldCollection{};
};

}  // namespace irpe_trt

#endif  // IRPE_TRT_RPE_PLUGIN_H
