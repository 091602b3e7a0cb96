"""OpenVINO (CPU plugin): ``session`` (options, reading an exported .onnx or an IR, compiling),
``lowering`` (the one seam that makes the iRPE nodes readable: ``lower_irpe``) and ``frontend``
(the iRPE ops as ONNX-frontend conversions, used by ``irpe quantize --target openvino``).

``openvino`` is the optional extra ``pip install 'irpe-deploy[openvino]'``; it is imported
inside the functions that need it, so this package imports without it.
"""
