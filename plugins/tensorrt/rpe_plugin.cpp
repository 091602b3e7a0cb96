// RpePlugin: shapes, types and formats for the builder, and the enqueue that calls the kernels.
#include <new>
#include <utility>

#include "irpe_kernels.h"
#include "rpe_plugin.h"

namespace irpe_trt {

namespace {

bool to_irpe(DataType t, irpe_dtype& out)
{
    switch (t) {
    case DataType::kFLOAT: out = IRPE_FLOAT32; return true;
    case DataType::kHALF: out = IRPE_FLOAT16; return true;
    case DataType::kBF16: out = IRPE_BFLOAT16; return true;
    default: return false;
    }
}

bool to_irpe(DataType t, irpe_index_dtype& out)
{
    switch (t) {
    case DataType::kINT32: out = IRPE_INT32; return true;
    case DataType::kINT64: out = IRPE_INT64; return true;
    default: return false;
    }
}

// Dense row-major problem from the dims of the 4-D input [B, H, Lq, last].
irpe_problem make_problem(Dims const& in, int64_t lk, int64_t num_buckets)
{
    irpe_problem p{};
    p.batch = in.d[0];
    p.heads = in.d[1];
    p.lq = in.d[2];
    p.lk = lk;
    p.num_buckets = num_buckets;
    p.stride[3] = 1;
    p.stride[2] = in.d[3];
    p.stride[1] = in.d[2] * in.d[3];
    p.stride[0] = in.d[1] * p.stride[1];
    return p;
}

}  // namespace

RpePlugin::RpePlugin(RPEConfig config)
    : mConfig(std::move(config))
{
}

IPluginCapability* RpePlugin::getCapabilityInterface(PluginCapabilityType type) noexcept
{
    switch (type) {
    case PluginCapabilityType::kCORE: return static_cast<IPluginV3OneCore*>(this);
    case PluginCapabilityType::kBUILD: return static_cast<IPluginV3OneBuild*>(this);
    case PluginCapabilityType::kRUNTIME: return static_cast<IPluginV3OneRuntime*>(this);
    }
    return nullptr;
}

IPluginV3* RpePlugin::clone() noexcept { return new (std::nothrow) RpePlugin(mConfig); }

char const* RpePlugin::getPluginName() const noexcept { return plugin_name(mConfig.op, mConfig.on_the_fly()); }
char const* RpePlugin::getPluginVersion() const noexcept { return kVersion; }
char const* RpePlugin::getPluginNamespace() const noexcept { return kNamespace; }
int32_t RpePlugin::getNbOutputs() const noexcept { return 1; }

int32_t RpePlugin::configurePlugin(DynamicPluginTensorDesc const* /*in*/, int32_t nbInputs,
                                   DynamicPluginTensorDesc const* /*out*/, int32_t nbOutputs) noexcept
{
    return (nbInputs == 2 && nbOutputs == 1) ? 0 : -1;
}

int32_t RpePlugin::getOutputDataTypes(DataType* outputTypes, int32_t nbOutputs,
                                      DataType const* inputTypes, int32_t nbInputs) const noexcept
{
    if (nbOutputs != 1 || nbInputs != 2) {
        return -1;
    }
    outputTypes[0] = inputTypes[0];  // same dtype as the table / attention weights
    return 0;
}

int32_t RpePlugin::getOutputShapes(DimsExprs const* inputs, int32_t nbInputs,
                                   DimsExprs const* /*shapeInputs*/, int32_t /*nbShapeInputs*/,
                                   DimsExprs* outputs, int32_t nbOutputs,
                                   IExprBuilder& exprBuilder) noexcept
{
    if (nbInputs != 2 || nbOutputs != 1 || inputs[0].nbDims != 4 ||
        (mConfig.on_the_fly() ? inputs[1].nbDims < 2 : inputs[1].nbDims != 2)) {
        log_error(std::string(plugin_name(mConfig.op, mConfig.on_the_fly())) +
                  ": expected inputs [B,H,Lq,*] and an index [Lq,Lk] (or a [..,H,W] grid tensor)");
        return -1;
    }
    outputs[0].nbDims = 4;
    for (int d = 0; d < 3; ++d) {
        outputs[0].d[d] = inputs[0].d[d];
    }
    if (mConfig.op == Op::kGather && !mConfig.on_the_fly()) {
        outputs[0].d[2] = inputs[1].d[0];  // Lq of the index (a 1-row table is broadcast)
    }
    if (mConfig.op == Op::kScatter) {
        outputs[0].d[3] = exprBuilder.constant(mConfig.num_buckets);
    } else {  // self-attention: on the fly Lk = Lq; else Lk is the index width
        outputs[0].d[3] = mConfig.on_the_fly() ? inputs[0].d[2] : inputs[1].d[1];
    }
    return 0;
}

bool RpePlugin::supportsFormatCombination(int32_t pos, DynamicPluginTensorDesc const* inOut,
                                          int32_t nbInputs, int32_t nbOutputs) noexcept
{
    if (nbInputs != 2 || nbOutputs != 1 || inOut[pos].desc.format != TensorFormat::kLINEAR) {
        return false;
    }
    DataType const t = inOut[pos].desc.type;
    irpe_dtype value_type;
    irpe_index_dtype index_type;
    switch (pos) {
    case 0: return to_irpe(t, value_type);
    case 1:  // index ids, or (on the fly) only the dims of this tensor are used
        return to_irpe(t, index_type) || (mConfig.on_the_fly() && to_irpe(t, value_type));
    default: return t == inOut[0].desc.type;
    }
}

std::string RpePlugin::check_dims(Dims const& a, Dims const& b, Dims const& out) const
{
    if (a.nbDims != 4 || out.nbDims != 4) {
        return "expected 4-D input and output";
    }
    if (mConfig.op == Op::kGather && mConfig.num_buckets > 0 && a.d[3] != mConfig.num_buckets) {
        return "table has " + std::to_string(a.d[3]) + " buckets, num_buckets is " +
               std::to_string(mConfig.num_buckets);
    }
    if (mConfig.on_the_fly()) {
        irpe_bucket_params p;
        int64_t const h = b.nbDims >= 2 ? b.d[b.nbDims - 2] : 0, w = b.nbDims >= 2 ? b.d[b.nbDims - 1] : 0;
        if (irpe_bucket_params_init(&p, mConfig.method_id(), mConfig.ratio, h, w, mConfig.skip) != IRPE_OK ||
            a.d[2] != mConfig.skip + h * w || (mConfig.op == Op::kScatter && a.d[3] != a.d[2])) {
            return "on-the-fly ids need Lq = Lk = skip + H*W with (H, W) the last dims of input 1";
        }
        return {};
    }
    bool const broadcast = mConfig.op == Op::kGather && a.d[2] == 1;  // one table row for all
    if (b.nbDims != 2 || (b.d[0] != a.d[2] && !broadcast) ||
        (mConfig.op == Op::kScatter && b.d[1] != a.d[3])) {
        return "index must be [Lq, Lk] matching input 0 (a gather table may have 1 row)";
    }
    return {};
}

int32_t RpePlugin::onShapeChange(PluginTensorDesc const* in, int32_t nbInputs,
                                 PluginTensorDesc const* out, int32_t nbOutputs) noexcept
{
    if (nbInputs != 2 || nbOutputs != 1) {
        return -1;
    }
    std::string const error = check_dims(in[0].dims, in[1].dims, out[0].dims);
    if (!error.empty()) {
        log_error(std::string(plugin_name(mConfig.op, mConfig.on_the_fly())) + ": " + error);
        return -1;
    }
    return 0;
}

int32_t RpePlugin::enqueue(PluginTensorDesc const* inputDesc, PluginTensorDesc const* outputDesc,
                           void const* const* inputs, void* const* outputs, void* /*workspace*/,
                           cudaStream_t stream) noexcept
{
    Dims const& a = inputDesc[0].dims;
    Dims const& b = inputDesc[1].dims;
    irpe_dtype dtype;
    irpe_index_dtype index_dtype = IRPE_INT32;
    if (!to_irpe(inputDesc[0].type, dtype) ||
        (!mConfig.on_the_fly() && !to_irpe(inputDesc[1].type, index_dtype)) ||
        !check_dims(a, b, outputDesc[0].dims).empty()) {
        return -1;
    }
    bool const gather = mConfig.op == Op::kGather;
    int64_t const lk = gather ? outputDesc[0].dims.d[3] : a.d[3];
    irpe_problem p = make_problem(a, lk, gather ? a.d[3] : mConfig.num_buckets);
    if (gather && !mConfig.on_the_fly() && a.d[2] == 1) {  // one table row serves every query
        p.lq = b.d[0];
        p.stride[2] = 0;
    }
    int status;
    if (mConfig.on_the_fly()) {
        irpe_bucket_params params;
        irpe_bucket_params_init(&params, mConfig.method_id(), mConfig.ratio, b.d[b.nbDims - 2],
                                b.d[b.nbDims - 1], mConfig.skip);
        status = gather ? irpe_gather_grid(&p, dtype, inputs[0], &params, outputs[0], stream)
                        : irpe_scatter_grid(&p, dtype, inputs[0], &params, outputs[0], stream);
    } else {
        status = gather ? irpe_gather(&p, dtype, inputs[0], index_dtype, inputs[1], outputs[0], stream)
                        : irpe_scatter(&p, dtype, inputs[0], index_dtype, inputs[1], outputs[0], stream);
    }
    if (status != IRPE_OK) {
        log_error(std::string(plugin_name(mConfig.op, mConfig.on_the_fly())) + " launch failed: " + irpe_last_error());
    }
    return status == IRPE_OK ? 0 : -1;
}

IPluginV3* RpePlugin::attachToContext(IPluginResourceContext* /*context*/) noexcept { return clone(); }

PluginFieldCollection const* RpePlugin::getFieldsToSerialize() noexcept
{
    mFields.clear();
    if (mConfig.num_buckets > 0) {
        mFields.emplace_back("num_buckets", &mConfig.num_buckets, PluginFieldType::kINT32, 1);
    }
    if (mConfig.on_the_fly()) {
        mFields.emplace_back("method", mConfig.method.c_str(), PluginFieldType::kCHAR,
                             static_cast<int32_t>(mConfig.method.size()));
        mFields.emplace_back("ratio", &mConfig.ratio, PluginFieldType::kFLOAT32, 1);
        mFields.emplace_back("skip", &mConfig.skip, PluginFieldType::kINT32, 1);
    }
    mFieldCollection.nbFields = static_cast<int32_t>(mFields.size());
    mFieldCollection.fields = mFields.data();
    return &mFieldCollection;
}

}  // namespace irpe_trt
