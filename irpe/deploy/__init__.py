"""Deployment-side contracts shared by export/ (writer) and serve/ (reader).

One module per artifact contract: tensor names and metadata (contract), runtime wrappers
(TensorRT, ONNX Runtime session options). serve/ imports these, never export/.
"""
