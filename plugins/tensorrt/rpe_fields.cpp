// Plugin fields (parse, validate), logging and the plugin creators.
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>

#include "irpe_kernels.h"
#include "irpe_methods.h"
#include "rpe_plugin.h"

namespace irpe_trt {

namespace {

ILoggerFinder* gLoggerFinder = nullptr;

bool read_int(PluginField const& f, int32_t& value)
{
    if (f.data == nullptr || f.length < 1) {
        return false;
    }
    switch (f.type) {
    case PluginFieldType::kINT32:
        value = *static_cast<int32_t const*>(f.data);
        return true;
    case PluginFieldType::kINT64: {
        int64_t const v = *static_cast<int64_t const*>(f.data);
        value = static_cast<int32_t>(v);
        return v == value;
    }
    default:
        return false;
    }
}

bool read_float(PluginField const& f, float& value)
{
    if (f.data == nullptr || f.length < 1) {
        return false;
    }
    if (f.type == PluginFieldType::kFLOAT32) {
        value = *static_cast<float const*>(f.data);
        return true;
    }
    if (f.type == PluginFieldType::kFLOAT64) {
        value = static_cast<float>(*static_cast<double const*>(f.data));
        return true;
    }
    return false;
}

bool read_string(PluginField const& f, std::string& value)
{
    if (f.type != PluginFieldType::kCHAR || (f.length > 0 && f.data == nullptr)) {
        return false;
    }
    value.assign(static_cast<char const*>(f.data), f.length > 0 ? f.length : 0);
    value.resize(std::strlen(value.c_str()));  // drop a trailing NUL if the length counted it
    return true;
}

// On the fly, num_buckets follows from method, ratio and skip: fill it in or check it.
std::string finish(RPEConfig& c)
{
    if (c.on_the_fly() && c.method_id() >= 0 && c.ratio > 0.0f) {
        irpe_bucket_params p;
        if (irpe_bucket_params_init(&p, c.method_id(), c.ratio, 1, 1, c.skip) == IRPE_OK) {
            if (c.num_buckets == 0) {
                c.num_buckets = p.num_buckets;
            } else if (c.num_buckets != p.num_buckets) {
                return "num_buckets " + std::to_string(c.num_buckets) + " does not match method " +
                       c.method + ", ratio and skip (" + std::to_string(p.num_buckets) + " buckets)";
            }
        }
    }
    return c.validate();
}

}  // namespace

int RPEConfig::method_id() const
{
    return irpe_method_id(method.c_str());
}

std::string RPEConfig::validate() const
{
    if (on_the_fly()) {
        if (method_id() < 0) {
            return "unknown method '" + method + "' (euc, quant, product, cross_rows, cross_cols)";
        }
        if (!(ratio > 0.0f) || skip < 0) {
            return "on-the-fly ids need ratio > 0 and skip >= 0";
        }
    }
    if (num_buckets < 0 || (op == Op::kScatter && num_buckets < 1)) {
        return "num_buckets must be >= 1 (RPEScatter: required)";
    }
    return {};
}

bool parse_fields(PluginFieldCollection const* fc, RPEConfig& config, std::string& error)
{
    for (int32_t i = 0; fc != nullptr && i < fc->nbFields; ++i) {
        PluginField const& f = fc->fields[i];
        std::string const name = f.name ? f.name : "";
        bool ok = true;
        if (name == "num_buckets") {
            ok = read_int(f, config.num_buckets);
        } else if (name == "skip") {
            ok = read_int(f, config.skip);
        } else if (name == "ratio") {
            ok = read_float(f, config.ratio);
        } else if (name == "method") {
            ok = read_string(f, config.method);
        }
        if (!ok) {
            error = "field '" + name + "' has an unsupported type or no data";
            return false;
        }
    }
    error = finish(config);
    return error.empty();
}

char const* plugin_name(Op op, bool grid)
{
    if (op == Op::kGather) {
        return grid ? "RPEGatherGrid" : "RPEGather";
    }
    return grid ? "RPEScatterGrid" : "RPEScatter";
}

// A finder from a runtime of another major has another vtable layout: never call it.
void set_logger_finder(ILoggerFinder* finder) { gLoggerFinder = runtime_compatible() ? finder : nullptr; }

void log_error(std::string const& message)
{
    std::string const text = std::string("[irpe plugin] ") + message;
    ILogger* logger = gLoggerFinder ? gLoggerFinder->findLogger() : nullptr;
    if (logger) {
        logger->log(ILogger::Severity::kERROR, text.c_str());
    } else {
        std::fprintf(stderr, "%s\n", text.c_str());
    }
}

RpeCreator::RpeCreator(Op op, bool grid)
    : mOp(op)
    , mGrid(grid)
{
    mFieldNames.emplace_back("num_buckets", nullptr, PluginFieldType::kINT32, 1);
    if (grid) {
        mFieldNames.emplace_back("method", nullptr, PluginFieldType::kCHAR, 0);
        mFieldNames.emplace_back("ratio", nullptr, PluginFieldType::kFLOAT32, 1);
        mFieldNames.emplace_back("skip", nullptr, PluginFieldType::kINT32, 1);
    }
    mFieldCollection.nbFields = static_cast<int32_t>(mFieldNames.size());
    mFieldCollection.fields = mFieldNames.data();
}

IPluginV3* RpeCreator::createPlugin(char const* name, PluginFieldCollection const* fc,
                                    TensorRTPhase /*phase*/) noexcept
{
    try {
        RPEConfig config;
        config.op = mOp;
        std::string error;
        bool ok = parse_fields(fc, config, error);
        if (ok && config.on_the_fly() != mGrid) {
            ok = false;
            error = mGrid ? "needs a method (on-the-fly ids)"
                          : "takes an index input; on-the-fly ids (method) are " +
                                std::string(plugin_name(mOp, true)) + "'s";
        }
        if (!ok) {
            log_error(std::string(plugin_name(mOp, mGrid)) + " '" + (name ? name : "") + "': " + error);
            return nullptr;
        }
        return new RpePlugin(config);
    } catch (std::exception const& e) {
        log_error(e.what());
        return nullptr;
    }
}

PluginFieldCollection const* RpeCreator::getFieldNames() noexcept { return &mFieldCollection; }
char const* RpeCreator::getPluginName() const noexcept { return plugin_name(mOp, mGrid); }
char const* RpeCreator::getPluginVersion() const noexcept { return kVersion; }
char const* RpeCreator::getPluginNamespace() const noexcept { return kNamespace; }

}  // namespace irpe_trt
