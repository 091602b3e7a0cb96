// RPEAttention for OpenVINO (rpe_ov_ops.hpp): the OpenVINO glue of plugins/cpu's attention
// block (rpe_attention.h: plan, tasks, SIMD rows; no runtime in it). The inputs are bound by
// the binder the ONNX Runtime op and the C API use too (rpe_attention_bind.h); the tasks run on
// OpenVINO's thread pool (ov::parallel_for: the CPU plugin's arena, so INFERENCE_NUM_THREADS
// holds). Each (b, h) pair's part is one task: deterministic for any thread count. The padded
// id tables of constant index inputs are made once per node.
#include <cmath>
#include <stdexcept>

#include <openvino/core/parallel.hpp>
#include <openvino/op/constant.hpp>

#include "rpe_attention_bind.h"
#include "rpe_ov_ops.hpp"

namespace irpe_ov {

using irpe_cpu::AttnIds;
using irpe_cpu::AttnIdTable;
using irpe_cpu::AttnInput;

namespace {

irpe_cpu::AttnType type_of(const ov::element::Type& type)
{
    return type == ov::element::f32   ? irpe_cpu::AttnType::kFloat32
           : type == ov::element::i32 ? irpe_cpu::AttnType::kInt32
           : type == ov::element::i64 ? irpe_cpu::AttnType::kInt64
                                      : irpe_cpu::AttnType::kOther;
}

// Input i as the binder reads it: an empty tensor (shape [0], how an absent input comes from
// the ONNX frontend) has data nullptr.
AttnInput input_of(const ov::Tensor& t, size_t i)
{
    const ov::Shape s = t.get_shape();
    std::vector<int64_t> dims(s.begin(), s.end());
    if (t.get_size() == 0) {
        return AttnInput{nullptr, std::move(dims)};
    }
    return irpe_cpu::attn_input(i, t.data(), std::move(dims), type_of(t.get_element_type()));
}

}  // namespace

RPEAttention::RPEAttention(const ov::OutputVector& args, float scale, int64_t out_layout,
                           const std::string& precision)
    : Op(args), scale_(scale), out_layout_(out_layout), precision_(precision)
{
    constructor_validate_and_infer_types();
}

void RPEAttention::validate_and_infer_types()
{
    NODE_VALIDATION_CHECK(this, get_input_size() == irpe_cpu::kAttnInputs,
                          "RPEAttention takes 9 inputs, got ", get_input_size());
    const char* error = irpe_cpu::attn_attributes_error(scale_, out_layout_);
    NODE_VALIDATION_CHECK(this, error == nullptr, error);  // (read only when not nullptr)
    NODE_VALIDATION_CHECK(this, precision_ == "f32" || precision_ == "bf16",
                          "precision must be f32 or bf16, got ", precision_);
    const auto& q = get_input_partial_shape(0);
    ov::PartialShape out = ov::PartialShape::dynamic(4);
    if (q.rank().is_static() && q.rank().get_length() == 5) {  // [B, L, 3, H, d]
        out = out_layout_ == 1 ? ov::PartialShape{q[0], q[1], q[3], q[4]}
                               : ov::PartialShape{q[0], q[3], q[1], q[4]};
    } else if (q.rank().is_static() && q.rank().get_length() == 4) {  // [B, H, L, d]
        out = out_layout_ == 1 ? ov::PartialShape{q[0], q[2], q[1], q[3]} : q;
    }
    set_output_type(0, get_input_element_type(0), out);
}

std::shared_ptr<ov::Node> RPEAttention::clone_with_new_inputs(const ov::OutputVector& args) const
{
    check_new_args_count(this, args);
    return std::make_shared<RPEAttention>(args, scale_, out_layout_, precision_);
}

bool RPEAttention::visit_attributes(ov::AttributeVisitor& visitor)
{
    visitor.on_attribute("scale", scale_);
    visitor.on_attribute("out_layout", out_layout_);
    visitor.on_attribute("precision", precision_);
    return true;
}

AttnIdTable RPEAttention::ids(AttnIds kind, const AttnInput& index, int64_t l, int64_t k) const
{
    const size_t inputs[3] = {4, 6, 7};  // idk, idq, idv
    const int which = static_cast<int>(kind);
    const bool constant =
        ov::as_type<ov::op::v0::Constant>(get_input_node_ptr(inputs[which])) != nullptr;
    return *tables_->get<AttnIdTable>(constant, which, l, k, [&] {
        return irpe_cpu::attn_id_table(kind, index, l, k);
    });
}

bool RPEAttention::has_evaluate() const { return get_input_element_type(0) == ov::element::f32; }

bool RPEAttention::evaluate(ov::TensorVector& outputs, const ov::TensorVector& inputs) const
{
    AttnInput in[irpe_cpu::kAttnInputs];
    for (size_t i = 0; i < irpe_cpu::kAttnInputs; ++i) {
        in[i] = input_of(inputs[i], i);
    }
    irpe_cpu::AttnBinding b;
    const irpe_cpu::AttnAttributes attributes{scale_, out_layout_, precision_ == "bf16"};
    const bool work = irpe_cpu::bind_attention(
        b, in, attributes, [this](AttnIds kind, const AttnInput& index, int64_t l, int64_t k) {
            return ids(kind, index, l, k);
        });
    outputs[0].set_shape(ov::Shape(b.out_dims.begin(), b.out_dims.end()));
    b.p.out = outputs[0].data<float>();
    if (!work) {
        return true;
    }
    irpe_cpu::AttnPlan plan;
    irpe_cpu::plan_attention(plan, b.p, irpe_cpu::simd_level(), parallel_get_max_threads());
    ov::parallel_for(static_cast<size_t>(plan.tasks()),
                     [&](size_t task) { irpe_cpu::attention_task(&plan, task); });
    if (plan.failed) {
        throw std::runtime_error("out of memory for the per-task scratch");
    }
    return true;
}

}  // namespace irpe_ov
