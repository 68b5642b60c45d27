"""A TransformerLens user's everyday code on a tiny model of every variant (issues 16 and 25).

Each snippet (tests/models/tl_snippets_*.py) is written as a TL user writes it and checked
against an independent computation: a float64 forward pass written from the raw state_dict
(tests/models/tl_reference.py), hand-written patches on that pass, autograd through it, or the
trainer's own loss path. Where TL's call cannot be right for a variant it must refuse with a
one-line TLUnsupported error. EXPECT_REFUSE lists the refusals; every other (snippet, variant)
pair must work. `python -m tests.models.test_tl_conformance` prints the table (works / refuses /
BREAKS / WRONG) that docs/TRANSFORMERLENS.md shows, and the counts.
"""

from __future__ import annotations

import traceback
from collections import Counter
from pathlib import Path

import pytest
import torch

from tests.models import (tl_common, tl_snippets_cache, tl_snippets_dla, tl_snippets_patching, tl_snippets_surface,
                            tl_snippets_weights)
from tests.models.tl_common import VARIANTS, TLUnsupported, ctx

MODULES = [tl_snippets_cache, tl_snippets_patching, tl_snippets_dla, tl_snippets_weights, tl_snippets_surface]
SNIPPETS = [s for m in MODULES for s in m.SNIPPETS]
MLP_APPLIES = set().union(*(m.MLP_APPLIES for m in MODULES))
EXPECT_REFUSE: dict[str, set[str]] = {k: v for m in MODULES for k, v in m.EXPECT_REFUSE.items()}
NOT_APPLICABLE: dict[str, set[str]] = {k: v for m in MODULES for k, v in m.NOT_APPLICABLE.items()}
SNIPPET_FILES = {Path(m.__file__).resolve() for m in [*MODULES, tl_common]} | {Path(__file__).resolve()}
DOC = Path(__file__).resolve().parents[2] / "docs" / "TRANSFORMERLENS.md"


def applies(name: str, variant: str) -> bool:
    if variant in NOT_APPLICABLE.get(name, ()):
        return False
    return variant != "mlp" or name in MLP_APPLIES


CASES = [(s, v) for s in SNIPPETS for v in VARIANTS if applies(s.__name__, v)]


def label(snippet) -> str:
    return snippet.__doc__.strip().splitlines()[0]


def test_snippet_names_are_unique():
    names = [s.__name__ for s in SNIPPETS]
    assert len(names) == len(set(names))
    assert set(EXPECT_REFUSE) | set(NOT_APPLICABLE) | MLP_APPLIES <= set(names)


@pytest.mark.parametrize("snippet,variant", CASES, ids=[f"{s.__name__}-{v}" for s, v in CASES])
def test_snippet(snippet, variant):
    c = ctx(variant)
    if variant in EXPECT_REFUSE.get(snippet.__name__, ()):
        with pytest.raises(TLUnsupported) as err:
            snippet(c)
        assert "\n" not in str(err.value) and len(str(err.value)) < 300, str(err.value)
    else:
        snippet(c)


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "mlp"])
def test_reference_rebuilds_every_stream_from_its_components(variant):
    """The reference's bookkeeping, checked on its own forward pass: at every reader, the carried
    embeddings, attention and MLP outputs and norm biases sum to the stream there."""
    ref = ctx(variant).ref
    adds = [("embed",)] + [(w, l) for l in range(ref.cfg.n_layers) for w in ("attn", "mlp")]
    value = {("embed",): ref.acts["hook_embed"] + ref.acts["hook_pos_embed"]}
    value.update({(w, l): ref.acts[f"blocks.{l}.hook_{w}_out"] for w, l in adds[1:]})
    targets = [(w, l) for l in range(ref.cfg.n_layers) for w in ("attn_in", "mlp_in")] + [("final",)]
    for target in targets:
        parts = [ref.carry(value[a], a, target) for a in adds if ref._order(a) < ref._order(target)]
        rebuilt = sum(parts) + ref.bias_to(target)
        assert torch.allclose(rebuilt, ref.stream_at(target), atol=1e-10), (
            target, float((rebuilt - ref.stream_at(target)).abs().max()))


def outcome(snippet, variant: str) -> str:
    """works / refuses (one-line TLUnsupported) / BREAKS (any other error) / WRONG (a wrong number,
    or a result where the call cannot be right and must refuse)."""
    try:
        snippet(ctx(variant))
        return "WRONG" if variant in EXPECT_REFUSE.get(snippet.__name__, ()) else "works"
    except TLUnsupported as e:
        return "refuses" if "\n" not in str(e) and len(str(e)) < 300 else "BREAKS"
    except AssertionError as e:  # WRONG when our check failed, BREAKS when TL's own assert did
        where = Path(traceback.extract_tb(e.__traceback__)[-1].filename).resolve()
        return "WRONG" if where in SNIPPET_FILES else "BREAKS"
    except Exception:  # noqa: BLE001 — the table records it
        return "BREAKS"


def expected(name: str, variant: str) -> str:
    if not applies(name, variant):
        return "n/a"
    return "refuses" if variant in EXPECT_REFUSE.get(name, ()) else "works"


def _table_rows(cell) -> list[str]:
    rows = ["| snippet | " + " | ".join(VARIANTS) + " |", "|---" * (len(VARIANTS) + 1) + "|"]
    for s in SNIPPETS:
        rows.append(f"| {label(s)} | " + " | ".join(cell(s, v) for v in VARIANTS) + " |")
    return rows


def test_docs_table_is_the_expected_table():
    """docs/TRANSFORMERLENS.md shows the table this file enforces (regenerate it with
    `python -m tests.models.test_tl_conformance`)."""
    lines = DOC.read_text().splitlines()
    want = _table_rows(lambda s, v: expected(s.__name__, v))
    assert want[0] in lines, "docs/TRANSFORMERLENS.md has no conformance table"
    start = lines.index(want[0])
    assert lines[start : start + len(want)] == want

if __name__ == "__main__":
    results = {(s.__name__, v): outcome(s, v) for s, v in CASES}
    for line in _table_rows(lambda s, v: results.get((s.__name__, v), "n/a")):
        print(line)
    counts = Counter(results.values())
    tally = ", ".join(f"{k} {counts[k]}" for k in ("works", "refuses", "WRONG", "BREAKS"))
    print(f"\n{len(SNIPPETS)} snippets, {len(results)} runs: {tally}")
