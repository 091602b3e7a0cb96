// Drives the iRPE TensorRT plugin library the way TensorRT does, without TensorRT (test aid).
//
//   trt_harness --library PATH --load dynamic|static [--no-device] CASE_FOLDER...
//
// Loading: `dynamic` does what IPluginRegistry::loadLibrary does (dlopen, setLoggerFinder,
// getCreators, registerCreator under each creator's namespace); `static` only dlopens the
// library, whose static registrar must register its creators in getPluginRegistry() (the shim's).
// Per case (one ONNX plugin node, case_io.h), as the ONNX parser, the builder and the runtime do:
// getCreator(op type, plugin_version, plugin_namespace) -> the node's attributes whose names the
// creator lists, mapped INT -> INT32, FLOAT -> FLOAT32, STRING -> CHAR -> createPlugin(kBUILD)
// -> getOutputDataTypes / getOutputShapes / supportsFormatCombination / configurePlugin ->
// getWorkspaceSize -> getFieldsToSerialize -> createPlugin(kRUNTIME) -> attachToContext, and
// clone -> onShapeChange -> enqueue on device buffers for the built, the deserialized and the
// cloned plugin, whose outputs must be bitwise identical; the deserialized one's is written to
// the case's output file for the caller to compare with PyTorch. With --no-device everything up
// to enqueue runs, and (when CUDA reports no device) enqueue must fail with a logged error.
// Prints "PASS|FAIL <case>: <check>" lines and "N passed, M failed"; exit status 1 on a failure.
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "case_io.h"
#include "device.h"
#include "runtime_aids.h"

using namespace nvinfer1;
using namespace harness;

namespace {

int gPassed = 0, gFailed = 0;
LoggerFinder gFinder;

bool check(bool ok, std::string const& scope, std::string const& what, std::string const& detail = {})
{
    std::printf("%s %s: %s%s\n", ok ? "PASS" : "FAIL", scope.c_str(), what.c_str(),
                ok || detail.empty() ? "" : (" (" + detail + ")").c_str());
    (ok ? gPassed : gFailed)++;
    return ok;
}

template <typename T> T* cap(IPluginV3* p, PluginCapabilityType t)
{
    return static_cast<T*>(p->getCapabilityInterface(t));
}

size_t field_bytes(PluginField const& f)
{
    switch (f.type) {
    case PluginFieldType::kINT8: case PluginFieldType::kCHAR: case PluginFieldType::kUNKNOWN: return f.length;
    case PluginFieldType::kFLOAT16: case PluginFieldType::kINT16: case PluginFieldType::kBF16: return 2u * f.length;
    case PluginFieldType::kFLOAT64: case PluginFieldType::kINT64: return 8u * f.length;
    default: return 4u * f.length;
    }
}

// A field collection that owns its names and data (what an engine file holds).
struct OwnedFields {
    std::vector<std::string> names;
    std::vector<std::vector<uint8_t>> data;
    std::vector<PluginField> list;
    PluginFieldCollection fc{};
    void add(std::string name, void const* bytes, size_t size, PluginFieldType type, int32_t length)
    {
        names.push_back(std::move(name));
        auto const* p = static_cast<uint8_t const*>(bytes);
        data.emplace_back(p, p + size);
        list.emplace_back(nullptr, nullptr, type, length);
    }
    PluginFieldCollection const* finish()
    {
        for (size_t i = 0; i < list.size(); ++i) {
            list[i].name = names[i].c_str();
            list[i].data = data[i].data();
        }
        fc.nbFields = static_cast<int32_t>(list.size());
        fc.fields = list.data();
        return &fc;
    }
};

OwnedFields copy_fields(PluginFieldCollection const* fc)
{
    OwnedFields out;
    for (int32_t i = 0; fc && i < fc->nbFields; ++i) {
        PluginField const& f = fc->fields[i];
        out.add(f.name, f.data, field_bytes(f), f.type, f.length);
    }
    out.finish();
    return out;
}

bool same_fields(OwnedFields const& a, OwnedFields const& b)
{
    if (a.list.size() != b.list.size()) return false;
    for (size_t i = 0; i < a.list.size(); ++i) {
        if (a.names[i] != b.names[i] || a.list[i].type != b.list[i].type ||
            a.list[i].length != b.list[i].length || a.data[i] != b.data[i]) {
            return false;
        }
    }
    return true;
}

// The ONNX parser's mapping: only the attributes whose names the creator lists become fields.
OwnedFields node_fields(Case const& c, IPluginCreatorV3One* creator)
{
    OwnedFields out;
    PluginFieldCollection const* names = creator->getFieldNames();
    for (int32_t i = 0; names && i < names->nbFields; ++i) {
        Attr const* a = c.attr(names->fields[i].name);
        if (a == nullptr) continue;
        if (a->kind == 'i') out.add(a->name, &a->i, 4, PluginFieldType::kINT32, 1);
        if (a->kind == 'f') out.add(a->name, &a->f, 4, PluginFieldType::kFLOAT32, 1);
        if (a->kind == 's')
            out.add(a->name, a->text.data(), a->text.size(), PluginFieldType::kCHAR,
                    static_cast<int32_t>(a->text.size()));
    }
    out.finish();
    return out;
}

DynamicPluginTensorDesc dynamic_of(Tensor const& t)
{
    DynamicPluginTensorDesc d{};
    d.desc = desc_of(t);
    d.min = d.opt = d.max = t.dims;
    return d;
}

std::string dims_text(Dims const& d)
{
    std::string s = "[";
    for (int32_t i = 0; i < d.nbDims; ++i) s += (i ? "," : "") + std::to_string(d.d[i]);
    return s + "]";
}

// Builder phase on plugin `p`: types, shapes, formats, configure, workspace. Returns the workspace.
size_t build_phase(Case const& c, IPluginV3* p)
{
    auto* build = cap<IPluginV3OneBuild>(p, PluginCapabilityType::kBUILD);
    std::string const& n = c.name;
    check(build && build->getNbOutputs() == 1, n, "build capability, one output");
    DataType const in_types[2] = {c.inputs[0].type, c.inputs[1].type};
    DataType out_type = DataType::kINT8;
    check(build->getOutputDataTypes(&out_type, 1, in_types, 2) == 0 && out_type == c.output.type, n,
          "getOutputDataTypes", type_name(out_type));
    ExprBuilder exprs;
    DimsExprs const in_exprs[2] = {exprs.exprs(c.inputs[0].dims), exprs.exprs(c.inputs[1].dims)};
    DimsExprs out_exprs[1]{};
    bool shape_ok = build->getOutputShapes(in_exprs, 2, nullptr, 0, out_exprs, 1, exprs) == 0 &&
                    out_exprs[0].nbDims == c.output.dims.nbDims;
    Dims got{};
    got.nbDims = out_exprs[0].nbDims;
    for (int32_t d = 0; shape_ok && d < got.nbDims; ++d) {
        shape_ok = out_exprs[0].d[d] && out_exprs[0].d[d]->isConstant();
        got.d[d] = shape_ok ? out_exprs[0].d[d]->getConstantValue() : -1;
        shape_ok = shape_ok && got.d[d] == c.output.dims.d[d];
    }
    check(shape_ok, n, "getOutputShapes " + dims_text(c.output.dims), dims_text(got));
    DynamicPluginTensorDesc io[3] = {dynamic_of(c.inputs[0]), dynamic_of(c.inputs[1]), dynamic_of(c.output)};
    bool formats = true;
    for (int32_t pos = 0; pos < 3; ++pos) {  // TensorRT asks position by position
        formats = formats && build->supportsFormatCombination(pos, io, 2, 1);
        DynamicPluginTensorDesc probe[3] = {io[0], io[1], io[2]};
        probe[pos].desc.format = TensorFormat::kCHW32;
        formats = formats && !build->supportsFormatCombination(pos, probe, 2, 1);
    }
    check(formats, n, "supportsFormatCombination: the case's types, linear only");
    check(build->configurePlugin(io, 2, io + 2, 1) == 0, n, "configurePlugin");
    size_t const workspace = build->getWorkspaceSize(io, 2, io + 2, 1);
    check(workspace < (size_t(1) << 30), n, "getWorkspaceSize = " + std::to_string(workspace));
    return workspace;
}

struct Runtime {
    std::string label;
    std::unique_ptr<IPluginV3> owned;  // null for the built plugin itself
    IPluginV3* plugin;
};

// Parser: the registry's creator for the node, createPlugin(kBUILD) from the node's fields.
std::unique_ptr<IPluginV3> create_from_node(Case const& c, IPluginCreatorV3One*& creator)
{
    Attr const* ns = c.attr("plugin_namespace");
    Attr const* version = c.attr("plugin_version");
    IPluginCreatorInterface* found = getPluginRegistry()->getCreator(
        c.node.c_str(), version ? version->text.c_str() : "1", ns ? ns->text.c_str() : "");
    bool const v3 = found && std::strcmp(found->getInterfaceInfo().kind, "PLUGIN CREATOR_V3ONE") == 0;
    if (!check(v3, c.name, "registry getCreator(" + c.node + ") is a V3One creator")) {
        return nullptr;
    }
    creator = static_cast<IPluginCreatorV3One*>(found);
    OwnedFields fields = node_fields(c, creator);
    std::unique_ptr<IPluginV3> built(creator->createPlugin(c.name.c_str(), &fields.fc, TensorRTPhase::kBUILD));
    check(built != nullptr, c.name, "createPlugin(kBUILD) from " + std::to_string(fields.fc.nbFields) +
          " node fields");
    return built;
}

// Engine file and back: getFieldsToSerialize -> createPlugin(kRUNTIME), which must serialize the same.
std::unique_ptr<IPluginV3> round_trip(Case const& c, IPluginV3* built, IPluginCreatorV3One* creator)
{
    auto* rt = cap<IPluginV3OneRuntime>(built, PluginCapabilityType::kRUNTIME);
    OwnedFields saved = copy_fields(rt->getFieldsToSerialize());
    std::unique_ptr<IPluginV3> restored(creator->createPlugin(c.name.c_str(), &saved.fc, TensorRTPhase::kRUNTIME));
    bool same = false;
    if (restored) {
        auto* rt2 = cap<IPluginV3OneRuntime>(restored.get(), PluginCapabilityType::kRUNTIME);
        same = same_fields(saved, copy_fields(rt2->getFieldsToSerialize()));
    }
    check(same, c.name, "getFieldsToSerialize -> createPlugin(kRUNTIME) -> the same fields");
    return restored;
}

// The plugins an engine runs: the built one (timed by the builder), the deserialized one
// attached to an execution context, and a clone; each told the shapes by onShapeChange.
std::vector<Runtime> runtimes_of(Case const& c, IPluginV3* built, IPluginV3* restored, ResourceContext& context)
{
    std::vector<Runtime> runtimes;
    runtimes.push_back({"built", nullptr, built});
    runtimes.push_back({"deserialized", std::unique_ptr<IPluginV3>(
        cap<IPluginV3OneRuntime>(restored, PluginCapabilityType::kRUNTIME)->attachToContext(&context)), nullptr});
    runtimes.push_back({"clone", std::unique_ptr<IPluginV3>(built->clone()), nullptr});
    PluginTensorDesc const in[2] = {desc_of(c.inputs[0]), desc_of(c.inputs[1])};
    PluginTensorDesc const out = desc_of(c.output);
    for (Runtime& r : runtimes) {
        if (r.owned) r.plugin = r.owned.get();
        auto* core = r.plugin ? cap<IPluginV3OneCore>(r.plugin, PluginCapabilityType::kCORE) : nullptr;
        check(core && c.node == core->getPluginName(), c.name, r.label + ": plugin of the same name");
        auto* run = r.plugin ? cap<IPluginV3OneRuntime>(r.plugin, PluginCapabilityType::kRUNTIME) : nullptr;
        check(run && run->onShapeChange(in, 2, &out, 1) == 0, c.name, r.label + ": onShapeChange");
    }
    return runtimes;
}

void enqueue_phase(Case const& c, std::vector<Runtime> const& runtimes, size_t workspace, bool device)
{
    std::string const& n = c.name;
    size_t const errors_before = gFinder.logger.errors.size();
    if (!device) {
        if (device_count() == 0) {
            int const rc = enqueue_without_device(c, runtimes[1].plugin);
            check(rc != 0 && gFinder.logger.errors.size() == errors_before + 1 &&
                      gFinder.logger.errors.back().find("launch failed") != std::string::npos,
                  n, "no CUDA device: enqueue returns an error and logs it (no abort)");
        }
        return;
    }
    std::vector<IPluginV3*> plugins;
    for (Runtime const& r : runtimes) plugins.push_back(r.plugin);
    std::vector<std::vector<uint8_t>> outs;
    std::string const error = enqueue_on_device(c, plugins, workspace, outs);
    if (!check(error.empty(), n, "enqueue on device buffers (built, deserialized, clone)", error)) {
        return;
    }
    check(outs[0] == outs[1] && outs[0] == outs[2], n, "deserialized and cloned plugins: identical output");
    check(write_file(c.folder + "/" + c.output.file, outs[1].data(), outs[1].size()), n, "output written");
    check(gFinder.logger.errors.size() == errors_before, n, "nothing logged as an error by enqueue");
}

void run_case(Case const& c, bool device)
{
    IPluginCreatorV3One* creator = nullptr;
    std::unique_ptr<IPluginV3> built = create_from_node(c, creator);
    if (!built) return;
    auto* core = cap<IPluginV3OneCore>(built.get(), PluginCapabilityType::kCORE);
    check(core && c.node == core->getPluginName() && std::strcmp(core->getPluginNamespace(), "irpe") == 0 &&
              std::strcmp(core->getPluginVersion(), "1") == 0, c.name, "core: name, namespace irpe, version 1");
    size_t const workspace = build_phase(c, built.get());
    std::unique_ptr<IPluginV3> restored = round_trip(c, built.get(), creator);
    if (!restored) return;
    ResourceContext context;
    std::vector<Runtime> runtimes = runtimes_of(c, built.get(), restored.get(), context);
    check(gFinder.logger.errors.empty(), c.name, "nothing logged as an error so far",
          gFinder.logger.errors.empty() ? "" : gFinder.logger.errors.front());
    enqueue_phase(c, runtimes, workspace, device);
    gFinder.logger.errors.clear();
}

using GetCreators = IPluginCreatorInterface* const* (*)(int32_t&);
using SetLoggerFinder = void (*)(ILoggerFinder*);

bool load(std::string const& path, std::string const& how)
{
    int32_t before = 0;
    getPluginRegistry()->getAllCreators(&before);
    void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!check(lib != nullptr, "load", "dlopen(RTLD_NOW): every import resolved", lib ? "" : dlerror())) {
        return false;
    }
    auto set_finder = reinterpret_cast<SetLoggerFinder>(dlsym(lib, "setLoggerFinder"));
    auto get_creators = reinterpret_cast<GetCreators>(dlsym(lib, "getCreators"));
    check(set_finder && get_creators, "load", "exports setLoggerFinder and getCreators");
    if (!set_finder || !get_creators) return false;
    set_finder(&gFinder);
    int32_t after = 0;
    if (how == "dynamic") {  // IPluginRegistry::loadLibrary
        check(before == 0, "load", "registry empty before load_library");
        int32_t n = 0;
        IPluginCreatorInterface* const* creators = get_creators(n);
        bool ok = n == 4;
        for (int32_t i = 0; ok && i < n; ++i) {
            auto* v3 = static_cast<IPluginCreatorV3One*>(creators[i]);
            ok = getPluginRegistry()->registerCreator(*creators[i], v3->getPluginNamespace());
        }
        check(ok, "load", "getCreators: 4 creators, each registered under its namespace");
    }
    IPluginCreatorInterface* const* all = getPluginRegistry()->getAllCreators(&after);
    bool irpe = after == 4;
    for (int32_t i = 0; irpe && i < after; ++i) {
        irpe = std::strcmp(static_cast<IPluginCreatorV3One*>(all[i])->getPluginNamespace(), "irpe") == 0;
    }
    check(irpe, "load", how + ": registry holds the 4 irpe creators", std::to_string(after));
    return irpe;
}

}  // namespace

int main(int argc, char** argv)
{
    std::string library, how = "dynamic";
    bool device = true;
    std::vector<std::string> folders;
    for (int i = 1; i < argc; ++i) {
        std::string const a = argv[i];
        if (a == "--library" && i + 1 < argc) library = argv[++i];
        else if (a == "--load" && i + 1 < argc) how = argv[++i];
        else if (a == "--no-device") device = false;
        else folders.push_back(a);
    }
    if (library.empty() || (how != "dynamic" && how != "static")) {
        std::fprintf(stderr, "usage: trt_harness --library PATH --load dynamic|static [--no-device] CASE...\n");
        return 2;
    }
    if (load(library, how)) {
        for (std::string const& folder : folders) {
            Case c;
            std::string const error = load_case(folder, c);
            if (check(error.empty(), folder, "case file read", error)) {
                run_case(c, device);
            }
        }
    }
    std::printf("%d passed, %d failed\n", gPassed, gFailed);
    return gFailed ? 1 : 0;
}
