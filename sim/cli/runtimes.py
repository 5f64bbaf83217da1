"""`llmsim runtimes [NAME]`: the runtime profiles (gpu_profiles/runtimes/), by stack and
version, with their host terms, the stack defaults they bring and where each comes from."""

from __future__ import annotations

import textwrap


def add_parser(sub) -> None:
    p = sub.add_parser("runtimes", help="list runtime profiles (serving stacks by version) "
                                        "and their sources")
    p.add_argument("name", nargs="?", help="one runtime: every term, default and source")
    p.set_defaults(fn=cmd_runtimes)


def _settings(values: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in values.items()) or "-"


def cmd_runtimes(a) -> int:
    from sim.costmodel.runtime import RUNTIMES_DIR, load_runtime
    from sim.io.specload import known_names

    if a.name:
        return _one(load_runtime(a.name, file="llmsim runtimes", path="NAME"))
    print(f"{'runtime':22} {'stack':14} {'host ms':>7} {'serial ms':>9} {'/seq us':>7} "
          f"{'/TP rank ms':>11}  defaults")
    for name in known_names(RUNTIMES_DIR):
        rt = load_runtime(name)
        stack = f"{rt.stack.name} {rt.stack.version}" if rt.stack else "-"
        per_seq = (rt.host_ms_per_decode_seq + rt.serial_ms_per_seq) * 1e3
        rank = (f"{rt.serial_ms_per_rank:.2f}+{rt.serial_ms_per_rank_seq * 1e3:.0f}us/seq"
                if rt.serial_ms_per_rank or rt.serial_ms_per_rank_seq else "-")
        defaults = _settings(rt.stack.defaults.values()) if rt.stack else "-"
        print(f"{name:22} {stack:14} {rt.host_ms_per_step:7.2f} {rt.serial_ms_per_step:9.2f} "
              f"{per_seq:7.1f} {rank:>11}  {defaults}")
    print("\n`llmsim runtimes NAME` prints a runtime's every term, its stack defaults by GPU and "
          "tensor degree, and the sources. A scenario's own scheduler / kv / dtype fields "
          "override a stack's defaults.")
    return 0


def _one(rt) -> int:
    wrap = textwrap.TextWrapper(width=100, initial_indent="  ", subsequent_indent="  ")
    print(f"{rt.name}: {rt.description}")
    terms = [f.name for f in rt.__dataclass_fields__.values()
             if f.name.startswith(("host_", "serial_", "gpu_scale"))]
    print("  " + ", ".join(f"{t} {getattr(rt, t):g}" for t in terms))
    print(f"  combine {rt.combine}, custom_all_reduce {rt.custom_all_reduce}, elementwise "
          f"{rt.elementwise}, driver_is_rank0 {rt.driver_is_rank0}")
    print("source:")
    print(wrap.fill(" ".join(rt.source.split())))
    if rt.request is not None:
        for name in ("receive_ms", "tokenize_us_per_prompt_token", "chunk_ms", "finish_ms"):
            s = getattr(rt.request, name)
            print(f"request.{name} {s.value:g}:")
            print(wrap.fill(" ".join(s.source.split()) or "-"))
    if rt.stack is not None:
        st = rt.stack
        blocks = {"defaults": st.defaults, **{f"on {g}": v for g, v in st.by_gpu.items()},
                  **{f"at tensor >= {t}": v for t, v in st.by_tensor.items()}}
        print(f"stack {st.name} {st.version}:")
        for where, block in blocks.items():
            print(f"  {where}: {_settings(block.values())}")
            print(textwrap.fill(" ".join(block.source.split()), width=100,
                                initial_indent="    ", subsequent_indent="    "))
    return 0
