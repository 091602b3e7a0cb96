"""OpenVINO (CPU plugin) for the exported iRPE files and OpenVINO IRs. Its modules:

- ``core``: importing openvino (one line naming the extra when missing), the ``Core`` with the
  iRPE ops, the CPU's capabilities;
- ``frontend``: the iRPE ops as ONNX-frontend conversions to OpenVINO's own ops (how every
  reader, ``irpe quantize --target openvino`` included, reads an exported file without the
  library);
- ``library``: the iRPE OpenVINO extension library (``make ov-ops``): finding and loading it,
  and the attention fusion it runs;
- ``session``: options, reading an exported .onnx or an IR, compiling;
- ``file``: an exported .onnx or an IR compiled once, as irpe.runtime.base's ``RuntimeFile``
  (serve's openvino backend, ``irpe validate`` and ``irpe eval``).

``openvino`` is the optional extra ``pip install 'irpe-deploy[openvino]'``; it is imported
inside the functions that need it, so this package imports without it.
"""
