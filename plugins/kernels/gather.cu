// Bucket gather: out[b,h,i,j] = table[b,h,i,id(i,j)].
//
// One task = one query row i for a chunk of (b, h) pairs. The block stages those table rows
// (K values each) in shared memory, then every thread takes VEC consecutive keys j, reads
// their ids ONCE (from the index tensor or computed on the fly) and writes them for every
// (b, h) of the chunk: the index is read once per chunk, the output written coalesced (as
// one VEC-wide store per thread where aligned). Blocks walk the tasks grid-stride.
#include "irpe_device.cuh"

namespace irpe {
namespace {

constexpr int kGatherThreads = 256;

template <typename T, typename Ids, int VEC>
__global__ void __launch_bounds__(kGatherThreads)
    gather_kernel(const T* __restrict__ table, Ids ids, T* __restrict__ out, irpe_problem p,
                  int chunk, int64_t n_chunks, bool staged)
{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* rows = reinterpret_cast<T*>(smem_raw);  // [chunk][K] when staged
    const int64_t bh_total = p.batch * p.heads, k = p.num_buckets;
    const T zero = from_float<T>(0.0f);
    for (int64_t task = blockIdx.x; task < p.lq * n_chunks; task += gridDim.x) {
        const int64_t i = task / n_chunks, bh0 = (task % n_chunks) * chunk;
        const int nbh = (int)min((int64_t)chunk, bh_total - bh0);
        if (staged) {
            __syncthreads();  // the previous task is done reading `rows`
            for (int64_t e = threadIdx.x; e < nbh * k; e += blockDim.x) {
                rows[e] = table[row_offset(p, bh0 + e / k, i) + (e % k) * p.stride[3]];
            }
            __syncthreads();
        }
        for (int64_t j = (int64_t)threadIdx.x * VEC; j < p.lk; j += (int64_t)blockDim.x * VEC) {
            int t[VEC];
            ids.template load<VEC>(i, j, t);
            for (int c = 0; c < nbh; ++c) {
                const T* src = staged ? rows + c * k : table + row_offset(p, bh0 + c, i);
                const int64_t step = staged ? 1 : p.stride[3];
                Vec<T, VEC> v;
#pragma unroll
                for (int e = 0; e < VEC; ++e) {
                    v.v[e] = (t[e] >= 0 && t[e] < k) ? src[t[e] * step] : zero;
                }
                store_vec<T, VEC>(out + ((bh0 + c) * p.lq + i) * p.lk + j, v);
            }
        }
    }
}

template <typename T, typename Ids, int VEC>
int launch(const irpe_problem& p, const void* table, Ids ids, void* out, cudaStream_t stream)
{
    const size_t row_bytes = (size_t)p.num_buckets * sizeof(T);
    const bool staged = row_bytes <= kSmemBudget;  // else read the table through L1/L2
    const Plan plan = make_plan(p, staged ? row_bytes : 0, 0);
    gather_kernel<T, Ids, VEC><<<plan.grid, kGatherThreads, plan.smem, stream>>>(
        static_cast<const T*>(table), ids, static_cast<T*>(out), p, plan.chunk, plan.n_chunks,
        staged);
    return finish_launch();
}

// The launch for one element type and id source; 16-byte stores where the output rows (and
// an index tensor) are aligned for them, else scalar (still coalesced) ones.
struct GatherOp {
    const irpe_problem& p;
    const void* in;  // table
    void* out;
    cudaStream_t stream;

    template <typename T, typename Ids>
    int run(Ids ids, const void* index, size_t index_bytes) const
    {
        constexpr int kVec = 16 / sizeof(T);
        const bool vec = p.lk % kVec == 0 && aligned(out, 16) &&
                         (!index || aligned(index, index_bytes * kVec));
        return vec ? launch<T, Ids, kVec>(p, in, ids, out, stream)
                   : launch<T, Ids, 1>(p, in, ids, out, stream);
    }
};

}  // namespace
}  // namespace irpe

extern "C" int irpe_gather(const irpe_problem* problem, irpe_dtype dtype, const void* table,
                           irpe_index_dtype index_dtype, const void* index, void* out,
                           void* stream)
{
    return irpe::check_and_run<irpe::GatherOp>(problem, dtype, table, index_dtype, index, nullptr,
                                               out, stream);
}

// params == NULL is rejected by the check (neither an index nor a grid).
extern "C" int irpe_gather_grid(const irpe_problem* problem, irpe_dtype dtype, const void* table,
                                const irpe_bucket_params* params, void* out, void* stream)
{
    return irpe::check_and_run<irpe::GatherOp>(problem, dtype, table, IRPE_INT32, nullptr, params,
                                               out, stream);
}
