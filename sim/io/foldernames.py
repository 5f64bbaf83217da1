"""Folder names llmsim makes from scenario names and swept values (`runs/<name>`, one
subfolder per run): one safe path component each, distinct within a folder.

    safe_folder_name(text)              -> one path component made from a name or a value
    unique_names(names)                 -> base, base-2, ... (one folder per run)
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable

NAME_MAX = 100  # characters in a folder name made from a scenario name or a value


def safe_folder_name(text: object, default: str = "scenario") -> str:
    """One path component made from `text`: letters, digits, '.', '-', '_' and '+' kept,
    anything else (separators, '=', spaces, control characters) becomes '_'; no leading
    dot or dash, no '..', at most NAME_MAX characters; `default` when nothing is left.

    >>> safe_folder_name("/abs/path"), safe_folder_name("../../x"), safe_folder_name("")
    ('abs_path', 'x', 'scenario')
    """
    s = unicodedata.normalize("NFC", str(text))
    s = "".join(c if (c.isalnum() or c in ".-_+") and c.isprintable() else "_" for c in s)
    s = "_".join(part for part in s.split("_") if part.strip("."))  # no '..' pieces
    while ".." in s:
        s = s.replace("..", ".")
    s = s.strip("._-+ ")[:NAME_MAX].rstrip("._-+ ")
    return s or default


def unique_names(names: Iterable[str]) -> list[str]:
    """Safe folder names for `names`, made distinct (ignoring case, for case-insensitive
    file systems) by suffixes: base, base-2, base-3, ..."""
    out: list[str] = []
    taken: set[str] = set()
    for name in names:
        base = safe_folder_name(name)
        cand, i = base, 1
        while cand.casefold() in taken:
            i += 1
            cand = f"{base}-{i}"
        taken.add(cand.casefold())
        out.append(cand)
    return out
