"""Building cached vLLM environments, one backend per module (asv/pipx style).

* ``tools``     -- the uv binary and output tails, shared by every builder.
* ``index``     -- where packages come from (``IndexConfig``) and the as-of date dependencies resolve at.
* ``recipe``    -- ``EnvRecipe`` (an env's cache key), ``VllmEnv`` and ``default_recipe``.
* ``cache``     -- the env folders under the cache: status file, lock, listing, pruning.
* ``base``      -- the ``EnvBackend`` protocol and the one build step every backend shares
                   (folder, build log, smoke import, status file).
* ``uv``        -- backend: a release from an index, or a per-commit wheel (network, uv).
* ``wheelhouse`` -- backend: a wheelhouse folder onto an interpreter that holds torch (no network).
* ``installed`` -- an interpreter that already holds vLLM: nothing to build, only the smoke check.

``harness.envbuild.envs`` is the entry point (``ensure_env``) and picks the backend for a recipe.  Nothing here
imports ``harness.envbuild.envs``; the wheelhouse *download* side (``harness.bundle.wheelhouse``) imports only
``tools`` and ``index`` from here, and the wheelhouse *install* backend imports only its manifest
(``harness.envbuild.wheelhouse_manifest``), never the reverse.
"""
