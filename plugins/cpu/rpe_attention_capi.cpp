// libirpe_cpu_attention (irpe_cpu_attention.h): RPEAttention's plan and tasks (rpe_attention.h)
// run on the OpenMP team (else threads started per call), the caller being one of them; no
// runtime. The arguments are bound to the kernel's problem as the ops bind theirs
// (rpe_attention_bind.h): the sizes and strides here, the terms by bind_attention_terms.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <system_error>
#include <string>
#include <thread>
#include <vector>

#include "irpe_cpu_attention.h"
#include "rpe_attention_bind.h"

namespace {

using irpe_cpu::AttnBinding;
using irpe_cpu::AttnIds;
using irpe_cpu::AttnIdTable;
using irpe_cpu::AttnInput;
using irpe_cpu::AttnLayout;
using irpe_cpu::AttnPlan;
using irpe_cpu::AttnProblem;

thread_local std::string last_error;

int fail(const std::string& message)
{
    last_error = message;
    return IRPE_CPU_ERR;
}

template <typename F>
int guarded(F&& body)
{
    try {
        body();
        return IRPE_CPU_OK;
    } catch (const std::exception& e) {
        return fail(e.what());
    }
}

void check_sizes(int64_t l, int64_t k)
{
    if (l < 1 || l > 46340 || k < 1 || k * irpe_cpu::attn_pad(l) > INT32_MAX) {
        throw std::invalid_argument("need 1 <= L <= 46340 and 1 <= K with K * pad(L) < 2^31");
    }
}

AttnProblem problem_of(const irpe_cpu_attention_args& a)
{
    if (a.batch < 0 || a.heads < 1 || a.l < 1 || a.d < 1 || a.l > 46340 || a.d > (1 << 20)) {
        throw std::invalid_argument("need B >= 0, H >= 1, 1 <= L <= 46340, 1 <= d <= 2^20");
    }
    if (a.q == nullptr || a.k == nullptr || a.v == nullptr || a.out == nullptr) {
        throw std::invalid_argument("q, k, v and out are required");
    }
    if ((a.wk != nullptr && (a.idk == nullptr || a.kk < 1)) ||
        (a.wq != nullptr && (a.idq == nullptr || a.kq < 1)) ||
        (a.wv != nullptr && (a.idv == nullptr || a.kv < 1))) {
        throw std::invalid_argument("each term needs its weight, its ids and K >= 1");
    }
    AttnProblem p;
    p.l = a.l;
    p.d = a.d;
    p.bh = a.batch * a.heads;
    p.heads = a.heads;
    p.scale = a.scale;
    p.q = a.q;
    p.k = a.k;
    p.v = a.v;
    p.in = AttnLayout{a.in_stride[0], a.in_stride[1], a.in_stride[2]};
    p.out = a.out;
    p.out_layout = AttnLayout{a.out_stride[0], a.out_stride[1], a.out_stride[2]};
    return p;
}

// The terms present (weight not NULL) with their tables of irpe_cpu_attention_ids, which the
// caller made ahead: [l, pad(l)] ids without the ops' by-key and run parts.
void bind_terms(AttnBinding& b, const irpe_cpu_attention_args& a)
{
    const AttnInput w[3] = {{a.wk, {a.d, a.kk}}, {a.wq, {a.kq, a.d}}, {a.wv, {a.kv, a.d}}};
    const AttnInput ids[3] = {{a.wk ? a.idk : nullptr, {}}, {a.wq ? a.idq : nullptr, {}},
                              {a.wv ? a.idv : nullptr, {}}};
    const irpe_cpu::AttnTerms terms{{&w[0], &w[1], &w[2]}, {&ids[0], &ids[1], &ids[2]}};
    irpe_cpu::bind_attention_terms(
        b, terms, [](AttnIds, const AttnInput& index, int64_t, int64_t) {
            return AttnIdTable{nullptr, static_cast<const int32_t*>(index.data), false};
        });
}

// Runs the plan's tasks on `threads` threads; tasks are claimed in order from one counter. With
// OpenMP the threads are the process's OpenMP team: in a PyTorch process that is PyTorch's own
// (libgomp.so.1 is loaded once per process), so the kernel does not fight PyTorch's workers,
// which spin for a while after each of its parallel regions, for the cores.
void run(AttnPlan& plan, int64_t threads)
{
    std::atomic<int64_t> next{0};
    const int64_t tasks = plan.tasks();
    auto work = [&]() {
        for (int64_t t; (t = next.fetch_add(1)) < tasks;) {
            irpe_cpu::attention_task(&plan, static_cast<size_t>(t));
        }
    };
    const int team = static_cast<int>(std::max<int64_t>(1, std::min(threads, tasks)));
#ifdef _OPENMP
#pragma omp parallel num_threads(team)
    work();
#else
    std::vector<std::thread> helpers;
    try {
        for (int i = 1; i < team; ++i) {
            helpers.emplace_back(work);
        }
    } catch (const std::system_error&) {  // fewer threads: the ones started finish the work
    }
    work();
    for (auto& t : helpers) {
        t.join();
    }
#endif
    if (plan.failed) {
        throw std::runtime_error("out of memory for the per-task scratch");
    }
}

}  // namespace

extern "C" {

int64_t irpe_cpu_attention_pad(int64_t l)
{
    return irpe_cpu::attn_pad(l);
}

int irpe_cpu_attention_ids(int kind, const int64_t* ids, int64_t l, int64_t k, int32_t* out)
{
    return guarded([&] {
        check_sizes(l, k);
        if (ids == nullptr || out == nullptr || kind < 0 || kind > 2) {
            throw std::invalid_argument("ids, out and kind 0 (K), 1 (Q) or 2 (V) are required");
        }
        const AttnIds kinds[3] = {AttnIds::kK, AttnIds::kQ, AttnIds::kV};
        const auto table = irpe_cpu::pad_ids(ids, true, l, k, kinds[kind]);
        // [l, pad(l)]: the row-major part (a Q table's by-key part is for the ops' kernels)
        std::memcpy(out, table.data(), l * irpe_cpu::attn_pad(l) * sizeof(int32_t));
    });
}

int irpe_cpu_attention(const irpe_cpu_attention_args* args, int threads)
{
    return guarded([&] {
        if (args == nullptr) {
            throw std::invalid_argument("args is required");
        }
        const irpe_cpu_attention_args& a = *args;
        AttnBinding b;
        b.p = problem_of(a);
        if (b.p.bh == 0) {
            return;
        }
        bind_terms(b, a);
        if (threads < 1) {
            threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
        }
        AttnPlan plan;
        irpe_cpu::plan_attention(plan, b.p, irpe_cpu::simd_level(), threads);
        run(plan, threads);
    });
}

const char* irpe_cpu_attention_error(void)
{
    return last_error.c_str();
}

const char* irpe_cpu_attention_simd(void)
{
    const auto simd = irpe_cpu::simd_level();
    return simd == irpe_cpu::Simd::kAvx512 ? "avx512"
           : simd == irpe_cpu::Simd::kAvx2 ? "avx2"
                                          : "portable";
}

}  // extern "C"
