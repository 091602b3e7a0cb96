"""Load-time ONNX graph rewrites to the iRPE libraries' ops, shared by the runtimes that run
them: ``rewrites`` (the stages and their driver), ``rewrite_attention`` (a whole attention block
to one ``RPEAttention``) and ``rewrite_qlayout`` (the Q table's layout). ONNX Runtime applies
them for its custom-op library, OpenVINO for its extension library; both read the result in
memory, the file is never changed."""
