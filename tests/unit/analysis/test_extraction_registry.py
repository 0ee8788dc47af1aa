"""The extraction analyses' registry (analysis/extraction.py), its per-model shape: what the extract stage's
fingerprint takes from it, what its finalize runs and removes, and the declarations it refuses."""

from __future__ import annotations

import pandas as pd
import pytest

from attnclust.analysis.extraction import (
    MODEL_ANALYSES,
    ModelContext,
    model_analyses,
    model_analysis,
    model_fingerprint,
    run_model_analyses,
)
from attnclust.config import load_job
from attnclust.layout import RunLayout
from attnclust.models.kinds import DECODER, ENCODER

from helpers import restored


def test_the_built_ins_are_a_decoders_induction_then_protocols_with_the_fingerprint_of_before():
    assert [a.name for a in model_analyses(DECODER)] == ["induction", "decoder_protocols"]
    assert model_analyses(ENCODER) == ()
    cfg = load_job(None)
    assert model_fingerprint(DECODER, cfg) == {"induction": 2, "decoder_protocols": 2}
    assert model_fingerprint(ENCODER, cfg) == {}
    grid = load_job(None, ["extract.needle_lengths=2"])  # a setting the protocols read, in once it is not the default
    assert model_fingerprint(DECODER, grid) == {"induction": 2, "decoder_protocols": 2, "extract.needle_lengths": 2}


def test_the_finalize_runs_what_applies_joins_its_record_and_removes_the_files_of_what_does_not(tmp_path):
    layout = RunLayout(tmp_path / "run")
    layout.claim()
    ran = []

    def writer(name: str, fields: dict):
        def run(ctx: ModelContext) -> dict:
            ran.append(name)
            ctx.layout.record(ctx.layout.table(name))
            ctx.layout.table(name).write_bytes(b"x")
            return {**fields, "seen": ctx.shared("one", lambda c: len(ran))}  # made once, by the first
        return run

    with restored(MODEL_ANALYSES):
        MODEL_ANALYSES.clear()
        for name, applies, fields in (("first", True, {"parts": ["a"], "first_seconds": 1.0}),
                                      ("never", False, {"parts": ["z"]}),
                                      ("second", True, {"parts": ["b", "c"]})):
            model_analysis(name, version=1, description=f"the {name}", applies=lambda kind, a=applies: a,
                           outputs=lambda layout, n=name: (layout.table(n),))(writer(name, fields))
        layout.record(layout.table("never"))  # written by an earlier run of another model
        layout.table("never").write_bytes(b"stale")
        ctx = ModelContext(layout, load_job(None), "cpu", "id", pd.DataFrame({"context": []}))
        record = run_model_analyses(ctx, ENCODER)
        assert ran == ["first", "second"]
        assert record == {"parts": ["a", "b", "c"], "first_seconds": 1.0, "seen": 1}
        assert layout.table("first").exists() and layout.table("second").exists()
        assert not layout.table("never").exists()
        assert model_fingerprint(ENCODER, load_job(None)) == {"first": 1, "second": 1}
    assert [a.name for a in model_analyses(DECODER)] == ["induction", "decoder_protocols"]


@pytest.mark.parametrize("kwargs, match", [
    ({"name": "Mine"}, "lower-case name"),
    ({"name": "moved_norm"}, "that no other extraction analysis has"),  # a per-block analysis' name
    ({"version": 0}, r"version=0; declare a positive integer"),
    ({"description": ""}, "declare a description"),
])
def test_a_declaration_it_cannot_take_is_refused(kwargs, match):
    args = {"name": "mine", "version": 1, "description": "mine", "applies": lambda kind: True,
            "outputs": lambda layout: (), **kwargs}
    with restored(MODEL_ANALYSES), pytest.raises(ValueError, match=match):
        model_analysis(args.pop("name"), **args)(lambda ctx: {})
