"""Synthetic Llama GGUF files: real shapes (default Llama-2-7B), random weights in the formats
real files use, a real tokenizer, written streaming. Test models nobody has to download
(issue 44); ``bench/synthetic_gguf.py`` writes one into the model cache.

    shape.py    SyntheticShape (the facts and tensor types) -> TensorSpec per tensor
    tensors.py  TensorSpec + seed -> the tensor's bytes, a row chunk at a time
    vocab.py    SmolLM2's tokenizer cut to the model's vocabulary
    write.py    the streaming GGUF writer
"""

from trtpipe.pipeline.model.synthetic.shape import LLAMA2_7B, SyntheticShape, SyntheticShapeError, TensorSpec
from trtpipe.pipeline.model.synthetic.tensors import float_chunks, tensor_data
from trtpipe.pipeline.model.synthetic.vocab import Vocabulary, smollm2_vocabulary
from trtpipe.pipeline.model.synthetic.write import SyntheticFile, default_file_name, write_synthetic_gguf

__all__ = [
    "LLAMA2_7B",
    "SyntheticFile",
    "SyntheticShape",
    "SyntheticShapeError",
    "TensorSpec",
    "Vocabulary",
    "default_file_name",
    "float_chunks",
    "smollm2_vocabulary",
    "tensor_data",
    "write_synthetic_gguf",
]
