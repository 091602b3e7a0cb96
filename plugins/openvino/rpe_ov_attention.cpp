// RPEAttention for OpenVINO (rpe_ov_ops.hpp): the ONNX Runtime library's attention block
// (plugins/onnxruntime/rpe_attention.h: plan, tasks, SIMD rows; no ONNX Runtime in it) with its
// tasks on OpenVINO's thread pool (ov::parallel_for: the CPU plugin's arena, so
// INFERENCE_NUM_THREADS holds). Each (b, h) pair's part is one task: deterministic for any
// thread count. The padded id tables of constant index inputs are made once per node.
#include <cmath>
#include <stdexcept>

#include <openvino/core/parallel.hpp>
#include <openvino/op/constant.hpp>

#include "rpe_attention_plan.h"
#include "rpe_ov_ops.hpp"

namespace irpe_ov {

using irpe_ort::AttnIds;
using irpe_ort::AttnLayout;
using irpe_ort::AttnProblem;

namespace {

bool present(const ov::Tensor& t) { return t.get_size() > 0; }

// rows x cols of a weight shared by the heads ([.., rows, cols], leading dims 1).
void weight_dims(const ov::Tensor& w, const char* name, int64_t& rows, int64_t& cols)
{
    const ov::Shape s = w.get_shape();
    size_t lead = 1;
    for (size_t i = 0; i + 2 < s.size(); ++i) {
        lead *= s[i];
    }
    if (s.size() < 2 || lead != 1 || w.get_element_type() != ov::element::f32) {
        throw std::invalid_argument(std::string(name) + " must be float32 [.., rows, cols]");
    }
    rows = static_cast<int64_t>(s[s.size() - 2]);
    cols = static_cast<int64_t>(s[s.size() - 1]);
}

std::vector<int32_t> padded(const ov::Tensor& ids, int64_t l, int64_t k, AttnIds kind)
{
    const ov::Shape s = ids.get_shape();
    if (s.size() != 2 || static_cast<int64_t>(s[0]) != l || static_cast<int64_t>(s[1]) != l) {
        throw std::invalid_argument("an index must be [L, L]");
    }
    const bool wide = ids.get_element_type() == ov::element::i64;
    return irpe_ort::pad_ids(ids.data(), wide, l, k, kind);
}

std::vector<int64_t> dims_of(const ov::Tensor& t)
{
    const ov::Shape s = t.get_shape();
    return std::vector<int64_t>(s.begin(), s.end());
}

const float* data_of(const ov::Tensor& t) { return present(t) ? t.data<const float>() : nullptr; }

}  // namespace

RPEAttention::RPEAttention(const ov::OutputVector& args, float scale, int64_t out_layout,
                           const std::string& precision)
    : Op(args), scale_(scale), out_layout_(out_layout), precision_(precision)
{
    constructor_validate_and_infer_types();
}

void RPEAttention::validate_and_infer_types()
{
    NODE_VALIDATION_CHECK(this, get_input_size() == 9, "RPEAttention takes 9 inputs, got ",
                          get_input_size());
    NODE_VALIDATION_CHECK(this, std::isfinite(scale_) && (out_layout_ == 0 || out_layout_ == 1),
                          "scale must be finite and out_layout 0 or 1");
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

std::shared_ptr<const std::vector<int32_t>> RPEAttention::ids(int which, size_t input,
                                                              const ov::Tensor& t, int64_t l,
                                                              int64_t k) const
{
    const AttnIds kinds[3] = {AttnIds::kK, AttnIds::kQ, AttnIds::kV};
    const bool constant = ov::as_type<ov::op::v0::Constant>(get_input_node_ptr(input)) != nullptr;
    return tables_->get<std::vector<int32_t>>(constant, which, l, k,
                                              [&] { return padded(t, l, k, kinds[which]); });
}

bool RPEAttention::has_evaluate() const { return get_input_element_type(0) == ov::element::f32; }

bool RPEAttention::evaluate(ov::TensorVector& outputs, const ov::TensorVector& inputs) const
{
    AttnProblem p;
    const int64_t batch = irpe_ort::read_qkv(p, dims_of(inputs[0]), data_of(inputs[0]),
                                             dims_of(inputs[1]), data_of(inputs[1]),
                                             dims_of(inputs[2]), data_of(inputs[2]));
    const int64_t h = p.heads, l = p.l, d = p.d;
    if (l > 46340 || d > (1 << 20)) {
        throw std::invalid_argument("L must be <= 46340 and d <= 2^20");
    }
    outputs[0].set_shape(out_layout_ == 1 ? ov::Shape{size_t(batch), size_t(l), size_t(h), size_t(d)}
                                          : ov::Shape{size_t(batch), size_t(h), size_t(l), size_t(d)});
    p.out_layout = out_layout_ == 1 ? AttnLayout{l * h * d, d, h * d}
                                    : AttnLayout{h * l * d, l * d, d};
    p.out = outputs[0].data<float>();
    p.scale = scale_;
    p.bf16 = precision_ == "bf16";
    if (p.bh * l * d == 0) {
        return true;
    }
    const int wants[3][2] = {{3, 4}, {5, 6}, {8, 7}};  // (weight, index) inputs of K, Q, V
    for (const auto& w : wants) {
        if (present(inputs[w[0]]) != present(inputs[w[1]])) {
            throw std::invalid_argument("each term needs both its weight and its index");
        }
    }
    std::vector<float> wk, wv;
    std::shared_ptr<const std::vector<int32_t>> idk, idq, idv;
    int64_t rows = 0, cols = 0;
    if (present(inputs[3])) {
        weight_dims(inputs[3], "wk", rows, p.kk);
        if (rows != d || p.kk < 1) {
            throw std::invalid_argument("wk must be [d, K]");
        }
        wk = irpe_ort::pad_columns(inputs[3].data<const float>(), d, p.kk, scale_);
        idk = ids(0, 4, inputs[4], l, p.kk);
        p.wk = wk.data();
        p.idk = idk->data();
    }
    if (present(inputs[5])) {
        weight_dims(inputs[5], "wq", p.kq, cols);
        if (cols != d || p.kq < 1 || p.kq * irpe_ort::attn_pad(l) > INT32_MAX) {
            throw std::invalid_argument("wq must be [K, d] with K * L < 2^31");
        }
        idq = ids(1, 6, inputs[6], l, p.kq);
        p.wq = inputs[5].data<const float>();
        p.idq = idq->data();
        p.idqt = idq->data() + l * irpe_ort::attn_pad(l);
    }
    if (present(inputs[8])) {
        weight_dims(inputs[8], "wv", p.kv, cols);
        if (cols != d || p.kv < 1) {
            throw std::invalid_argument("wv must be [K, d]");
        }
        idv = ids(2, 7, inputs[7], l, p.kv);
        wv = irpe_ort::pad_columns(inputs[8].data<const float>(), p.kv, d, 1.0f);
        p.wv = wv.data();
        p.idv = idv->data();
        p.vruns = idv->data() + l * irpe_ort::attn_pad(l);
    }
    irpe_ort::AttnPlan plan;
    irpe_ort::plan_attention(plan, p, irpe_ort::simd_level(), parallel_get_max_threads());
    ov::parallel_for(static_cast<size_t>(plan.tasks()),
                     [&](size_t task) { irpe_ort::attention_task(&plan, task); });
    if (plan.failed) {
        throw std::runtime_error("out of memory for the per-task scratch");
    }
    return true;
}

}  // namespace irpe_ov
