"""OpenVINO (CPU plugin): ``session`` (options, reading an exported .onnx or an IR, compiling)
and ``frontend`` (the iRPE ops as ONNX-frontend conversions: the one place that makes the
exported files readable by OpenVINO, used by every reader and ``irpe quantize --target
openvino``).

``openvino`` is the optional extra ``pip install 'irpe-deploy[openvino]'``; it is imported
inside the functions that need it, so this package imports without it.
"""
