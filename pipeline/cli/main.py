"""The ``trtpipe`` command line (click). Heavy imports happen inside each command, so
``trtpipe --help`` and ``trtpipe generate`` work without torch installed.

Exit codes (``trtpipe --help`` and the README list them): 0 built / passed; 1 a validate budget
or correctness check failed; 2 usage, recipe or artifact errors (click's own usage errors are 2
as well); 3 a GPU-target build wrote its build spec and must be finished on the target
(``trtpipe build --from-spec``); 130 interrupted (Ctrl-C).

This module holds the group, ``trtpipe recipes`` and the registration; the commands live beside it,
one file per concern: ``cli_build`` (build, export), ``cli_generate`` (generate, chat),
``cli_validate`` (validate, estimate), ``cli_info`` (info), ``cli_serve`` (serve), ``farm/cli``
(farm, pull). Helpers: ``cli_common`` (exit codes, the error line), ``cli_artifact`` (artifacts root
and recipe -> artifact), ``cli_prompt`` (prompt input and sampling flags), ``cli_chat`` (the chat loop).
"""

from __future__ import annotations

import click

from trtpipe.pipeline.cli.build import build_cmd, export_cmd
from trtpipe.pipeline.cli.common import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_NEEDS_TARGET, EXIT_OK, EXIT_USAGE
from trtpipe.pipeline.cli.farm import farm_group, pull_cmd  # click only; ray/fsspec lazily
from trtpipe.pipeline.cli.generate import chat_cmd, generate_cmd
from trtpipe.pipeline.cli.info import info_cmd
from trtpipe.pipeline.cli.serve import serve_cmd
from trtpipe.pipeline.cli.validate import estimate_cmd, validate_cmd
from trtpipe.plugins.core.errors import TrtpipeError
from trtpipe.plugins.core.versions import TRTPIPE_VERSION


class _Group(click.Group):
    """The ``trtpipe`` group: Ctrl-C in any command exits 130 with one line (click's own
    "Aborted!" exits 1, the code of a failed budget)."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (KeyboardInterrupt, click.exceptions.Abort):
            click.echo("interrupted (Ctrl-C)", err=True)
            ctx.exit(EXIT_INTERRUPTED)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(TRTPIPE_VERSION, prog_name="trtpipe")
def main() -> None:
    """trtpipe: ship a decoder-only LLM with measured, enforced latency.

    \b
    A recipe (YAML) names the model, the target (cpu | orin | a100 | h200), the precision of
    each phase, the paged KV cache, the limits and the latency budgets. Typical use:
      trtpipe build smollm2-135m-cpu          # export + lower + write artifacts/<recipe>/<target>
      trtpipe generate smollm2-135m-cpu "What is the capital of France?" --chat --stream
      trtpipe validate smollm2-135m-cpu       # TTFT/TPOT/ITL vs budgets; exit 1 if any fails
      trtpipe estimate recipes/llama2-7b-orin.yaml   # memory and latency before a build

    RECIPE is a path to a YAML file or the name of a shipped recipe (see `trtpipe recipes`).
    Artifacts live under --artifacts, else $TRTPIPE_ARTIFACTS, else ./artifacts.

    \b
    Exit codes:
      0  built / passed
      1  a budget or correctness check failed (validate)
      2  usage, recipe or artifact error
      3  GPU target: build spec written, finish on the target (trtpipe build --from-spec)
      130  interrupted (Ctrl-C)
    """


@main.command("recipes")
def recipes_cmd() -> None:
    """List the shipped recipes: name (pass it as RECIPE), target and description."""
    from rich.console import Console
    from rich.table import Table

    from trtpipe.pipeline.recipe import RECIPES_DIR, load_recipe, shipped_recipe_names

    table = Table(title=f"shipped recipes ({RECIPES_DIR})", title_justify="left")
    for col in ("name", "target", "description"):
        table.add_column(col, overflow="fold")
    for n in shipped_recipe_names():
        try:
            r = load_recipe(RECIPES_DIR / f"{n}.yaml", check_files=False)
            table.add_row(n, r.target, r.description or "")
        except TrtpipeError as e:
            table.add_row(n, "?", f"(does not load: {str(e).splitlines()[0]})")
    Console(highlight=False, soft_wrap=False).print(table)


for _cmd in (
    build_cmd,
    export_cmd,
    generate_cmd,
    chat_cmd,
    validate_cmd,
    estimate_cmd,
    info_cmd,
    serve_cmd,
    farm_group,
    pull_cmd,
):
    main.add_command(_cmd)

__all__ = ["EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_NEEDS_TARGET", "EXIT_OK", "EXIT_USAGE", "main"]


if __name__ == "__main__":
    main()
