"""The recipe: one YAML file per deployment, validated once at the edge.

A recipe states the model, the target, the precision of each phase (prefill and decode), the
paged KV cache, the scheduler limits, the TensorRT optimization profiles, the engine layout, and
the validate workload with its latency budgets. Everything downstream (export, lowering, build,
runtime limits, validate) reads the frozen :class:`Recipe`, never the YAML.

Errors: every problem is reported at once, each as one line::

    recipe x.yaml: kv_cache.block_size = 24: expected a power of two (...). Fix: use 16 or 32

Checks that need the model's facts (context length, hidden size) run in
:func:`check_recipe_against_model` once the loader has read the model; planning recipes that state
``model.architecture`` inline get them at load time.

The package, one job per module (imports go down this list, never up):

    errors.py           RecipeProblem / RecipeError, the Issue records validators raise
    model_source.py     model.source -> a .gguf file, a Hugging Face folder or none
    base.py             the strict base model, literal value sets, shared value checks
    schema_build.py     model, precision, kv_cache, profiles, engine sections
    schema_runtime.py   the runtime section (scheduler, prefix caching, speculative decoding)
    schema_validate.py  validate section: scenarios, budgets (as runtime Budget records), correctness
    kv_plan.py          KV pool bytes per block and number of blocks
    checks.py           checks across sections, one function per concern
    schema.py           the Recipe model (sections + derived settings)
    pydantic_errors.py  pydantic ValidationError -> RecipeProblem lines with fixes
    loading.py          YAML file / shipped name -> Recipe
    hashing.py          recipe_hash, build_hash, build_fields, changed_fields, sha256_canonical
    workload.py         a validate scenario -> the runtime's WorkloadSpec

Units are in the names: ``*_ms`` milliseconds, ``*_mib`` MiB (2**20 bytes), ``*_per_s`` per second,
``*_tokens`` / ``max_seq_len`` / ``max_num_tokens`` tokens.
"""

from trtpipe.pipeline.recipe.base import KVDtype, Phase, Precision, Target
from trtpipe.pipeline.recipe.checks import check_recipe_against_model
from trtpipe.pipeline.recipe.errors import MISSING, NO_VALUE, RecipeError, RecipeProblem
from trtpipe.pipeline.recipe.hashing import build_fields, build_hash, changed_fields, recipe_hash, sha256_canonical
from trtpipe.pipeline.recipe.kv_plan import kv_block_bytes, plan_kv_num_blocks
from trtpipe.pipeline.recipe.loading import (
    DEFAULT_RECIPE_NAME,
    RECIPES_DIR,
    load_recipe,
    parse_recipe,
    resolve_recipe_path,
    shipped_recipe_names,
)
from trtpipe.pipeline.recipe.schema import Recipe
from trtpipe.pipeline.recipe.schema_validate import CorrectnessSpec, Scenario
from trtpipe.pipeline.recipe.workload import scenario_workload_spec

__all__ = [
    "CorrectnessSpec",
    "DEFAULT_RECIPE_NAME",
    "KVDtype",
    "MISSING",
    "NO_VALUE",
    "Phase",
    "Precision",
    "RECIPES_DIR",
    "Recipe",
    "RecipeError",
    "RecipeProblem",
    "Scenario",
    "Target",
    "build_fields",
    "build_hash",
    "changed_fields",
    "check_recipe_against_model",
    "kv_block_bytes",
    "load_recipe",
    "parse_recipe",
    "plan_kv_num_blocks",
    "recipe_hash",
    "resolve_recipe_path",
    "scenario_workload_spec",
    "sha256_canonical",
    "shipped_recipe_names",
]
