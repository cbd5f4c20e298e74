"""The lowerings of whole graphs: each walks the ``trtpipe`` nodes and dispatches every node to its op's lowering (ONNX Runtime; TensorRT with plugins; TensorRT plugin-free)."""
