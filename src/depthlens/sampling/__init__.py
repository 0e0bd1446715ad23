"""Generation engines behind one interface: ``backend`` (the protocol and ``Trace``), ``hf`` (transformers),
``vllm/`` (the vLLM engine, an optional extra), ``choose`` (which one a run gets)."""
