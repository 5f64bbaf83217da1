"""What one step costs: model architectures (`models`) and their forward pass as one list
of operations (`layer`), how a replica is laid out on GPUs (`parallel`), GPU profiles
with their measured tables and roofline fallbacks (`profiles`, `gpu_facts`, `l2flush`,
`mixed_decode`, `fused`), collectives (`comm`), serving-stack host costs and jitter
(`runtime`, `jitter`), and one iteration's seconds from its batch (`latency`, `decode_attn`; the
profile's lookups bound to the replica's configuration: `bound`; remembered on disk between runs
of one configuration: `stepcache`), each lookup tagged exact ... analytic. It takes a model, a GPU and a runtime, never a scenario.
"""
