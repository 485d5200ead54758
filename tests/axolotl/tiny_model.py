"""Builds the tests' tiny Llama and its tokenizer in a folder (no download):
``python tiny_model.py FOLDER TEXTS.jsonl`` trains a BPE tokenizer on the ``text`` of the
records and saves it with a 2-layer Llama of hidden size 32."""

from __future__ import annotations

import json
import sys

import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

SPECIAL = ["<unk>", "<s>", "</s>", "<pad>"]


def main(folder: str, texts_path: str) -> None:
    with open(texts_path, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.Whitespace()
    bpe.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=160, special_tokens=SPECIAL,
                                                       show_progress=False))
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
        pad_token="<pad>")
    tokenizer.save_pretrained(folder)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
        bos_token_id=1, eos_token_id=2, pad_token_id=3, tie_word_embeddings=False)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)


if __name__ == "__main__":
    main(*sys.argv[1:])
