// Node attributes (read robustly: every one optional except RPEScatter's num_buckets), the
// problem sizes from the input shapes, and the on-the-fly id cache.
#include <algorithm>
#include <cstdlib>

#include "irpe_methods.h"
#include "rpe_cpu.h"
#include "rpe_ort.h"

namespace irpe_ort {

using irpe_cpu::grid_ids;

namespace {

enum class Attr { kAbsent, kOk, kWrongType };

bool ok(const OrtApi& api, OrtStatus* status)
{
    if (status == nullptr) {
        return true;
    }
    api.ReleaseStatus(status);
    return false;
}

bool read_string_raw(const OrtApi& api, const OrtKernelInfo* info, const char* name,
                     std::string& out)
{
    size_t size = 0;
    if (!ok(api, api.KernelInfoGetAttribute_string(info, name, nullptr, &size)) || size == 0) {
        return false;
    }
    std::vector<char> buf(size);
    if (!ok(api, api.KernelInfoGetAttribute_string(info, name, buf.data(), &size))) {
        return false;
    }
    out.assign(buf.data());
    return true;
}

// Absent when no read of any type succeeds; wrong type when another type's read does.
Attr classify(const OrtApi& api, const OrtKernelInfo* info, const char* name, bool found)
{
    if (found) {
        return Attr::kOk;
    }
    int64_t i = 0;
    float f = 0.0f;
    std::string s;
    const bool other = ok(api, api.KernelInfoGetAttribute_int64(info, name, &i)) ||
                       ok(api, api.KernelInfoGetAttribute_float(info, name, &f)) ||
                       read_string_raw(api, info, name, s);
    return other ? Attr::kWrongType : Attr::kAbsent;
}

Attr get_int(const OrtApi& api, const OrtKernelInfo* info, const char* name, int64_t& out)
{
    return classify(api, info, name, ok(api, api.KernelInfoGetAttribute_int64(info, name, &out)));
}

Attr get_float(const OrtApi& api, const OrtKernelInfo* info, const char* name, float& out)
{
    return classify(api, info, name, ok(api, api.KernelInfoGetAttribute_float(info, name, &out)));
}

Attr get_string(const OrtApi& api, const OrtKernelInfo* info, const char* name, std::string& out)
{
    return classify(api, info, name, read_string_raw(api, info, name, out));
}

std::string expect_string(const OrtApi& api, const OrtKernelInfo* info, const char* name,
                          const char* wanted)
{
    std::string value;
    const Attr a = get_string(api, info, name, value);
    if (a == Attr::kWrongType) {
        return std::string("attribute '") + name + "' must be a string";
    }
    if (a == Attr::kOk && value != wanted) {
        return std::string("attribute '") + name + "' is '" + value + "', this library is '" +
               wanted + "'";
    }
    return {};
}

std::string check(const RPEConfig& c)
{
    if (c.on_the_fly()) {
        if (c.method_id() < 0) {
            return "unknown method '" + c.method + "' (euc, quant, product, cross_rows, cross_cols)";
        }
        if (!(c.ratio > 0.0f) || c.skip < 0) {
            return "on-the-fly ids need ratio > 0 and skip >= 0";
        }
        irpe_bucket_params p;
        if (irpe_bucket_params_init(&p, c.method_id(), c.ratio, 1, 1, c.skip) != IRPE_OK) {
            return "method/ratio/skip give no valid bucket parameters";
        }
        if (c.num_buckets != 0 && c.num_buckets != p.num_buckets) {
            return "num_buckets " + std::to_string(c.num_buckets) + " does not match method " +
                   c.method + ", ratio and skip (" + std::to_string(p.num_buckets) + " buckets)";
        }
    }
    if (c.num_buckets < 0 || c.num_buckets > INT32_MAX ||
        (c.op == Op::kScatter && !c.on_the_fly() && c.num_buckets < 1)) {
        return "num_buckets must be in [1, 2^31) (RPEScatter: required)";
    }
    return {};
}

}  // namespace

char const* op_name(Op op, bool grid, int adds, Fused fused)
{
    if (fused == Fused::kSoftmax) {
        return adds == 2 ? "RPEGatherAdd2Softmax" : "RPEGatherAddSoftmax";
    }
    if (fused == Fused::kSoftmaxScatter) {
        return adds == 2 ? "RPEGatherAdd2SoftmaxScatter" : "RPEGatherAddSoftmaxScatter";
    }
    if (fused == Fused::kBucketMatMulAdd) {
        return "RPEBucketMatMulAdd";
    }
    if (adds) {
        return adds == 2 ? "RPEGatherAdd2" : "RPEGatherAdd";
    }
    if (op == Op::kGather) {
        return grid ? "RPEGatherGrid" : "RPEGather";
    }
    return grid ? "RPEScatterGrid" : "RPEScatter";
}

int RPEConfig::method_id() const
{
    return irpe_method_id(method.c_str());
}

std::string read_config(const OrtApi& api, const OrtKernelInfo* info, RPEConfig& c)
{
    std::string error = expect_string(api, info, "plugin_namespace", "irpe");
    if (error.empty()) {
        error = expect_string(api, info, "plugin_version", "1");
    }
    if (!error.empty()) {
        return error;
    }
    if (get_int(api, info, "num_buckets", c.num_buckets) == Attr::kWrongType) {
        return "attribute 'num_buckets' must be an int";
    }
    if (c.fused == Fused::kSoftmaxScatter) {
        if (get_int(api, info, "scatter_buckets", c.scatter_buckets) == Attr::kWrongType) {
            return "attribute 'scatter_buckets' must be an int";
        }
        if (c.scatter_buckets < 1 || c.scatter_buckets > INT32_MAX) {
            return "attribute 'scatter_buckets' (K of the V index) must be in [1, 2^31)";
        }
    }
    if (c.grid) {  // the plain ops ignore these, as TensorRT's parser does (not their fields)
        if (get_string(api, info, "method", c.method) == Attr::kWrongType) {
            return "attribute 'method' must be a string";
        }
        if (c.method.empty()) {
            return "needs a method (on-the-fly ids: euc, quant, product, cross_rows, cross_cols)";
        }
        if (get_float(api, info, "ratio", c.ratio) == Attr::kWrongType) {
            return "attribute 'ratio' must be a float";
        }
        if (get_int(api, info, "skip", c.skip) == Attr::kWrongType) {
            return "attribute 'skip' must be an int";
        }
    }
    error = check(c);
    if (error.empty() && c.on_the_fly() && c.num_buckets == 0 && c.op == Op::kScatter) {
        irpe_bucket_params p{};
        if (irpe_bucket_params_init(&p, c.method_id(), c.ratio, 1, 1, c.skip) == IRPE_OK) {
            c.num_buckets = p.num_buckets;
        }
    }
    return error;
}

std::string grid_params(const RPEConfig& c, int64_t height, int64_t width, irpe_bucket_params& p)
{
    if (irpe_bucket_params_init(&p, c.method_id(), c.ratio, height, width, c.skip) != IRPE_OK) {
        return "no bucket parameters for a " + std::to_string(height) + "x" +
               std::to_string(width) + " grid";
    }
    return {};
}

std::shared_ptr<const std::vector<int32_t>> GridIdCache::get(const irpe_bucket_params& p)
{
    const auto key = std::make_pair(p.height, p.width);
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto const& e : entries_) {
        if (e.first == key) {
            return e.second;
        }
    }
    auto ids = std::make_shared<const std::vector<int32_t>>(grid_ids(p));
    entries_.emplace_back(key, ids);
    return ids;
}

Problem make_problem(const RPEConfig& c, const std::vector<int64_t>& in,
                     const std::vector<int64_t>& index)
{
    Problem p;
    const char* what = op_name(c.op, c.grid);
    if (in.size() != 4) {
        p.error = std::string(what) + ": input 0 must be 4-D, got " + std::to_string(in.size()) +
                  "-D";
        return p;
    }
    if (index.size() < 2 || (!c.on_the_fly() && index.size() != 2)) {
        p.error = std::string(what) + ": input 1 must be " +
                  (c.on_the_fly() ? "at least 2-D (..., H, W)" : "the 2-D index [Lq, Lk]");
        return p;
    }
    p.batch = in[0];
    p.heads = in[1];
    p.rows = in[2];
    if (c.on_the_fly()) {
        const int64_t h = index[index.size() - 2], w = index[index.size() - 1];
        p.lq = p.lk = c.skip + h * w;
    } else {
        p.lq = index[0];
        p.lk = index[1];
    }
    const bool gather = c.op == Op::kGather;
    p.k = gather ? in[3] : c.num_buckets;
    if (gather && !(p.rows == p.lq || p.rows == 1)) {
        p.error = "RPEGather: table has " + std::to_string(p.rows) + " query rows, the index " +
                  std::to_string(p.lq) + " (a table must have Lq rows or 1)";
    } else if (gather && c.num_buckets > 0 && in[3] != c.num_buckets) {
        p.error = "RPEGather: table has " + std::to_string(in[3]) + " buckets, num_buckets is " +
                  std::to_string(c.num_buckets);
    } else if (!gather && (p.rows != p.lq || in[3] != p.lk)) {
        p.error = "RPEScatter: attn is " + std::to_string(p.rows) + "x" + std::to_string(in[3]) +
                  " per head, the index " + std::to_string(p.lq) + "x" + std::to_string(p.lk);
    }
    return p;
}

}  // namespace irpe_ort
