"""What every ``trtpipe`` command shares: exit codes, the error line, the recipe argument, the
``--threads`` help. Commands live in ``cli_<concern>.py`` beside this module; :mod:`trtpipe.pipeline.cli`
holds the group and registers them."""

from __future__ import annotations

import sys
from typing import NoReturn

import click

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NEEDS_TARGET = 0, 1, 2, 3
THREADS_HELP = "ONNX Runtime intra-op threads (default: the recipe's engine.intra_op_num_threads, else ONNX Runtime's)."


def fail(e: Exception, code: int = EXIT_USAGE) -> NoReturn:
    """Print ``error: <e>`` (red) on stderr and exit with ``code`` (2: usage, recipe or artifact error)."""
    click.echo(click.style("error: ", fg="red", bold=True) + str(e), err=True)
    sys.exit(code)


def load_recipe_arg(recipe: str):
    """The RECIPE argument (a path or a shipped recipe name) as a validated :class:`Recipe`."""
    from trtpipe.pipeline.recipe import load_recipe, resolve_recipe_path

    return load_recipe(resolve_recipe_path(recipe))
