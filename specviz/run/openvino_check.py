"""OpenVINO GenAI checked: its pipeline run on the check's own pair (engines/openvino.py), beside
its control (the same pipeline without speculation) and, asked for, its repeats, then judged as
any engine's outputs are (check.py)."""
from __future__ import annotations

from specviz.engines import openvino
from specviz.models.pairs import ModelPair
from specviz.run.check import Judging, check, record_repeats, sampling_settings
from specviz.run.launch import on_main
from specviz.run.runner import encode
from specviz.spec.run import RunSpec
from specviz.trace.schema import Trace


def from_openvino(spec: RunSpec, pair: ModelPair, setting: openvino.Setting, control: bool,
                  determinism: bool = False, judging: Judging = Judging(),
                  threads: int | None = None) -> Trace | None:
    """Check OpenVINO in `setting` on `spec`'s prompts, every prompt in one batch. `control`: run
    it without speculation too. `determinism`: the same requests again, then in reverse order, on
    the same pipeline. `threads`: the CPU threads OpenVINO computes on (openvino.run)."""
    ids = encode(spec, pair)
    order = list(range(len(ids)))
    orders = [order, order, order[::-1]] if determinism else [order]

    def answers():
        target = openvino.exported(openvino.model_folder(spec.target, spec.target_revision))
        draft = (openvino.exported(openvino.model_folder(spec.draft, spec.draft_revision))
                 if setting.mode == "draft" else None)
        asked = dict(prompts=ids, max_new_tokens=spec.max_new_tokens, eos_ids=list(pair.eos_ids),
                     sampling=sampling_settings(spec) or None, threads=threads)
        runs = openvino.run(setting, target, draft, orders=orders, **asked)
        return runs, (openvino.run(setting.control(), target, None, **asked)[0] if control
                      else None)

    runs, control_run = on_main(answers)
    again = dict(zip(("again", "reordered"), runs[1:]))
    return record_repeats(check(spec, pair, ids, runs[0], control_run, judging,
                                batch=len(ids)), runs[0], again)
