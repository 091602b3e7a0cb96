// RPEGather / RPEScatter for OpenVINO: shapes, attributes and the CPU evaluation. The rows, the
// id narrowing and the bucket lists are plugins/cpu/rpe_cpu.h's (the ONNX Runtime library's
// too); rows go to OpenVINO's thread pool (ov::parallel_for: the CPU plugin's arena, so
// INFERENCE_NUM_THREADS holds). Each row is written by one task, in a fixed order: the result
// does not depend on the thread count.
#include "rpe_ov_ops.hpp"

#include <algorithm>
#include <stdexcept>
#include <vector>

#include <openvino/core/parallel.hpp>
#include <openvino/op/constant.hpp>

#include "rpe_cpu.h"

namespace irpe_ov {

namespace {

constexpr int64_t kRowsPerTask = 32;

// The (Lq, Lk) ids as int32, -1 outside [0, K): the form the rows index with.
std::vector<int32_t> narrow(const ov::Tensor& index, int64_t k)
{
    std::vector<int32_t> ids;
    if (!irpe_cpu::narrow_ids(index.data(), index.get_element_type() == ov::element::i64,
                              static_cast<int64_t>(index.get_size()), k, ids)) {
        throw std::invalid_argument("the number of buckets K must be < 2^31");
    }
    return ids;
}

bool constant_input(const ov::Node& node, size_t input)
{
    return ov::as_type<ov::op::v0::Constant>(node.get_input_node_ptr(input)) != nullptr;
}

void check_index(const ov::Node& node, const ov::PartialShape& index)
{
    NODE_VALIDATION_CHECK(&node, index.rank().compatible(2), "index must be (Lq, Lk), got ",
                          index);
    const auto type = node.get_input_element_type(1);
    NODE_VALIDATION_CHECK(&node, type.is_dynamic() || type == ov::element::i64 ||
                          type == ov::element::i32, "index must be int64 or int32, got ", type);
}

}  // namespace

RPEGather::RPEGather(const ov::OutputVector& args) : Op(args)
{
    constructor_validate_and_infer_types();
}

void RPEGather::validate_and_infer_types()
{
    const auto& table = get_input_partial_shape(0);
    const auto& index = get_input_partial_shape(1);
    NODE_VALIDATION_CHECK(this, table.rank().compatible(4), "table must be (B, H, Lq|1, K), got ",
                          table);
    check_index(*this, index);
    if (table.rank().is_static() && index.rank().is_static()) {
        NODE_VALIDATION_CHECK(this, table[2].compatible(1) || table[2].compatible(index[0]),
                              "RPEGather: table must be [B, H, Lq or 1, K] and index [Lq, Lk], "
                              "got ", table, " and ", index);
    }
    ov::PartialShape out = ov::PartialShape::dynamic(4);
    if (table.rank().is_static()) {
        out[0] = table[0];
        out[1] = table[1];
    }
    if (index.rank().is_static()) {
        out[2] = index[0];
        out[3] = index[1];
    }
    set_output_type(0, get_input_element_type(0), out);
}

std::shared_ptr<ov::Node> RPEGather::clone_with_new_inputs(const ov::OutputVector& args) const
{
    check_new_args_count(this, args);
    return std::make_shared<RPEGather>(args);
}

bool RPEGather::visit_attributes(ov::AttributeVisitor&) { return true; }

bool RPEGather::has_evaluate() const { return get_input_element_type(0) == ov::element::f32; }

bool RPEGather::evaluate(ov::TensorVector& outputs, const ov::TensorVector& inputs) const
{
    const ov::Tensor& table = inputs[0];
    const ov::Shape ts = table.get_shape(), is = inputs[1].get_shape();
    const int64_t b = ts[0], h = ts[1], rows = ts[2], k = ts[3], lq = is[0], lk = is[1];
    if (ts.size() != 4 || is.size() != 2 || (rows != 1 && rows != lq)) {
        throw std::invalid_argument("RPEGather: table must be [B, H, Lq or 1, K] and index "
                                    "[Lq, Lk]");
    }
    outputs[0].set_shape({ts[0], ts[1], is[0], is[1]});
    const auto ids = tables_->get<std::vector<int32_t>>(constant_input(*this, 1), 0, lq * lk, k,
                                                        [&] { return narrow(inputs[1], k); });
    const float* t = table.data<const float>();
    float* out = outputs[0].data<float>();
    const int64_t total = b * h * lq, tasks = (total + kRowsPerTask - 1) / kRowsPerTask;
    ov::parallel_for(static_cast<size_t>(tasks), [&](size_t task) {
        const int64_t end = std::min<int64_t>(total, (task + 1) * kRowsPerTask);
        for (int64_t r = task * kRowsPerTask; r < end; ++r) {
            const int64_t i = r % lq, bh = r / lq;
            irpe_cpu::gather_row(t + (bh * rows + (rows == 1 ? 0 : i)) * k, ids->data() + i * lk,
                                 lk, k, out + r * lk);
        }
    });
    return true;
}

RPEScatter::RPEScatter(const ov::OutputVector& args, int64_t num_buckets)
    : Op(args), num_buckets_(num_buckets)
{
    constructor_validate_and_infer_types();
}

void RPEScatter::validate_and_infer_types()
{
    const auto& attn = get_input_partial_shape(0);
    NODE_VALIDATION_CHECK(this, attn.rank().compatible(4), "attn must be (B, H, Lq, Lk), got ",
                          attn);
    const auto& index = get_input_partial_shape(1);
    check_index(*this, index);
    if (attn.rank().is_static() && index.rank().is_static()) {
        NODE_VALIDATION_CHECK(this, index[0].compatible(attn[2]) && index[1].compatible(attn[3]),
                              "RPEScatter: attn must be [B, H, Lq, Lk] and index [Lq, Lk], "
                              "got ", attn, " and ", index);
    }
    NODE_VALIDATION_CHECK(this, num_buckets_ > 0, "num_buckets must be > 0, got ", num_buckets_);
    ov::PartialShape out = ov::PartialShape::dynamic(4);
    if (attn.rank().is_static()) {
        out = attn;
    }
    out[3] = num_buckets_;
    set_output_type(0, get_input_element_type(0), out);
}

std::shared_ptr<ov::Node> RPEScatter::clone_with_new_inputs(const ov::OutputVector& args) const
{
    check_new_args_count(this, args);
    return std::make_shared<RPEScatter>(args, num_buckets_);
}

bool RPEScatter::visit_attributes(ov::AttributeVisitor& visitor)
{
    visitor.on_attribute("num_buckets", num_buckets_);
    return true;
}

bool RPEScatter::has_evaluate() const { return get_input_element_type(0) == ov::element::f32; }

bool RPEScatter::evaluate(ov::TensorVector& outputs, const ov::TensorVector& inputs) const
{
    const ov::Shape as = inputs[0].get_shape(), is = inputs[1].get_shape();
    if (as.size() != 4 || is.size() != 2 || is[0] != as[2] || is[1] != as[3]) {
        throw std::invalid_argument("RPEScatter: attn must be [B, H, Lq, Lk] and index "
                                    "[Lq, Lk]");
    }
    const int64_t bh = as[0] * as[1], lq = as[2], lk = as[3], k = num_buckets_;
    outputs[0].set_shape({as[0], as[1], as[2], static_cast<size_t>(k)});
    const auto lists = tables_->get<irpe_cpu::BucketLists>(constant_input(*this, 1), 0, lq * lk,
                                                           k, [&] {
        return irpe_cpu::all_bucket_lists(narrow(inputs[1], k).data(), lq, lk, k);
    });
    const float* a = inputs[0].data<const float>();
    float* out = outputs[0].data<float>();
    // A task: four (b, h) rows of one query (their bucket lists walked once), or the rest.
    const int64_t groups = (bh + 3) / 4;
    ov::parallel_for(static_cast<size_t>(groups * lq), [&](size_t task) {
        const int64_t g = static_cast<int64_t>(task) / lq, i = static_cast<int64_t>(task) % lq;
        const int32_t* o = lists->off.data() + i * (k + 1);
        const int32_t* p = lists->pos.data() + i * lk;
        const int64_t first = 4 * g, in_stride = lq * lk, out_stride = lq * k;
        const float* src = a + first * in_stride + i * lk;
        float* dst = out + first * out_stride + i * k;
        if (first + 4 <= bh) {
            irpe_cpu::scatter_rows4(src, in_stride, o, p, k, dst, out_stride);
            return;
        }
        for (int64_t r = first; r < bh; ++r) {
            irpe_cpu::scatter_row(src + (r - first) * in_stride, o, p, k,
                                  dst + (r - first) * out_stride);
        }
    });
    return true;
}

}  // namespace irpe_ov
