// Case files of the plugin harness (written by tests/trt_harness/cases.py): one ONNX plugin node
// (op type, attributes) with its input tensors and the expected output's shape and type.
//
//   node RPEGather                     op_type of the ONNX node
//   attr plugin_namespace s irpe       node attributes: i = INT, f = FLOAT, s = STRING
//   attr num_buckets i 50
//   input float16 4 2 2 26 50 in0.bin  dtype, rank, dims, raw little-endian file (case folder)
//   input int64 2 26 26 in1.bin
//   output float16 4 2 2 26 26 out.bin expected dtype and dims; the harness writes the file
#ifndef IRPE_TRT_HARNESS_CASE_IO_H
#define IRPE_TRT_HARNESS_CASE_IO_H

#include <NvInferRuntime.h>

#include <cstdint>
#include <string>
#include <vector>

namespace harness {

struct Attr {
    std::string name;
    char kind = 's';  // i, f, s as in ONNX (INT, FLOAT, STRING)
    std::string text;
    int32_t i = 0;
    float f = 0.0f;
};

struct Tensor {
    nvinfer1::DataType type = nvinfer1::DataType::kFLOAT;
    nvinfer1::Dims dims{};
    std::string file;            // relative to the case folder
    std::vector<uint8_t> bytes;  // inputs: the file's contents
    int64_t volume() const;
    size_t size_bytes() const;
};

struct Case {
    std::string name;  // the case folder's name
    std::string folder;
    std::string node;  // op type = plugin name
    std::vector<Attr> attrs;
    std::vector<Tensor> inputs;
    Tensor output;
    // The node's attribute of that name and kind, or nullptr.
    Attr const* attr(std::string const& name) const;
};

// Parse folder/case.txt and read the input files; empty string on success, else the error.
std::string load_case(std::string const& folder, Case& out);
bool write_file(std::string const& path, void const* data, size_t bytes);
size_t element_size(nvinfer1::DataType t);
char const* type_name(nvinfer1::DataType t);
// The tensor as TensorRT describes it to a plugin: linear format, scale 1.
nvinfer1::PluginTensorDesc desc_of(Tensor const& t);

}  // namespace harness

#endif  // IRPE_TRT_HARNESS_CASE_IO_H
