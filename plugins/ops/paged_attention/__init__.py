"""``trtpipe::PagedAttention``: its description, ONNX shape inference, NumPy reference, torch op, exporter translation, standard-op lowering, Triton kernels and launchers, TensorRT plugins."""
