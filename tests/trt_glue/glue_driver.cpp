// Exercises the TensorRT plugin glue (plugins/tensorrt), compiled against the real TensorRT
// headers: creators, fields, validation, shapes, formats, serialization round trip, logging,
// and what enqueue hands to the kernels. Only what a test must observe is faked here, through
// the real interfaces: the kernels' C ABI (records each call), the runtime's getInferLibVersion
// (IRPE_FAKE_TRT_VERSION), getPluginRegistry (records registrations), a logger finder and the
// dimension-expression builder (apiv implementations behind the real wrapper classes).
// `glue` runs every check; `glue abi` expects the refusal of a runtime of another major.
// Prints one line per check and "N passed, M failed"; exit status 1 on any failure.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "irpe_kernels.h"
#include "rpe_plugin.h"

using namespace nvinfer1;

// ---- fake kernels library: records the last call ---------------------------------------
struct Call {
    std::string fn;
    irpe_problem p{};
    int dtype = -1, index_dtype = -1;
    irpe_bucket_params params{};
    void const* in = nullptr;
    void* out = nullptr;
    void* stream = nullptr;
};
static Call gCall;
static int gStatus = IRPE_OK;

static int record(char const* fn, irpe_problem const* p, int dtype, void const* in, int index_dtype,
                  irpe_bucket_params const* params, void* out, void* stream)
{
    gCall = Call{fn, *p, dtype, index_dtype, params ? *params : irpe_bucket_params{}, in, out, stream};
    return gStatus;
}
extern "C" {
int irpe_gather(irpe_problem const* p, irpe_dtype d, void const* t, irpe_index_dtype i, void const*,
                void* o, void* s) { return record("gather", p, d, t, i, nullptr, o, s); }
int irpe_scatter(irpe_problem const* p, irpe_dtype d, void const* a, irpe_index_dtype i, void const*,
                 void* o, void* s) { return record("scatter", p, d, a, i, nullptr, o, s); }
int irpe_gather_grid(irpe_problem const* p, irpe_dtype d, void const* t, irpe_bucket_params const* g,
                     void* o, void* s) { return record("gather_grid", p, d, t, -1, g, o, s); }
int irpe_scatter_grid(irpe_problem const* p, irpe_dtype d, void const* a, irpe_bucket_params const* g,
                      void* o, void* s) { return record("scatter_grid", p, d, a, -1, g, o, s); }
char const* irpe_last_error(void) { return "fake failure"; }
}

// ---- fake runtime: version, registry (static registration), logger ---------------------
extern "C" int32_t getInferLibVersion() noexcept
{
    char const* v = std::getenv("IRPE_FAKE_TRT_VERSION");
    return v ? std::atoi(v) : IRPE_TRT_RUNTIME_MAJOR * 10000;
}

struct Registry : IPluginRegistry {
    std::vector<std::pair<std::string, std::string>> entries;  // (name, namespace)
    bool registerCreator(IPluginCreatorInterface& c, AsciiChar const* const ns) noexcept override
    {
        entries.emplace_back(static_cast<IPluginCreatorV3One&>(c).getPluginName(), ns);
        return true;
    }
    void setErrorRecorder(IErrorRecorder* const) noexcept override {}
    IErrorRecorder* getErrorRecorder() const noexcept override { return nullptr; }
    bool isParentSearchEnabled() const override { return false; }
    void setParentSearchEnabled(bool const) override {}
    PluginLibraryHandle loadLibrary(AsciiChar const*) noexcept override { return nullptr; }
    void deregisterLibrary(PluginLibraryHandle) noexcept override {}
    IPluginCreatorInterface* const* getAllCreators(int32_t* const n) const noexcept override
    {
        *n = 0;
        return nullptr;
    }
    IPluginCreatorInterface* getCreator(AsciiChar const* const, AsciiChar const* const,
                                        AsciiChar const* const) noexcept override { return nullptr; }
    bool deregisterCreator(IPluginCreatorInterface const&) noexcept override { return false; }
    IPluginResource* acquirePluginResource(AsciiChar const*, IPluginResource*) noexcept override
    {
        return nullptr;
    }
    int32_t releasePluginResource(AsciiChar const*) noexcept override { return 0; }
    IPluginCreatorInterface* const* getAllCreatorsRecursive(int32_t* const n) noexcept override
    {
        *n = 0;
        return nullptr;
    }
};
static Registry& registry()
{
    static Registry r;
    return r;
}
extern "C" IPluginRegistry* getPluginRegistry() noexcept { return &registry(); }

struct Logger : ILogger {
    std::vector<std::string> messages;
    void log(Severity severity, AsciiChar const* msg) noexcept override
    {
        messages.push_back(std::string(severity == Severity::kERROR ? "ERROR " : "OTHER ") + msg);
    }
};
struct Finder : ILoggerFinder {
    Logger logger;
    int calls = 0;
    ILogger* findLogger() noexcept override
    {
        ++calls;
        return &logger;
    }
};
extern "C" void setLoggerFinder(ILoggerFinder* finder);

// ---- dimension expressions: the real wrappers over fake implementations ----------------
struct ExprImpl : apiv::VDimensionExpr {
    int64_t value = 0;
    bool isConstant() const override { return true; }
    int64_t getConstantValue() const override { return value; }
    bool isSizeTensor() const override { return false; }
};
struct Expr : IDimensionExpr {
    ExprImpl impl;
    explicit Expr(int64_t v)
    {
        impl.value = v;
        mImpl = &impl;
    }
};
struct BuilderImpl : apiv::VExprBuilder {
    std::vector<std::unique_ptr<Expr>> made;
    IDimensionExpr const* constant(int64_t v) override
    {
        made.emplace_back(new Expr(v));
        return made.back().get();
    }
    IDimensionExpr const* operation(DimensionOperation, IDimensionExpr const&,
                                    IDimensionExpr const&) override { return nullptr; }
    IDimensionExpr const* declareSizeTensor(int32_t, IDimensionExpr const&,
                                            IDimensionExpr const&) override { return nullptr; }
};
struct Builder : IExprBuilder {
    BuilderImpl impl;
    Builder() { mImpl = &impl; }
};

extern "C" IPluginCreatorInterface* const* getCreators(int32_t& nbCreators);

// ---- tiny check harness ---------------------------------------------------------------
static int gPassed = 0, gFailed = 0;
static void check(bool ok, char const* what)
{
    std::printf("%s %s\n", ok ? "PASS" : "FAIL", what);
    (ok ? gPassed : gFailed)++;
}

static IPluginCreatorV3One* creator(char const* name)
{
    int32_t n = 0;
    IPluginCreatorInterface* const* all = getCreators(n);
    for (int32_t i = 0; i < n; ++i) {
        auto* c = static_cast<IPluginCreatorV3One*>(all[i]);
        if (std::strcmp(c->getPluginName(), name) == 0) {
            return c;
        }
    }
    return nullptr;
}

struct Fields {
    std::vector<PluginField> list;
    int32_t k = 0, skip = 0;
    float ratio = 0.0f;
    std::string method;
    PluginFieldCollection fc() const { return {static_cast<int32_t>(list.size()), list.data()}; }
};

// `name` is the op (RPEGather / RPEScatter); with a method the *Grid creator is used.
static std::unique_ptr<IPluginV3> make(char const* name, int32_t k, char const* method = nullptr,
                                       float ratio = 0.0f, int32_t skip = 0)
{
    Fields f;
    f.k = k, f.ratio = ratio, f.skip = skip, f.method = method ? method : "";
    if (k) f.list.emplace_back("num_buckets", &f.k, PluginFieldType::kINT32, 1);
    if (method) {
        f.list.emplace_back("method", f.method.c_str(), PluginFieldType::kCHAR,
                            static_cast<int32_t>(f.method.size()));
        f.list.emplace_back("ratio", &f.ratio, PluginFieldType::kFLOAT32, 1);
        f.list.emplace_back("skip", &f.skip, PluginFieldType::kINT32, 1);
    }
    PluginFieldCollection const fc = f.fc();
    std::string const full = std::string(name) + (method ? "Grid" : "");
    return std::unique_ptr<IPluginV3>(creator(full.c_str())->createPlugin("node", &fc, TensorRTPhase::kBUILD));
}

template <typename T> static T* cap(IPluginV3* p, PluginCapabilityType t)
{
    return static_cast<T*>(p->getCapabilityInterface(t));
}

static PluginTensorDesc desc(std::vector<int64_t> dims, DataType t)
{
    PluginTensorDesc d{};
    d.dims.nbDims = static_cast<int32_t>(dims.size());
    for (size_t i = 0; i < dims.size(); ++i) d.dims.d[i] = dims[i];
    d.type = t;
    d.format = TensorFormat::kLINEAR;
    return d;
}

static int enqueue(IPluginV3* p, std::vector<PluginTensorDesc> in, PluginTensorDesc out)
{
    void const* inputs[2] = {reinterpret_cast<void const*>(0x100), reinterpret_cast<void const*>(0x200)};
    void* outputs[1] = {reinterpret_cast<void*>(0x300)};
    gCall = Call{};
    return cap<IPluginV3OneRuntime>(p, PluginCapabilityType::kRUNTIME)
        ->enqueue(in.data(), &out, inputs, outputs, nullptr, reinterpret_cast<cudaStream_t>(0x400));
}

#include "glue_checks.inc"

int main(int argc, char** argv)
{
    if (argc > 1 && std::strcmp(argv[1], "abi") == 0) {
        check_abi_refusal();
    } else {
        run_checks();
    }
    std::printf("%d passed, %d failed\n", gPassed, gFailed);
    return gFailed ? 1 : 0;
}
