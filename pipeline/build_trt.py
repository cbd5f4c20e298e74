"""Former home of the GPU build, now the subpackage :mod:`trtpipe.pipeline.build` (one file per
stage: ``gpu.py``, ``spec.py``, ``profiles.py``, ``compile_trt.py``, ``rtx_smoke.py``, ...).

Kept only so that imports written against it (``pipeline/cli.py``) keep working; new code
imports from :mod:`trtpipe.pipeline.build`. The RTX smoke command line moved to
``python -m trtpipe.pipeline.build.rtx_smoke`` (docs/tensorrt.md).
"""

from trtpipe.pipeline.build.compile_trt import build_from_spec, choose_lowering  # noqa: F401
from trtpipe.pipeline.build.errors import BuildError, BuildNeedsTarget  # noqa: F401
from trtpipe.pipeline.build.gpu import build_gpu_target, write_build_spec  # noqa: F401
from trtpipe.pipeline.build.spec import SPEC_NAME, SPEC_VERSION, BuildSpec  # noqa: F401
