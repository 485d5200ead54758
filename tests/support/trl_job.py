"""TRL's ``SFTTrainer`` on sequences packed by ``wdstream.PackedSequences``, through
``wdstream.integrations.hf_trainer.use_loader``; run by tests/integrations/test_trl.py in a
process of its own:

    python tests/support/trl_job.py WORKDIR   (WORKDIR holds tokenizer.json and web/)

Trains a tiny Llama for 2 epochs of the loader, checkpointing every 3 steps, then resumes a
fresh trainer from ``checkpoint-3``; prints one JSON line: the sequences each run trained on.
"""

from __future__ import annotations

import json
import os
import sys

import torch  # noqa: E402
import transformers  # noqa: E402
from trl import SFTConfig, SFTTrainer  # noqa: E402

import wdstream  # noqa: E402
from wdstream.integrations.hf_datasets import to_iterable_dataset  # noqa: E402
from wdstream.integrations.hf_trainer import steps, use_loader  # noqa: E402


def main() -> None:
    work = sys.argv[1]
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_file=os.path.join(work, "tokenizer.json"), eos_token="<eos>",
        pad_token="<eos>")

    def packed():
        return wdstream.from_config({
            "seed": 1, "sequence_len": 16, "tokenizer": os.path.join(work, "tokenizer.json"),
            "special_tokens": {"eos_token": "<eos>"}, "sequences_per_epoch": 24,
            "datasets": [{"path": os.path.join(work, "web"), "type": "completion",
                          "field": "text"}]})

    def model():
        torch.manual_seed(0)
        config = transformers.LlamaConfig(vocab_size=128, hidden_size=16, intermediate_size=32,
                                          num_hidden_layers=1, num_attention_heads=2,
                                          num_key_value_heads=2, max_position_embeddings=64)
        made = transformers.LlamaForCausalLM(config)
        seen = []
        made.register_forward_pre_hook(
            lambda _module, args, kwargs: seen.extend(kwargs["input_ids"].tolist()),
            with_kwargs=True)
        return made, seen

    def trainer(net):
        data = packed()
        loader = wdstream.DataLoader(data, batch_size=2)
        args = SFTConfig(output_dir=os.path.join(work, "out"), max_steps=steps(loader, epochs=2),
                         save_steps=3, per_device_train_batch_size=2, learning_rate=1e-2,
                         logging_steps=100, report_to=[], use_cpu=True, seed=0,
                         dataset_kwargs={"skip_prepare_dataset": True})
        sft = SFTTrainer(model=net, args=args, train_dataset=to_iterable_dataset(data),
                         processing_class=tokenizer)
        return use_loader(sft, loader)

    (reference, seen), (resumed, seen_resumed) = model(), model()
    trainer(reference).train()
    trainer(resumed).train(resume_from_checkpoint=os.path.join(work, "out", "checkpoint-3"))
    print(json.dumps({"reference": seen, "resumed": seen_resumed}))


if __name__ == "__main__":
    main()
