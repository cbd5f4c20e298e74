"""The engines that run a step: ONNX Runtime (CPU), TensorRT (GPU), the CUDA runtime through ctypes."""
