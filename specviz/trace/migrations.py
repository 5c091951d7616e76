"""Trace files of earlier versions, lifted one version at a time to today's (schema.py)."""
from __future__ import annotations

from specviz.trace.evidence import EngineForensics, RunForensics

# 3: whole-character pieces (trace/text.py); 4: sampled runs; 5: yardsticks; 6: engine facts; 7:
# references proved by teacher forcing; 8: controls that bound none of an engine's rounding; 9: a
# hybrid's recurrent states; 10: token trees
SCHEMA_VERSION = 10


def _from_version_1(raw: dict) -> dict:
    """Version 1 judged forks by a noise level measured on the run itself (`noise`) and a top-8
    logit difference (`logit_diff`); version 2 replaced both with independent evidence. Old verdicts
    are kept as recorded."""
    sequences = raw.get("sequences")
    # anything else is left for validation to report
    for s in sequences if isinstance(sequences, list) else []:
        if isinstance(s, dict) and isinstance(s.get("forensics"), dict):
            for old in ("noise", "logit_diff"):
                s["forensics"].pop(old, None)
    return {**raw, "schema_version": 2}


def _from_version_2(raw: dict) -> dict:
    """Version 2 kept no whole-character pieces: each token's own text stands in, as version 2
    showed it."""
    vocab = raw["vocab"] if isinstance(raw.get("vocab"), dict) else {}

    def own(ids):
        if isinstance(ids, list) and all(type(i) is int for i in ids):
            return [vocab.get(str(i), f"<{i}>") for i in ids]
        return None

    sequences = raw.get("sequences")
    # anything else is left for validation to report
    for s in sequences if isinstance(sequences, list) else []:
        if isinstance(s, dict):
            s.setdefault("output_pieces", own(s.get("output_ids")))
            s.setdefault("reference_pieces", own(s.get("reference_ids")))
    return {**raw, "schema_version": 3}


def _from_version_3(raw: dict) -> dict:
    """Version 4 added sampled runs' fields, all optional: a version-3 trace is a version-4
    greedy one."""
    return {**raw, "schema_version": 4}


def _from_version_4(raw: dict) -> dict:
    """Version 4 judged by a noise floor measured through the batched, cached kernel path it judged
    (so a bug there raised it): its floor becomes the yardstick it was, as recorded, with no
    false-alarm rate stated. Its one verdict record held both judges' fields: each verdict keeps its
    own judge's."""
    manifest = raw.get("manifest")
    if not isinstance(manifest, dict):
        return {**raw, "schema_version": 5}  # anything else is left for validation to report
    floors = manifest.pop("noise_floor", None)
    if isinstance(floors, dict):
        manifest["yardstick"] = {role: _floor_as_rounding(f, floors.get("factor"), manifest)
                                 for role, f in floors.items() if role in ("target", "draft")
                                 and isinstance(f, dict)}
    judge = EngineForensics if manifest.get("engine") else RunForensics
    sequences = raw.get("sequences")
    for seq in sequences if isinstance(sequences, list) else []:
        f = seq.get("forensics") if isinstance(seq, dict) else None
        if isinstance(f, dict):
            seq["forensics"] = {k: v for k, v in f.items() if k in judge.model_fields
                                or v not in (None, [], {})}
    return {**raw, "schema_version": 5}


def _from_version_5(raw: dict) -> dict:
    """Version 6 added what engine checks learn besides their outputs, all optional (an engine's
    drafts and accepted tokens per prompt, the fields of its file that were ignored, its
    determinism): a version-5 trace is a version-6 one."""
    return {**raw, "schema_version": 6}


def _from_version_6(raw: dict) -> dict:
    """Version 7 records how a check's reference was obtained (`reference_proof`), optional: every
    version-6 reference was decoded token by token, which is what its absence says."""
    return {**raw, "schema_version": 7}


def _from_version_7(raw: dict) -> dict:
    """Version 8 no longer grants an engine the fit of a control whose tokens bound none of its
    rounding (an engine yardstick's source `unbounded`), nor a tolerance widened by the control's
    log-probabilities beyond what its tokens allow; version 7 granted both. Its verdicts are kept
    as recorded."""
    return {**raw, "schema_version": 8}


def _from_version_8(raw: dict) -> dict:
    """Version 9 records a hybrid model's recurrent states per row and round (how many of the row's
    tokens each holds) and checks them (I5), all optional: version 8 decoded no model that has them.
    It also judges the drafts of a greedy run with a draft model (`acceptance`), absent
    from earlier traces."""
    return {**raw, "schema_version": 9}


def _from_version_9(raw: dict) -> dict:
    """Version 10 records the token trees a run verified (a row's `tree`) and a run's tree width,
    both optional: version 9 verified chains only."""
    return {**raw, "schema_version": 10}


def _floor_as_rounding(floor: dict, factor: object, manifest: dict) -> dict:
    spec = manifest.get("spec")
    return {"dtype": spec.get("dtype", "?") if isinstance(spec, dict) else "?",
            "method": f"version 4's noise floor: {floor.get('method')}",
            **{k: floor.get(k) for k in ("positions", "sequences", "resolution")},
            "slots": floor.get("chunk"), "levels": [0.5, 1.0],
            "quantiles": [floor.get("median"), floor.get("value")],
            "tolerance": (factor * floor["value"]
                          if isinstance(factor, (int, float))
                          and isinstance(floor.get("value"), (int, float))
                          else floor.get("value"))}


# version -> a function that lifts a raw trace one version up
MIGRATIONS = {1: _from_version_1, 2: _from_version_2, 3: _from_version_3, 4: _from_version_4,
              5: _from_version_5, 6: _from_version_6, 7: _from_version_7, 8: _from_version_8,
              9: _from_version_9}
