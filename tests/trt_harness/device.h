// The harness's CUDA side: device buffers, enqueue, copy back (device.cpp).
#ifndef IRPE_TRT_HARNESS_DEVICE_H
#define IRPE_TRT_HARNESS_DEVICE_H

#include <NvInferRuntime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "case_io.h"

namespace harness {

// CUDA devices visible, 0 when CUDA reports none or no driver.
int device_count();

// Enqueue each plugin (already shape-configured) on fresh device buffers holding the case's
// inputs, on one stream, each output first filled with 0xFF bytes; `outs` gets each output's bytes.
// Empty string on success, else what failed.
std::string enqueue_on_device(Case const& c, std::vector<nvinfer1::IPluginV3*> const& plugins,
                              size_t workspace, std::vector<std::vector<uint8_t>>& outs);

// Without a device: enqueue with placeholder pointers (never dereferenced on the host); the
// plugin's status code.
int enqueue_without_device(Case const& c, nvinfer1::IPluginV3* plugin);

}  // namespace harness

#endif  // IRPE_TRT_HARNESS_DEVICE_H
