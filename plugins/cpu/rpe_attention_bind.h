// RPEAttention's inputs bound into the kernel's problem (AttnProblem), written once for every
// caller: the ONNX Runtime op and the OpenVINO op hand their nine inputs and attributes to
// bind_attention; the C API, whose q, k, v are strided and whose id tables are made ahead
// (irpe_cpu_attention_ids), sets the sizes itself and hands its terms to bind_attention_terms.
// Inputs arrive as plain pointers and dims (AttnInput), so no runtime's types are seen here;
// shapes and element types are checked here, with the messages every caller reports
// (std::invalid_argument).
#ifndef IRPE_CPU_RPE_ATTENTION_BIND_H
#define IRPE_CPU_RPE_ATTENTION_BIND_H

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "rpe_attention_plan.h"

namespace irpe_cpu {

// The op's inputs, in the nodes' order: q (or the packed qkv [B, L, 3, H, d]), k, v, then wk,
// idk, wq, idq, idv, wv; an absent input has data nullptr.
constexpr size_t kAttnInputs = 9;
inline bool attn_index_input(size_t i) { return i == 4 || i == 6 || i == 7; }

// An input's element type, as the runtimes name it.
enum class AttnType { kFloat32, kInt32, kInt64, kOther };

// One input as plain data: its elements (nullptr: absent), its dims and, for an index, whether
// its ids are int64 (else int32).
struct AttnInput {
    const void* data = nullptr;
    std::vector<int64_t> dims;
    bool wide = false;
};

// Input `i` of the op: its element type checked (an index int32 / int64, the rest float32).
AttnInput attn_input(size_t i, const void* data, std::vector<int64_t> dims, AttnType type);

// The op's attributes.
struct AttnAttributes {
    float scale = 1.0f;      // logits = scale * q k^T + the terms
    int64_t out_layout = 0;  // out [B, H, L, d] (0) or [B, L, H, d] (1)
    bool bf16 = false;       // the products in bf16 where the CPU has AVX512_BF16
};
// What is wrong with the attributes scale (finite) and out_layout (0 or 1), or nullptr: checked
// when an op's node is made.
const char* attn_attributes_error(float scale, int64_t out_layout);

// A term's id table as the kernel reads it (pad_ids): `ids` [L, attn_pad(L)], followed by the
// Q table's by-key part or the V table's runs when `extras`; `owner` keeps it alive (empty when
// the caller owns it).
struct AttnIdTable {
    std::shared_ptr<const std::vector<int32_t>> owner;
    const int32_t* ids = nullptr;
    bool extras = false;
};

// The id table of term `kind` for a table of k buckets over l tokens, from its index input:
// the ops make it (attn_id_table) or take it from their cache of constant inputs.
using AttnIdSource =
    std::function<AttnIdTable(AttnIds kind, const AttnInput& index, int64_t l, int64_t k)>;

// An op's [L, L] index input checked ("an index must be [L, L] = [..]") and its table made.
void check_attn_index(const AttnInput& index, int64_t l);
AttnIdTable attn_id_table(AttnIds kind, const AttnInput& index, int64_t l, int64_t k);

// A bound call: the problem (all but `out`), the output's dims, and what the problem points at
// (the padded weights, the id tables), alive as long as this is.
struct AttnBinding {
    AttnProblem p;
    std::vector<int64_t> out_dims;
    std::vector<float> wk, wv;
    AttnIdTable ids[3];  // K, Q, V
};

// The op's inputs (kAttnInputs of them) and attributes into b: sizes, layouts and out_dims,
// then, unless there is nothing to compute, the terms. Returns false when B * H * L * d is 0
// (the terms unread). The caller makes the output of out_dims, sets b.p.out and runs b.p.
bool bind_attention(AttnBinding& b, const AttnInput* in, const AttnAttributes& a,
                    const AttnIdSource& ids);

// The terms into b.p, whose sizes and scale are set: per term K, Q, V its weight (wk [d, K],
// wq [K, d], wv [K, d], leading dims 1) and its index, both present or both absent.
struct AttnTerms {
    const AttnInput* weight[3];
    const AttnInput* index[3];
};
void bind_attention_terms(AttnBinding& b, const AttnTerms& terms, const AttnIdSource& ids);

// q, k, v (dims and data; k, v nullptr when absent) into p: three [B, H, L, d] of one shape,
// or q the packed qkv [B, L, 3, H, d] (timm's reshape of the projection) with k and v absent.
// Returns B; std::invalid_argument for any other layout.
int64_t read_qkv(AttnProblem& p, const std::vector<int64_t>& q_dims, const float* q,
                 const std::vector<int64_t>& k_dims, const float* k,
                 const std::vector<int64_t>& v_dims, const float* v);

}  // namespace irpe_cpu

#endif  // IRPE_CPU_RPE_ATTENTION_BIND_H
