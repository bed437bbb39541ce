"""The schemes the atlas trains: every configs/placement/*.yaml with LayerNorm (a copy of another's
network once: :func:`same_networks`), and each other norm in NORM_PLACEMENTS' placements; and the
whole grid of them as Hydra multiruns (``lnexp atlas --full``)."""

from __future__ import annotations

from lnexp.atlas.grid import Grid, experiment_name
from lnexp.atlas.outcomes import Scheme

# Each norm but LayerNorm (lnexp.names.NORMS) is a scheme in these placements, compared with LayerNorm
# in the same placement: Pre-LN, and Post-LN too for DyT (its parity claim covers both)
NORM_PLACEMENTS = {"dyt": ("pre_ln", "post_ln")}
NORM_PLACEMENTS_DEFAULT = ("pre_ln",)


def same_networks() -> dict[str, str]:
    """{placement: the earlier one it equals}: placements whose structure (lnexp.scheme.Placement, what
    the model is built from) differs only in its name train the same network to the same numbers
    (Sandwich-LN is Peri-LN's structure; the measured atlas gave both the same losses to 4 decimals),
    so the atlas runs the first only. Their recipes do not matter here: every atlas experiment sets
    the schedule and the warm-up."""
    from dataclasses import replace

    from lnexp.names import PLACEMENTS
    from lnexp.scheme import Placement, group_file

    first: dict[str, str] = {}
    out = {}
    for p in PLACEMENTS:
        key = replace(Placement.from_config(group_file("placement", p)), name="").to_json()
        out.update({p: first[key]} if key in first else {})
        first.setdefault(key, p)
    return out


def atlas_placements() -> list[str]:
    """The placements the atlas trains: every configs/placement/*.yaml but a copy of an earlier one."""
    from lnexp.names import PLACEMENTS

    copies = same_networks()
    return [p for p in PLACEMENTS if p not in copies]


def norm_placements() -> dict[str, tuple[str, ...]]:
    """{norm: the placements it is a scheme in}, for every norm but LayerNorm."""
    from lnexp.names import NORMS

    return {n: NORM_PLACEMENTS.get(n, NORM_PLACEMENTS_DEFAULT) for n in NORMS if n != "layernorm"}


def schemes() -> list[Scheme]:
    placements = atlas_placements()
    return [Scheme(p) for p in placements] + [Scheme(p, n) for n, ps in norm_placements().items()
                                              for p in ps if p in placements]


def full_grid_commands(scale: str, grid: Grid) -> list[str]:
    """The whole grid as Hydra multiruns (``lnexp train -m``), for GPUs: no adaptivity, no budget;
    as few commands as products of placements and norms allow."""
    placements = atlas_placements()
    common = (
        f"experiment={experiment_name(scale)} lr={','.join(f'{x:g}' for x in grid.lrs)} "
        f"warmup={','.join(map(str, grid.warmups))} depth={','.join(map(str, grid.depths))} "
        f"seed={','.join(map(str, grid.seeds))}"
    )
    # each other norm's placements, grouped so that one command sweeps every norm a placement shares
    by_placement: dict[str, list[str]] = {}
    for n, ps in norm_placements().items():
        for p in ps:
            if p in placements:
                by_placement.setdefault(p, []).append(n)
    same_norms: dict[tuple[str, ...], list[str]] = {}
    for p, ns in by_placement.items():
        same_norms.setdefault(tuple(ns), []).append(p)
    return [
        f"lnexp train -m {common} placement={','.join(placements)} norm=layernorm",
        *(f"lnexp train -m {common} placement={','.join(ps)} norm={','.join(ns)}"
          for ns, ps in same_norms.items()),
    ]
