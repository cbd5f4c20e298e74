"""The TensorRT half of a build: lowering per variant, optimization profiles, the build spec, the plugin-free variant's gate, the RTX smoke build, and the compile step on the target GPU."""
