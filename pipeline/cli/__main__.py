"""``python -m trtpipe.pipeline.cli``: the ``trtpipe`` command."""

from trtpipe.pipeline.cli.main import main

main()
