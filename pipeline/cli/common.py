"""What every ``trtpipe`` command shares: exit codes, the error line, the recipe argument, the
``--artifacts`` option, the ``--threads`` help. Commands live in one module per concern beside this
one; :mod:`trtpipe.pipeline.cli.main` holds the group and registers them."""

from __future__ import annotations

import sys
from typing import NoReturn

import click

from trtpipe.pipeline.artifact.locate import ARTIFACTS_ENV, DEFAULT_ARTIFACTS_ROOT

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NEEDS_TARGET = 0, 1, 2, 3
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT), as shells report it; not 1, which means a failed budget
ENGINE_HELP = (
    "cpu artifacts: the engine that runs them. auto (default): the native CPU kernels where the "
    "artifact has them (engine.cpu_backend), else ONNX Runtime; native or ort forces one."
)
THREADS_HELP = "CPU threads of the engine (default: the recipe's engine.intra_op_num_threads, else the CPUs this process may use for the native engine, ONNX Runtime's default for ort). On a CPU busy with other jobs, 1 (or OMP_WAIT_POLICY=PASSIVE) is often faster."


def fail(e: Exception, code: int = EXIT_USAGE) -> NoReturn:
    """Print ``error: <e>`` (red) on stderr and exit with ``code`` (2: usage, recipe or artifact error)."""
    click.echo(click.style("error: ", fg="red", bold=True) + str(e), err=True)
    sys.exit(code)


def load_recipe_arg(recipe: str):
    """The RECIPE argument (a path or a shipped recipe name) as a validated :class:`Recipe`."""
    from trtpipe.pipeline.recipe import load_recipe, resolve_recipe_path

    return load_recipe(resolve_recipe_path(recipe))


def artifacts_option(f):
    """The shared ``--artifacts DIR`` option (environment variable ``TRTPIPE_ARTIFACTS``)."""
    return click.option(
        "--artifacts",
        "artifact_root",
        default=DEFAULT_ARTIFACTS_ROOT,
        show_default=True,
        envvar=ARTIFACTS_ENV,
        show_envvar=True,
        help="Root folder of artifacts (<root>/<recipe>/<target>); relative to the current folder.",
    )(f)
