"""`llmsim models import config.json [--name NAME] [--out models/NAME.yaml] [--force]`:
a Hugging Face config as a model file (sim/costmodel/hf_config.py)."""

from __future__ import annotations

import re
from pathlib import Path

from sim.io.specload import SpecError

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def add_parser(models_sub) -> None:
    imp = models_sub.add_parser("import", help="turn a Hugging Face config.json into a model file")
    imp.add_argument("config", help="the model's config.json")
    imp.add_argument("--name", help="model name (default: the --out file's name, else the "
                                    "config's _name_or_path or folder, lower-cased)")
    imp.add_argument("--out", help="model file to write (default: models/NAME.yaml)")
    imp.add_argument("--source", help="where the numbers come from (default: the config's "
                                      "_name_or_path, else its path)")
    imp.add_argument("--force", action="store_true",
                     help="replace an existing file that `llmsim models import` wrote")
    imp.set_defaults(fn=cmd_models_import)


def _default_name(cfg: dict, config: Path) -> str:
    ref = cfg.get("_name_or_path")
    base = str(ref).rstrip("/").rsplit("/", 1)[-1] if isinstance(ref, str) and ref else ""
    return (base or (config.parent.name if config.name == "config.json" else config.stem)).lower()


def cmd_models_import(a) -> int:
    from sim.costmodel.hf_config import IMPORT_MARK, model_fields, model_yaml, read_config
    from sim.costmodel.models import MODELS_DIR
    from sim.io.outfile import check_out_file, write_file_atomically
    from sim.io.outputs import OutputError

    config = Path(a.config)
    cfg = read_config(config)
    if a.out and a.name and Path(a.out).stem != a.name:
        raise SpecError("--name", a.name, f"differs from the --out file's name "
                        f"{Path(a.out).stem!r} (a model file is named after its model)")
    name = a.name or (Path(a.out).stem if a.out else _default_name(cfg, config))
    if not _NAME.fullmatch(name) or name.endswith(".yaml"):
        raise SpecError("--name", name, "is not a model name (allowed: letters, digits, '.', "
                        "'_' and '-', starting with a letter or digit)")
    out = Path(a.out) if a.out else MODELS_DIR / f"{name}.yaml"
    if out.suffix != ".yaml":
        raise SpecError("--out", str(out), "is not a .yaml file (allowed: NAME.yaml)")
    fields, notes = model_fields(cfg, name, file=config, source=a.source)  # refuses before writing
    if out.exists() and not a.force:
        raise OutputError("--out", out, "exists (allowed: a new file, or --force to replace a "
                          "file `llmsim models import` wrote)")

    def ours(p: Path) -> bool:
        try:
            return p.read_text(errors="replace").startswith(IMPORT_MARK)
        except OSError:
            return False
    target = check_out_file(out, flag="--out", ours=ours)
    write_file_atomically(target, model_yaml(fields, notes, config))
    print(f"wrote {out} ({name}: {notes[0]})")
    return 0
