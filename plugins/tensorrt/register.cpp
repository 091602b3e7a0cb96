// Registration of the four creators (RPEGather, RPEScatter and their *Grid forms), for both ways TensorRT loads a plugin library:
//  * dynamic: IPluginRegistry.load_library (export/, serve/) and trtexec --dynamicPlugins call
//    the exported getCreators() and setLoggerFinder() (libirpe_trt_plugins.so).
//  * static: loading the library (trtexec --staticPlugins, polygraphy --plugins, ctypes.CDLL,
//    linking it) registers the creators in the global registry from a static initializer.
//    This is what REGISTER_TENSORRT_PLUGIN does, except that the stock macro registers under
//    the namespace "" while our ONNX nodes carry plugin_namespace="irpe", so the registrar
//    below passes the creators' own namespace. Compiled only with IRPE_STATIC_REGISTRATION
//    (libirpe_trt_plugins_static.so): in the load_library library a static registrar would
//    register every creator a second time.
// Both refuse (no creators, a message on stderr) when the runtime's major version is not the
// one this library was compiled for: its interfaces would be called through the wrong slots.
#include <cstdio>

#include "rpe_plugin.h"

#if defined(_WIN32)
#define IRPE_TRT_EXPORT __declspec(dllexport)
#else
#define IRPE_TRT_EXPORT __attribute__((visibility("default")))
#endif

namespace irpe_trt {
namespace {

constexpr int32_t kNbCreators = 4;

IPluginCreatorInterface* const* all_creators()
{
    static RpeCreator gather(Op::kGather, false), scatter(Op::kScatter, false);
    static RpeCreator gather_grid(Op::kGather, true), scatter_grid(Op::kScatter, true);
    static IPluginCreatorInterface* const creators[kNbCreators] = {&gather, &scatter, &gather_grid,
                                                                   &scatter_grid};
    return creators;
}

#if defined(IRPE_STATIC_REGISTRATION)
struct StaticRegistrar {
    StaticRegistrar()
    {
        if (!runtime_compatible()) {
            return;
        }
        for (int32_t i = 0; i < kNbCreators; ++i) {
            auto* c = static_cast<RpeCreator*>(all_creators()[i]);
            if (!getPluginRegistry()->registerCreator(*c, c->getPluginNamespace())) {
                log_error(std::string("could not register ") + c->getPluginName());
            }
        }
    }
};
StaticRegistrar const gRegistrar;
#endif

}  // namespace

bool runtime_compatible()
{
    static bool const ok = [] {
        int32_t const runtime = getInferLibVersion() / 10000;
        if (runtime == IRPE_TRT_RUNTIME_MAJOR) {
            return true;
        }
        // stderr only: the runtime's logger interface is exactly what differs between majors
        std::fprintf(stderr,
                     "[irpe plugin] refusing to register: compiled with TensorRT %d.%d headers for "
                     "runtime major %d, but the loaded runtime reports version %d (major %d); "
                     "rebuild the plugin against this TensorRT's headers (plugins/build.sh)\n",
                     NV_TENSORRT_MAJOR, NV_TENSORRT_MINOR, IRPE_TRT_RUNTIME_MAJOR,
                     getInferLibVersion(), runtime);
        return false;
    }();
    return ok;
}

}  // namespace irpe_trt

// What this library was built for: headers' (major*100+minor)*100+patch and the runtime major it
// accepts. Lets a loader explain a refusal without calling any TensorRT interface.
extern "C" IRPE_TRT_EXPORT int32_t irpe_trt_plugin_abi(int32_t* runtimeMajor)
{
    if (runtimeMajor != nullptr) {
        *runtimeMajor = IRPE_TRT_RUNTIME_MAJOR;
    }
    return (NV_TENSORRT_MAJOR * 100 + NV_TENSORRT_MINOR) * 100 + NV_TENSORRT_PATCH;
}

extern "C" IRPE_TRT_EXPORT void setLoggerFinder(nvinfer1::ILoggerFinder* finder)
{
    irpe_trt::set_logger_finder(finder);
}

extern "C" IRPE_TRT_EXPORT nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& nbCreators)
{
    if (!irpe_trt::runtime_compatible()) {
        nbCreators = 0;
        return nullptr;
    }
    nbCreators = irpe_trt::kNbCreators;
    return irpe_trt::all_creators();
}
