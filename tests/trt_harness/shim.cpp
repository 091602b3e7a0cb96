// Minimal TensorRT runtime shim (test aid): the plugin library is linked against this instead
// of libnvinfer, so it loads and runs where no TensorRT can (the lent H100, CI).
//
// It exports exactly the C symbols the plugin libraries import from TensorRT (checked by
// tests/test_trt_plugin_harness.py with nm): getInferLibVersion (both libraries) and
// getPluginRegistry (the static-registration library). The registry behaves like TensorRT's for
// what a plugin library and the parser use: registerCreator under a namespace, getCreator by
// (name, version, namespace), getAllCreators, deregisterCreator. Loading libraries
// (loadLibrary) is the harness's job here, so the shim refuses it.
#include <NvInferRuntime.h>
#include <NvInferVersion.h>

#include <cstring>
#include <string>
#include <vector>

using namespace nvinfer1;

namespace {

struct Entry {
    IPluginCreatorInterface* creator;
    std::string name, version, ns;
};

// Name and version of a creator of either interface generation the library may hand over.
bool describe(IPluginCreatorInterface& c, std::string& name, std::string& version)
{
    if (std::strcmp(c.getInterfaceInfo().kind, "PLUGIN CREATOR_V3ONE") != 0) {
        return false;  // the iRPE library only has V3One creators; anything else is a bug
    }
    auto& v3 = static_cast<IPluginCreatorV3One&>(c);
    name = v3.getPluginName();
    version = v3.getPluginVersion();
    return true;
}

class Registry final : public IPluginRegistry {
public:
    bool registerCreator(IPluginCreatorInterface& creator, AsciiChar const* const ns) noexcept override
    {
        std::string name, version;
        if (!describe(creator, name, version)) {
            return false;
        }
        std::string const space = ns ? ns : "";
        for (Entry const& e : mEntries) {
            if (e.name == name && e.version == version && e.ns == space) {
                return false;  // TensorRT refuses a second creator under the same key
            }
        }
        mEntries.push_back({&creator, name, version, space});
        mView.push_back(&creator);
        return true;
    }
    IPluginCreatorInterface* getCreator(AsciiChar const* const name, AsciiChar const* const version,
                                        AsciiChar const* const ns) noexcept override
    {
        std::string const space = ns ? ns : "";
        for (Entry const& e : mEntries) {
            if (name && version && e.name == name && e.version == version && e.ns == space) {
                return e.creator;
            }
        }
        return nullptr;
    }
    IPluginCreatorInterface* const* getAllCreators(int32_t* const n) const noexcept override
    {
        *n = static_cast<int32_t>(mView.size());
        return mView.data();
    }
    IPluginCreatorInterface* const* getAllCreatorsRecursive(int32_t* const n) noexcept override
    {
        return getAllCreators(n);
    }
    bool deregisterCreator(IPluginCreatorInterface const& creator) noexcept override
    {
        for (size_t i = 0; i < mEntries.size(); ++i) {
            if (mEntries[i].creator == &creator) {
                mEntries.erase(mEntries.begin() + static_cast<std::ptrdiff_t>(i));
                mView.erase(mView.begin() + static_cast<std::ptrdiff_t>(i));
                return true;
            }
        }
        return false;
    }
    void setErrorRecorder(IErrorRecorder* const) noexcept override {}
    IErrorRecorder* getErrorRecorder() const noexcept override { return nullptr; }
    bool isParentSearchEnabled() const override { return false; }
    void setParentSearchEnabled(bool const) override {}
    PluginLibraryHandle loadLibrary(AsciiChar const*) noexcept override { return nullptr; }
    void deregisterLibrary(PluginLibraryHandle) noexcept override {}
    IPluginResource* acquirePluginResource(AsciiChar const*, IPluginResource*) noexcept override
    {
        return nullptr;
    }
    int32_t releasePluginResource(AsciiChar const*) noexcept override { return -1; }

private:
    std::vector<Entry> mEntries;
    std::vector<IPluginCreatorInterface*> mView;
};

}  // namespace

// The headers' version, (major * 100 + minor) * 100 + patch, as libnvinfer reports it.
extern "C" __attribute__((visibility("default"))) int32_t getInferLibVersion() noexcept
{
    return (NV_TENSORRT_MAJOR * 100 + NV_TENSORRT_MINOR) * 100 + NV_TENSORRT_PATCH;
}

extern "C" __attribute__((visibility("default"))) IPluginRegistry* getPluginRegistry() noexcept
{
    static Registry registry;
    return &registry;
}
