"""Many runs: sweeps (`sweep`), throughput-latency curves (`curve`), what one
replica sustains (`capacity`), fleets behind a router (`fleet`) and `llmsim plan`
(`planspec`, `candidates`, `plan`); pool workers that end with the command (`lifetime`).
"""
