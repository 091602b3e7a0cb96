// Reading the harness's case files (format: case_io.h).
#include "case_io.h"

#include <fstream>
#include <iterator>
#include <sstream>

namespace harness {

using nvinfer1::DataType;

namespace {

struct TypeName {
    char const* name;
    DataType type;
    size_t bytes;
};
TypeName const kTypes[] = {{"float32", DataType::kFLOAT, 4}, {"float16", DataType::kHALF, 2},
                           {"bfloat16", DataType::kBF16, 2}, {"int32", DataType::kINT32, 4},
                           {"int64", DataType::kINT64, 8}};

bool parse_type(std::string const& name, DataType& out)
{
    for (TypeName const& t : kTypes) {
        if (name == t.name) {
            out = t.type;
            return true;
        }
    }
    return false;
}

bool parse_tensor(std::istringstream& line, Tensor& t)
{
    std::string type;
    int32_t rank = -1;
    if (!(line >> type >> rank) || !parse_type(type, t.type) || rank < 0 ||
        rank > nvinfer1::Dims::MAX_DIMS) {
        return false;
    }
    t.dims.nbDims = rank;
    for (int32_t d = 0; d < rank; ++d) {
        if (!(line >> t.dims.d[d]) || t.dims.d[d] < 0) {
            return false;
        }
    }
    return static_cast<bool>(line >> t.file);
}

bool read_file(std::string const& path, std::vector<uint8_t>& out)
{
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        return false;
    }
    out.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    return true;
}

}  // namespace

size_t element_size(DataType t)
{
    for (TypeName const& n : kTypes) {
        if (n.type == t) {
            return n.bytes;
        }
    }
    return 0;
}

char const* type_name(DataType t)
{
    for (TypeName const& n : kTypes) {
        if (n.type == t) {
            return n.name;
        }
    }
    return "unsupported";
}

int64_t Tensor::volume() const
{
    int64_t v = 1;
    for (int32_t d = 0; d < dims.nbDims; ++d) {
        v *= dims.d[d];
    }
    return v;
}

size_t Tensor::size_bytes() const { return static_cast<size_t>(volume()) * element_size(type); }

Attr const* Case::attr(std::string const& n) const
{
    for (Attr const& a : attrs) {
        if (a.name == n) {
            return &a;
        }
    }
    return nullptr;
}

std::string load_case(std::string const& folder, Case& c)
{
    c.folder = folder;
    c.name = folder.substr(folder.find_last_of('/') + 1);
    std::ifstream in(folder + "/case.txt");
    if (!in) {
        return "cannot read " + folder + "/case.txt";
    }
    std::string text;
    bool have_output = false;
    for (int lineno = 1; std::getline(in, text); ++lineno) {
        std::istringstream line(text);
        std::string key;
        if (!(line >> key)) {
            continue;
        }
        bool ok = true;
        if (key == "node") {
            ok = static_cast<bool>(line >> c.node);
        } else if (key == "attr") {
            Attr a;
            ok = static_cast<bool>(line >> a.name >> a.kind >> a.text);
            std::istringstream value(a.text);
            ok = ok && (a.kind == 's' || (a.kind == 'i' && (value >> a.i)) ||
                        (a.kind == 'f' && (value >> a.f)));
            c.attrs.push_back(a);
        } else if (key == "input") {
            Tensor t;
            ok = parse_tensor(line, t) && read_file(folder + "/" + t.file, t.bytes) &&
                 t.bytes.size() == t.size_bytes();
            c.inputs.push_back(std::move(t));
        } else if (key == "output") {
            ok = parse_tensor(line, c.output);
            have_output = ok;
        } else {
            ok = false;
        }
        if (!ok) {
            return folder + "/case.txt:" + std::to_string(lineno) + ": cannot use '" + text + "'";
        }
    }
    if (c.node.empty() || c.inputs.size() != 2 || !have_output) {
        return folder + "/case.txt: needs a node, two inputs and an output";
    }
    return {};
}

bool write_file(std::string const& path, void const* data, size_t bytes)
{
    std::ofstream out(path, std::ios::binary);
    out.write(static_cast<char const*>(data), static_cast<std::streamsize>(bytes));
    return static_cast<bool>(out);
}

nvinfer1::PluginTensorDesc desc_of(Tensor const& t)
{
    nvinfer1::PluginTensorDesc d{};
    d.dims = t.dims;
    d.type = t.type;
    d.format = nvinfer1::TensorFormat::kLINEAR;
    d.scale = 1.0f;
    return d;
}

}  // namespace harness
