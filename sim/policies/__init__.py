"""Decisions without a clock: batching policies (`scheduler`, `chunked`) that return a
`StepPlan` (`plan`) of one step kind (`stepkind`), KV-cache managers (`kv`), prefix
caching (`prefix`), speculative decoding (`speculative`) and routers (`router`), each
beside its spec; the running batch they plan against (`batch`) and the small protocols
the engine holds these parts by (`protocols`). Never imports the engine or config.
"""
