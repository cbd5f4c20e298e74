"""ONNX graph helpers the lowerings share: the custom-node rewrite walk and the float cast pass."""
