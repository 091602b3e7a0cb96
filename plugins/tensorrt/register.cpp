// Registration of the two creators, for both ways TensorRT loads a plugin library:
//  * dynamic: IPluginRegistry.load_library (export/, serve/) and trtexec --dynamicPlugins call
//    the exported getCreators() and setLoggerFinder() (libirpe_trt_plugins.so).
//  * static: loading the library (trtexec --staticPlugins, polygraphy --plugins, ctypes.CDLL,
//    linking it) registers the creators in the global registry from a static initializer.
//    This is what REGISTER_TENSORRT_PLUGIN does, except that the stock macro registers under
//    the namespace "" while our ONNX nodes carry plugin_namespace="irpe", so the registrar
//    below passes the creators' own namespace. Compiled only with IRPE_STATIC_REGISTRATION
//    (libirpe_trt_plugins_static.so): in the load_library library a static registrar would
//    register every creator a second time.
#include "rpe_plugin.h"

#if defined(_WIN32)
#define IRPE_TRT_EXPORT __declspec(dllexport)
#else
#define IRPE_TRT_EXPORT __attribute__((visibility("default")))
#endif

namespace irpe_trt {
namespace {

RpeCreator& gather_creator()
{
    static RpeCreator creator(Op::kGather);
    return creator;
}

RpeCreator& scatter_creator()
{
    static RpeCreator creator(Op::kScatter);
    return creator;
}

#if defined(IRPE_STATIC_REGISTRATION)
struct StaticRegistrar {
    StaticRegistrar()
    {
        for (RpeCreator* c : {&gather_creator(), &scatter_creator()}) {
            if (!getPluginRegistry()->registerCreator(*c, c->getPluginNamespace())) {
                log_error(std::string("could not register ") + c->getPluginName());
            }
        }
    }
};
StaticRegistrar const gRegistrar;
#endif

}  // namespace
}  // namespace irpe_trt

extern "C" IRPE_TRT_EXPORT void setLoggerFinder(nvinfer1::ILoggerFinder* finder)
{
    irpe_trt::set_logger_finder(finder);
}

extern "C" IRPE_TRT_EXPORT nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& nbCreators)
{
    static nvinfer1::IPluginCreatorInterface* const creators[] = {
        &irpe_trt::gather_creator(), &irpe_trt::scatter_creator()};
    nbCreators = 2;
    return creators;
}
