"""OpenVINO GenAI's side of the adapter: run in OpenVINO's own Python (.venv-openvino), never
imported by specviz (it needs nothing of specviz, and specviz nothing of OpenVINO).

It reads one job as JSON on stdin, loads a ContinuousBatchingPipeline once, runs the job's prompts
once per order asked (the same requests again, or in another order, on the same pipeline), and
writes JSON on stdout. Each request goes in through `add_request` and comes back one `step()` at a
time: the tokens a step adds to a request are one round of its speculation (the accepted drafts and
the target's own token), so the chunks are kept as well as the ids, log-probabilities and the
sequence's score that the engine reports."""
import json
import sys
import time

import numpy as np

try:
    import openvino as ov
    import openvino_genai as genai
except ImportError:  # imported in specviz's own Python (tests/test_layers.py), never run there
    ov = genai = None


def scheduler(job: dict) -> "genai.SchedulerConfig":
    s = genai.SchedulerConfig()
    s.cache_size = 1  # GB of KV blocks: plenty for the batches specviz sends
    s.max_num_seqs = max(len(job["prompts"]), 1)
    s.max_num_batched_tokens = job["max_num_batched_tokens"]
    s.enable_prefix_caching = job["prefix_caching"]
    return s


def pipeline(job: dict) -> "genai.ContinuousBatchingPipeline":
    properties = dict(job["properties"])
    if job["mode"] == "draft":
        properties["draft_model"] = genai.draft_model(job["draft"], "CPU", **job["properties"])
    elif job["mode"] == "ngram":
        properties["prompt_lookup"] = True
    # the properties go positionally: as keyword arguments they raise TypeError
    return genai.ContinuousBatchingPipeline(job["target"], scheduler(job), "CPU", properties)


def generation_config(job: dict) -> "genai.GenerationConfig":
    c = genai.GenerationConfig()
    c.max_new_tokens = job["max_new_tokens"]
    c.stop_token_ids = set(job["eos_ids"])
    c.logprobs = 1
    if job["mode"] == "draft":
        c.num_assistant_tokens = job["k"]
    elif job["mode"] == "ngram":
        c.num_assistant_tokens = job["k"]
        c.max_ngram_size = job["ngram"]
    sampling = job.get("sampling")
    if sampling:
        c.do_sample = True
        c.temperature = sampling["temperature"]
        c.top_p = sampling["top_p"]
        if sampling["top_k"]:  # (0: off, OpenVINO's default)
            c.top_k = sampling["top_k"]
        c.rng_seed = sampling["seed"]
    return c


def run(pipe, job: dict, order: list[int]) -> list[dict]:
    """Every prompt of `order` in one batch, stepped to the end; the answers in prompt order."""
    config = generation_config(job)
    handles = {}
    for request, seq in enumerate(order):
        ids = ov.Tensor(np.array([job["prompts"][seq]], dtype=np.int64))
        handles[seq] = pipe.add_request(request, ids, config)
    answers = {seq: {"ids": [], "logprobs": [], "chunks": [], "scores": [], "score": None}
               for seq in order}
    while pipe.has_non_finished_requests():
        pipe.step()
        for seq, handle in handles.items():
            if not handle.can_read():
                continue
            for output in handle.read().values():
                got = answers[seq]
                if output.generated_ids:
                    got["ids"] += list(output.generated_ids)
                    got["logprobs"] += list(output.generated_log_probs)
                    got["chunks"].append(len(output.generated_ids))
                    got["scores"].append(output.score)
                got["score"] = output.score
    return [answers[seq] for seq in range(len(job["prompts"]))]


def main() -> None:
    job = json.load(sys.stdin)
    start = time.perf_counter()
    pipe = pipeline(job)
    loaded = time.perf_counter() - start
    runs = []
    for order in job["orders"]:
        start = time.perf_counter()
        outputs = run(pipe, job, order)
        runs.append({"outputs": outputs, "seconds": time.perf_counter() - start})
    core = ov.Core()
    # what "the CPU's defaults" are on this machine, to say which precision ran
    defaults = {name: core.get_property("CPU", name).to_string()
                for name in ("INFERENCE_PRECISION_HINT", "KV_CACHE_PRECISION")}
    json.dump({"version": genai.__version__, "openvino": ov.__version__, "load_seconds": loaded,
               "cpu_defaults": defaults, "runs": runs}, sys.stdout)


if __name__ == "__main__":
    main()
