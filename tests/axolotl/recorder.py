"""A second axolotl plugin for the tests: records the batches the model trains on, and kills
the run with SIGKILL at a step.

Each forward pass of the model appends its ``input_ids``, ``labels`` and ``position_ids`` (when
given) as one line to
``{output_dir}/batches-{RUN}-rank{R}.jsonl`` (``WDSTREAM_TEST_RUN`` names the run; evaluation's
to ``evals-{RUN}-rank{R}.jsonl``); with
``WDSTREAM_TEST_KILL_AT=N`` the process kills itself with SIGKILL at the end of step N, before
the Trainer would save that step's checkpoint (it saves after the step-end callbacks). It
also keeps each trainer until the process exits (``_trainers``)."""

from __future__ import annotations

import json
import os
import signal

import transformers
from axolotl.integrations.base import BasePlugin

# This process's trainers, kept until it exits. axolotl 0.19 ends a run with
# destroy_process_group(), `del trainer` and gc.collect(): the collection frees the DDP
# model's reducer, and with it the gloo process group, which waits for its threads while the
# collection holds the interpreter lock. One of those threads may still be letting go of the
# run's last collective (transformers' store_flos gathers just before), and freeing
# that collective's tensors takes the lock: both wait for good. Kept here, the group is
# freed as the interpreter exits, long after its threads went idle.
_trainers: list = []


class Recorder(BasePlugin):
    def post_model_load(self, cfg, model):
        path = os.path.join(cfg.output_dir, f"batches-{os.environ['WDSTREAM_TEST_RUN']}-"
                                            f"rank{os.environ.get('RANK', '0')}.jsonl")
        os.makedirs(cfg.output_dir, exist_ok=True)

        def record(_module, args, kwargs):
            line = {key: kwargs[key].tolist() for key in ("input_ids", "labels", "position_ids")
                    if kwargs.get(key) is not None}
            target = path if model.training else path.replace("/batches-", "/evals-")
            with open(target, "a", encoding="utf-8") as f:
                f.write(json.dumps(line) + "\n")

        model.register_forward_pre_hook(record, with_kwargs=True)

    def add_callbacks_post_trainer(self, cfg, trainer):
        _trainers.append(trainer)
        kill_at = int(os.environ.get("WDSTREAM_TEST_KILL_AT", "0"))
        return [KillAt(kill_at)] if kill_at else []


class KillAt(transformers.TrainerCallback):
    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)
        return control
