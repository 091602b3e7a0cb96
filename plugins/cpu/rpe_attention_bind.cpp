// RPEAttention's inputs into the kernel's problem (rpe_attention_bind.h): the one place where
// q, k, v, the iRPE weights and their ids are read, checked and padded, for the ONNX Runtime
// op, the OpenVINO op and the C API alike.
#include "rpe_attention_bind.h"

#include <climits>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

namespace irpe_cpu {

namespace {

// A shared weight's two trailing dims (leading dims must be 1).
void weight_dims(const AttnInput& w, const char* name, int64_t& rows, int64_t& cols)
{
    const size_t n = w.dims.size();
    bool shared = n >= 2;
    for (size_t a = 0; a + 2 < n; ++a) {
        shared = shared && w.dims[a] == 1;
    }
    if (!shared) {
        throw std::invalid_argument(std::string(name) +
                                    " must be [.., rows, cols] with leading dims 1");
    }
    rows = w.dims[n - 2];
    cols = w.dims[n - 1];
}

bool present(const AttnInput* in) { return in->data != nullptr; }

}  // namespace

AttnInput attn_input(size_t i, const void* data, std::vector<int64_t> dims, AttnType type)
{
    const bool index = type == AttnType::kInt32 || type == AttnType::kInt64;
    if (attn_index_input(i) ? !index : type != AttnType::kFloat32) {
        throw std::invalid_argument("input " + std::to_string(i) +
                                    (attn_index_input(i) ? " must be an int32/int64 index"
                                                         : " must be float32"));
    }
    return AttnInput{data, std::move(dims), type == AttnType::kInt64};
}

const char* attn_attributes_error(float scale, int64_t out_layout)
{
    if (!std::isfinite(scale) || (out_layout != 0 && out_layout != 1)) {
        return "scale must be finite and out_layout 0 ([B, H, L, d]) or 1 ([B, L, H, d])";
    }
    return nullptr;
}

void check_attn_index(const AttnInput& index, int64_t l)
{
    const std::vector<int64_t>& dims = index.dims;
    if (index.data == nullptr || dims.size() != 2 || dims[0] != l || dims[1] != l) {
        throw std::invalid_argument("an index must be [L, L] = [" + std::to_string(l) + ", " +
                                    std::to_string(l) + "]");
    }
}

AttnIdTable attn_id_table(AttnIds kind, const AttnInput& index, int64_t l, int64_t k)
{
    check_attn_index(index, l);
    auto made = std::make_shared<const std::vector<int32_t>>(
        pad_ids(index.data, index.wide, l, k, kind));
    return AttnIdTable{made, made->data(), true};
}

bool bind_attention(AttnBinding& b, const AttnInput* in, const AttnAttributes& a,
                    const AttnIdSource& ids)
{
    AttnProblem& p = b.p;
    const auto floats = [&](size_t i) { return static_cast<const float*>(in[i].data); };
    const int64_t batch = read_qkv(p, in[0].dims, floats(0), in[1].dims, floats(1),
                                   in[2].dims, floats(2));
    if (p.l > 46340 || p.d > (1 << 20)) {
        throw std::invalid_argument("L must be <= 46340 and d <= 2^20");
    }
    const int64_t h = p.heads, l = p.l, d = p.d;
    const bool by_token = a.out_layout == 1;  // out [B, L, H, d]
    p.out_layout = by_token ? AttnLayout{l * h * d, d, h * d} : AttnLayout{h * l * d, l * d, d};
    b.out_dims = by_token ? std::vector<int64_t>{batch, l, h, d}
                          : std::vector<int64_t>{batch, h, l, d};
    p.scale = a.scale;
    p.bf16 = a.bf16;
    if (p.bh * l * d == 0) {
        return false;
    }
    bind_attention_terms(b, AttnTerms{{&in[3], &in[5], &in[8]}, {&in[4], &in[6], &in[7]}}, ids);
    return true;
}

void bind_attention_terms(AttnBinding& b, const AttnTerms& t, const AttnIdSource& ids)
{
    AttnProblem& p = b.p;
    for (int n = 0; n < 3; ++n) {
        if (present(t.weight[n]) != present(t.index[n])) {
            throw std::invalid_argument("each term needs both its weight and its index");
        }
    }
    const std::string with_d = " with d = " + std::to_string(p.d);
    const int64_t lp = attn_pad(p.l);
    int64_t rows = 0, cols = 0;
    if (present(t.weight[0])) {  // iRPE-K: (scale * q) @ wk, the scale folded into wk
        weight_dims(*t.weight[0], "wk", rows, p.kk);
        if (rows != p.d || p.kk < 1) {
            throw std::invalid_argument("wk must be [d, K]" + with_d);
        }
        b.wk = pad_columns(static_cast<const float*>(t.weight[0]->data), p.d, p.kk, p.scale);
        b.ids[0] = ids(AttnIds::kK, *t.index[0], p.l, p.kk);
        p.wk = b.wk.data();
        p.idk = b.ids[0].ids;
    }
    if (present(t.weight[1])) {  // iRPE-Q, ids bucket-major
        weight_dims(*t.weight[1], "wq", p.kq, cols);
        if (cols != p.d || p.kq < 1 || p.kq * lp > INT32_MAX) {
            throw std::invalid_argument("wq must be [K, d]" + with_d + " and K * L < 2^31");
        }
        b.ids[1] = ids(AttnIds::kQ, *t.index[1], p.l, p.kq);
        p.wq = static_cast<const float*>(t.weight[1]->data);
        p.idq = b.ids[1].ids;
        p.idqt = b.ids[1].extras ? p.idq + p.l * lp : nullptr;
    }
    if (present(t.weight[2])) {  // iRPE-V: the bucket sums of the probabilities @ wv
        weight_dims(*t.weight[2], "wv", p.kv, cols);
        if (cols != p.d || p.kv < 1) {
            throw std::invalid_argument("wv must be [K, d]" + with_d);
        }
        b.ids[2] = ids(AttnIds::kV, *t.index[2], p.l, p.kv);
        b.wv = pad_columns(static_cast<const float*>(t.weight[2]->data), p.kv, p.d, 1.0f);
        p.wv = b.wv.data();
        p.idv = b.ids[2].ids;
        p.vruns = b.ids[2].extras ? p.idv + p.l * lp : nullptr;
    }
}

int64_t read_qkv(AttnProblem& p, const std::vector<int64_t>& q_dims, const float* q,
                 const std::vector<int64_t>& k_dims, const float* k,
                 const std::vector<int64_t>& v_dims, const float* v)
{
    const auto& dims = q_dims;
    if (dims.size() == 5 && dims[2] == 3 && k == nullptr && v == nullptr) {
        const int64_t h = dims[3], d = dims[4], row = 3 * h * d;
        p.heads = h;
        p.l = dims[1];
        p.d = d;
        p.bh = dims[0] * h;
        p.in = AttnLayout{dims[1] * row, d, row};
        p.q = q;
        p.k = q + h * d;
        p.v = q + 2 * h * d;
        return dims[0];
    }
    if (q == nullptr || k == nullptr || v == nullptr || dims.size() != 4 || k_dims != dims ||
        v_dims != dims) {
        throw std::invalid_argument("q, k and v must be [B, H, L, d] of one shape (or input 0 "
                                    "the qkv [B, L, 3, H, d] alone)");
    }
    p.heads = dims[1];
    p.l = dims[2];
    p.d = dims[3];
    p.bh = dims[0] * dims[1];
    p.in = AttnLayout{dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3]};
    p.q = q;
    p.k = k;
    p.v = v;
    return dims[0];
}

}  // namespace irpe_cpu
