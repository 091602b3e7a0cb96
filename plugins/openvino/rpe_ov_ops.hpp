// The iRPE ops as OpenVINO operations (opset "irpe"), run by the CPU plugin through evaluate():
//   RPEGather(table[B,H,Lq|1,K], index[Lq,Lk]) -> out[b,h,i,j] = table[b,h,i|0,index[i,j]]
//   RPEScatter(attn[B,H,Lq,Lk], index[Lq,Lk]; num_buckets=K)
//                                     -> sums[b,h,i,k] = sum over j with index[i,j] == k of attn
// The contract of export/functions.py and the CUDA kernels (irpe_kernels.h): ids outside
// [0, K) gather 0 and are dropped from the sums. The rows are plugins/cpu/rpe_cpu.h's, the same
// code the ONNX Runtime library runs, spread over OpenVINO's own thread pool.
#ifndef IRPE_OV_RPE_OV_OPS_HPP
#define IRPE_OV_RPE_OV_OPS_HPP

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include <openvino/op/op.hpp>

#include "rpe_attention_bind.h"

namespace irpe_ov {

// Tables an op derives from its index inputs (narrowed ids, bucket lists, padded id tables):
// made once per slot and sizes when the input is a Constant (as in every exported file) and
// shared by all calls and threads; made on each call otherwise.
class ConstTables {
 public:
    template <typename T, typename Make>
    std::shared_ptr<const T> get(bool constant, int slot, int64_t a, int64_t b, Make&& make)
    {
        if (!constant) {
            return std::make_shared<const T>(make());
        }
        std::lock_guard<std::mutex> lock(mutex_);
        Entry& e = entries_[slot];
        if (!e.table || e.a != a || e.b != b) {
            e.table = std::make_shared<const T>(make());
            e.a = a;
            e.b = b;
        }
        return std::static_pointer_cast<const T>(e.table);
    }

 private:
    struct Entry {
        std::shared_ptr<const void> table;
        int64_t a = 0, b = 0;
    };
    std::mutex mutex_;
    Entry entries_[3];
};

class RPEGather : public ov::op::Op {
 public:
    OPENVINO_OP("RPEGather", "irpe");

    RPEGather() = default;
    explicit RPEGather(const ov::OutputVector& args);
    void validate_and_infer_types() override;
    std::shared_ptr<ov::Node> clone_with_new_inputs(const ov::OutputVector& args) const override;
    bool visit_attributes(ov::AttributeVisitor& visitor) override;
    bool has_evaluate() const override;
    bool evaluate(ov::TensorVector& outputs, const ov::TensorVector& inputs) const override;

 private:
    std::shared_ptr<ConstTables> tables_ = std::make_shared<ConstTables>();
};

class RPEScatter : public ov::op::Op {
 public:
    OPENVINO_OP("RPEScatter", "irpe");

    RPEScatter() = default;
    RPEScatter(const ov::OutputVector& args, int64_t num_buckets);
    void validate_and_infer_types() override;
    std::shared_ptr<ov::Node> clone_with_new_inputs(const ov::OutputVector& args) const override;
    bool visit_attributes(ov::AttributeVisitor& visitor) override;
    bool has_evaluate() const override;
    bool evaluate(ov::TensorVector& outputs, const ov::TensorVector& inputs) const override;

 private:
    int64_t num_buckets_ = 0;
    std::shared_ptr<ConstTables> tables_ = std::make_shared<ConstTables>();
};

// RPEAttention(q, k, v, wk, idk, wq, idq, idv, wv; scale, out_layout, precision) -> out: a whole
// self-attention block with its iRPE terms (plugins/cpu/rpe_attention.h), as the ONNX Runtime
// library's op of the same name made by irpe/runtime/graph/rewrite_attention.py:
//   logits = scale * q k^T + (scale * q @ wk)[i, idk[i, j]] + (wq @ k^T)[idq[i, j]]
//   out    = softmax(logits) @ v + (bucket sums of softmax by idv) @ wv
// Input 0 the packed qkv [B, L, 3, H, d] (inputs 1, 2 empty) or q, k, v [B, H, L, d]; an absent
// term's inputs are empty tensors (shape [0]); out [B, H, L, d], or [B, L, H, d] (out_layout 1).
// precision "f32" (default) or "bf16": the block's products in bfloat16 with float32 sums where
// the CPU has AVX512_BF16 (plugins/cpu/rpe_attention_bf16.cpp), else float32.
class RPEAttention : public ov::op::Op {
 public:
    OPENVINO_OP("RPEAttention", "irpe");

    RPEAttention() = default;
    RPEAttention(const ov::OutputVector& args, float scale, int64_t out_layout,
                 const std::string& precision = "f32");
    void validate_and_infer_types() override;
    std::shared_ptr<ov::Node> clone_with_new_inputs(const ov::OutputVector& args) const override;
    bool visit_attributes(ov::AttributeVisitor& visitor) override;
    bool has_evaluate() const override;
    bool evaluate(ov::TensorVector& outputs, const ov::TensorVector& inputs) const override;

 private:
    float scale_ = 1.0f;
    int64_t out_layout_ = 0;
    std::string precision_ = "f32";
    std::shared_ptr<ConstTables> tables_ = std::make_shared<ConstTables>();
    // Term `kind`'s padded id table from its index input (made once when a Constant).
    irpe_cpu::AttnIdTable ids(irpe_cpu::AttnIds kind, const irpe_cpu::AttnInput& index,
                              int64_t l, int64_t k) const;
};

}  // namespace irpe_ov

#endif  // IRPE_OV_RPE_OV_OPS_HPP
