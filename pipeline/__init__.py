"""trtpipe.pipeline: the build side (recipe, model loading, torch reference, export, lowering,
build, CLI). Heavy dependencies (torch, onnx, polygraphy, tensorrt) are imported lazily."""
