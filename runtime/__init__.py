"""trtpipe.runtime: the deploy side. Light dependencies only (numpy, onnxruntime or tensorrt,
tokenizers, jinja2): this package never imports torch, so it runs on a Jetson Orin as is."""
