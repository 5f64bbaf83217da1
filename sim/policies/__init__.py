"""Decisions without a clock: batching policies that return a `StepPlan`
(`scheduler`, `chunked`), KV-cache managers (`kv`), prefix caching (`prefix`),
speculative decoding (`speculative`) and routers (`router`), each beside its spec; the
running batch they plan against (`batch`). Never imports the engine or config.
"""
