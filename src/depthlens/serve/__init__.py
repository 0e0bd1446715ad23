"""``depthlens serve``: an OpenAI-compatible server whose answers carry their depth (docs/serve.md).

A thin layer like ``cli/``: it takes HTTP requests (FastAPI on uvicorn), turns each into the same configs the
CLI builds, and runs them on the rooms below — ``sampling`` (the engine: one vLLM engine stepped for every request,
or the transformers sampler one request at a time), ``studies`` (live Think@n, the online policy's batches),
``voting`` (the selection, the online policy), ``evals`` (the answer rules) and ``metrics`` (DTR, settling depth, the
baselines). Nothing below imports it; only ``cli.serve_cmd`` does. Importing this package imports no FastAPI: the
modules that need it (``app``, ``errors``) import it themselves, so the CLI can name the missing extra.
"""
