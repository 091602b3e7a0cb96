// libirpe_openvino.so: the iRPE ops for OpenVINO (ov::Core::add_extension). Registers the two
// operations (so an IR that holds them reads back) and their ONNX-frontend mapping from the
// exporter's nodes (domain "irpe"), so an exported file loads as it is.
#include <openvino/core/extension.hpp>
#include <openvino/core/op_extension.hpp>
#include <openvino/frontend/onnx/extension/op.hpp>

#include <openvino/op/constant.hpp>

#include "rpe_ov_ops.hpp"

namespace {

// RPEAttention from the ONNX Runtime fusion's node: its absent (empty-name) inputs become
// empty tensors, its attributes scale, out_layout and precision are read with their defaults.
ov::OutputVector convert_attention(const ov::frontend::NodeContext& ctx)
{
    ov::OutputVector args;
    for (size_t i = 0; i < 9; ++i) {
        const ov::Output<ov::Node> given =
            i < ctx.get_input_size() ? ctx.get_input(static_cast<int>(i)) : ov::Output<ov::Node>();
        if (given.get_node() != nullptr &&  // the ONNX frontend's NullNode: an empty name
            std::string(given.get_node()->get_type_name()) != "NullNode") {
            args.push_back(given);
        } else {
            const bool index = i == 4 || i == 6 || i == 7;
            args.push_back(ov::op::v0::Constant::create(index ? ov::element::i64
                                                              : ov::element::f32,
                                                        ov::Shape{0}, std::vector<int64_t>{}));
        }
    }
    const float scale = ctx.get_attribute<float>("scale", 1.0f);
    const int64_t layout = ctx.get_attribute<int64_t>("out_layout", 0);
    const std::string precision = ctx.get_attribute<std::string>("precision", "f32");
    return std::make_shared<irpe_ov::RPEAttention>(args, scale, layout, precision)->outputs();
}

}  // namespace

OPENVINO_CREATE_EXTENSIONS(std::vector<ov::Extension::Ptr>({
    std::make_shared<ov::OpExtension<irpe_ov::RPEGather>>(),
    std::make_shared<ov::OpExtension<irpe_ov::RPEScatter>>(),
    std::make_shared<ov::frontend::onnx::OpExtension<irpe_ov::RPEGather>>("RPEGather", "irpe"),
    std::make_shared<ov::frontend::onnx::OpExtension<irpe_ov::RPEScatter>>("RPEScatter", "irpe"),
    std::make_shared<ov::OpExtension<irpe_ov::RPEAttention>>(),
    std::make_shared<ov::frontend::onnx::ConversionExtension>("RPEAttention", "irpe",
                                                              convert_attention),
}));
