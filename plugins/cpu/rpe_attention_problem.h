// RPEAttention's problem: one call's sizes, data and optional tables (AttnProblem), the
// paddings and layouts the kernel reads, and one task's scratch (AttnScratch, attn_carve). The
// block's math over them is rpe_attention.h.
#ifndef IRPE_CPU_RPE_ATTENTION_PROBLEM_H
#define IRPE_CPU_RPE_ATTENTION_PROBLEM_H

#include <algorithm>
#include <cstdint>

namespace irpe_cpu {

// Column padding of every scratch row and id row: 16 floats, one AVX-512 vector (the GEMM
// tiles are 2 vectors wide, and 1 vector for a last 16 columns).
constexpr int64_t kAttnPad = 16;
inline int64_t attn_pad(int64_t n) { return (n + kAttnPad - 1) / kAttnPad * kAttnPad; }
// The V ids by runs: row i at i * attn_runs_stride(L), pairs (end, bucket) of the runs of equal
// consecutive ids, the last end L (a DeiT-S product row: ~85 runs for 197 keys). A run's sum is
// the difference of two prefix sums (V::prefix_sums), so the buckets take one add per run
// instead of one dependent add per key.
inline int64_t attn_runs_stride(int64_t l) { return 2 * l; }
// The iRPE-Q bias of a pair made by key where its table has <= kQByKey buckets and L is at
// most kQByKeyPad (padded): per key j its row k_j @ wq^T in registers (V::Lut), looked up
// along the queries by idqt[j], into [L, Lp] rows, transposed 16 x 16 (V::transpose16) into
// the pair's bias rows. On AMD Zen a 16-lane gather per 16 logits cost 12% of the block.
constexpr int64_t kQByKey = 64, kQByKeyPad = 256;

// One call's sizes and data. Ids are int32 [L, attn_pad(L)], -1 outside the table and in the
// padding; a term is present when its weight is not null.
struct AttnLayout {  // element strides of batch, head and row (a row: d contiguous floats)
    int64_t batch = 0, head = 0, row = 0;
    int64_t at(int64_t bh, int64_t heads) const { return bh / heads * batch + bh % heads * head; }
};

struct AttnProblem {
    int64_t l = 0, d = 0, bh = 0, heads = 1;     // tokens, head dim, batch * heads, heads
    float scale = 1.0f;                          // logits = scale * q k^T + terms
    const float* q = nullptr;                    // pair (0, 0), row 0 of q, k, v, at `in`
    const float* k = nullptr;
    const float* v = nullptr;
    AttnLayout in;                               // [B, H, L, d] or the qkv [B, L, 3, H, d]
    float* out = nullptr;                        // at `out_layout`: [B, H, L, d] or [B, L, H, d]
    AttnLayout out_layout;
    int64_t kk = 0;                              // iRPE-K: table q @ wk, wk [d, attn_pad(kk)]
    const float* wk = nullptr;                   //   (scale folded in, zero columns past kk)
    const int32_t* idk = nullptr;                //   ids into the query's table row
    int64_t kq = 0;                              // iRPE-Q: table wq @ k^T [kq, attn_pad(L)],
    const float* wq = nullptr;                   //   wq [kq, d]
    const int32_t* idq = nullptr;                //   ids c * attn_pad(L) + j into that table
    const int32_t* idqt = nullptr;               //   by key (optional): [L, attn_pad(L)] ids c
    int64_t kv = 0;                              // iRPE-V: out += bucket sums @ wv,
    const float* wv = nullptr;                   //   wv [kv, attn_pad(d)] (zero past d)
    const int32_t* idv = nullptr;                //   ids: the bucket of key j, kv outside
    const int32_t* vruns = nullptr;              //   by runs (optional): attn_runs layout
    bool bf16 = false;                           // q k^T and p v in bfloat16 where the CPU
};                                               //   has AVX512_BF16 (rpe_attention_bf16.cpp)

// One task's scratch at row block mr: k^T, the Q table, a block's logits, K table rows, output
// tile and V sums, v padded (only when d is not a multiple of kAttnPad) and the V partial sums.
struct AttnScratch {
    float *kt, *tq, *s, *tk, *c, *sums, *vp, *vacc;
    float *tqt, *bt, *bq;  // by key: the Q table transposed [Lp, 64], bias^T, bias [Lp, Lp]
    float* pre;            // by runs: a row's prefix sums [Lp]
};

// Whether pair tasks of p may make the Q bias by key (the scratch holds its pieces).
inline bool attn_q_by_key(const AttnProblem& p)
{
    return p.wq != nullptr && p.idqt != nullptr && p.kq <= kQByKey &&
           attn_pad(p.l) <= kQByKeyPad;
}

// Partial sums of the V bucket sums: keys j go to copy j % kVCopies, so neighbouring keys of
// one bucket never wait on each other's store.
constexpr int kVCopies = 4;

// Carves `base` into the pieces (when given) and returns the floats they take: the layout once.
inline int64_t attn_carve(const AttnProblem& p, int mr, float* base, AttnScratch* out)
{
    const int64_t lp = attn_pad(p.l), dp = attn_pad(p.d);
    const bool key = attn_q_by_key(p);
    const int64_t tq_rows = std::max(key ? kQByKey : 0, (p.kq + mr - 1) / mr * mr);
    const int64_t sizes[12] = {p.d * lp, p.wq != nullptr ? tq_rows * lp : 0,
                               mr * lp, mr * attn_pad(p.kk), mr * dp, mr * p.kv,
                               p.d != dp ? p.l * dp : 0, kVCopies * (p.kv + 1),
                               key ? lp * kQByKey : 0, key ? lp * lp : 0, key ? lp * lp : 0,
                               p.vruns != nullptr ? lp : 0};
    int64_t at[13] = {0};
    for (int i = 0; i < 12; ++i) {
        at[i + 1] = at[i] + sizes[i];
    }
    if (out != nullptr) {
        *out = AttnScratch{base + at[0], base + at[1], base + at[2],  base + at[3],
                           base + at[4], base + at[5], base + at[6],  base + at[7],
                           base + at[8], base + at[9], base + at[10], base + at[11]};
    }
    return at[12];
}

// Scratch floats one task needs at row block mr.
inline int64_t attn_scratch(const AttnProblem& p, int mr)
{
    return attn_carve(p, mr, nullptr, nullptr);
}

}  // namespace irpe_cpu

#endif  // IRPE_CPU_RPE_ATTENTION_PROBLEM_H
