"""``lnexp train --help``: every config group with its options and what each is, and every key of
configs/train.yaml with its comment and the values it allows.

Written from the config files themselves (Hydra's own help drops YAML comments, which is where the
keys are explained), so the help cannot drift from the configs. Imports no torch, fairseq or Hydra.
"""

from __future__ import annotations

from pathlib import Path

from lnexp.config import CONFIG_DIR, GROUPS
from lnexp.names import NORMS, PRECISIONS, option_files
from lnexp.run_names import default_choices

USAGE = """\
usage: lnexp train [GROUP=OPTION ...] [KEY=VALUE ...]     one run, in runs/<what differs from the default>/
       lnexp train -m [GROUP=A,B ...] [KEY=V1,V2 ...]    a sweep: one run per combination
       lnexp train --cfg job [overrides]                 print the resolved config, run nothing

Examples: lnexp train placement=pre_ln warmup=0
          lnexp train -m placement=post_ln,pre_ln seed=1,2
          lnexp train depth=24 placement=pre_ln lr=5e-4 max_epoch=4"""
# What the config files cannot say: values lnexp accepts beyond the files (lnexp/config.py)
GROUP_NOTES = {
    "depth": "any depth=N (N >= 1) works, not only these files: N layers in both stacks; "
             "depth.encoder_layers=... depth.decoder_layers=... for unequal stacks",
    "experiment": "none by default; each is a paper figure's sweep, run with -m "
                  "(docs/reproduction.md)",
}
ALLOWED = {"norm": NORMS, "precision": PRECISIONS, "device": ("auto", "cpu", "cuda")}
DESCRIPTION_MAX = 96


def description(path: Path) -> str:
    """What an option file is: the first line of its leading comment (two when the sentence goes
    on), else the comment on its ``name:`` line."""
    lines = path.read_text(encoding="utf-8").splitlines()
    comment = []
    for line in lines:
        text = line.strip()
        if not text.startswith("#"):
            break
        text = text.lstrip("#").strip()
        if text.startswith("@package"):
            continue
        if not text:
            break
        comment.append(text)
    text = comment[0].split("  ")[0] if comment else ""
    if len(comment) > 1 and text == comment[0] and not text.endswith((".", ":", ")")):
        text += " " + comment[1]  # a sentence that goes on
    if not text:
        text = next((ln.split("#", 1)[1].strip() for ln in lines
                     if ln.startswith("name:") and "#" in ln), "")
    return text if len(text) <= DESCRIPTION_MAX else text[:DESCRIPTION_MAX - 1] + "…"


def _options(group: str) -> list[Path]:
    """A group's option files, numbers in numeric order (depth 6, 8, 10, ...)."""
    return sorted(option_files(group),
                  key=lambda p: (not p.stem.isdigit(), int(p.stem) if p.stem.isdigit() else 0, p.stem))


def groups_text() -> list[str]:
    defaults = default_choices()
    out = ["Config groups (GROUP=OPTION; * marks the default; configs/GROUP/OPTION.yaml):"]
    for group in GROUPS:
        files = _options(group)
        names = [p.stem + ("*" if p.stem == defaults.get(group) else "") for p in files]
        about = [description(p) for p in files]
        note = f" ({GROUP_NOTES[group]})" if group in GROUP_NOTES else ""
        if not any(about):  # options that need no words: one line
            out.append(f"  {group:<11}{' '.join(names)}{note}")
            continue
        out.append(f"  {group}{note}")
        width = max(len(n) for n in names) + 2
        out += [f"    {n:<{width}}{a}".rstrip() for n, a in zip(names, about, strict=True)]
    return out


def keys_text() -> list[str]:
    """configs/train.yaml as written (comments kept), without its defaults list and Hydra block."""
    out = ["Keys (KEY=VALUE; configs/train.yaml as written, ${...} = taken from another key):"]
    skipping = False
    for line in (CONFIG_DIR / "train.yaml").read_text(encoding="utf-8").splitlines():
        top = line[:1] not in (" ", "#", "")
        if top:
            skipping = line.startswith(("defaults:", "hydra:"))
        if skipping or (not out[1:] and line.startswith("#")) or (not line.strip() and not out[1:]):
            continue
        out.append(f"  {line}".rstrip())
    while out[-1] == "":
        out.pop()
    allowed = [f"{k}: {' | '.join(v)}" for k, v in ALLOWED.items()]
    return [*out, "", "Allowed values: " + "; ".join(allowed) + " (fp16 trains on a GPU; bf16 on a CPU is "
            "autocast, precision=auto takes it where the CPU has bf16 units; device=auto takes the "
            "GPU if torch sees one)."]


def train_help() -> str:
    return "\n".join([USAGE, "", *groups_text(), "", *keys_text(), "",
                      "More: docs/configuration.md (every group and key), lnexp train --hydra-help "
                      "(Hydra's own flags)."])
