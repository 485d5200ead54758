"""Train a tiny causal language model on packed token sequences streamed from S3, checkpoint,
crash, and resume to the same loss curve.

What it shows:

1. two corpora ("web" sentences and "code" lines) packed with ``wdstream.pack`` into
   ``s3://BUCKET/web/`` and ``s3://BUCKET/code/``, and a ``tokenizer.json`` beside them;
2. a declarative config (``WORKDIR/data.yaml``, the YAML trainers write: paths, weights, text
   field, seq_len, tokenizer) turned into a dataset by ``wdstream.from_config``: a 70/30
   ``Mix`` of the two, tokenized and packed into sequences of ``--seq-len`` tokens in the
   DataLoader workers;
3. a training loop that saves model, optimizer and ``loader.state_dict()`` every
   ``--checkpoint-every`` steps; ``--die-at N`` kills the process (SIGKILL) after step N, and
   ``--resume`` continues from the last checkpoint with exactly the batches, and so the
   losses, of an uninterrupted run.

The S3 endpoint is the one in ``AWS_ENDPOINT_URL`` (e.g. from ``tools/local-s3.sh``, whose
bucket ``wdstream`` is the default ``--bucket``); without it the script starts a local moto
server for the run. Data are packed on the first run only.

    python examples/train_tiny_lm.py --workdir /tmp/lm --steps 40
    python examples/train_tiny_lm.py --workdir /tmp/lm2 --steps 40 --die-at 23
    python examples/train_tiny_lm.py --workdir /tmp/lm2 --steps 40 --resume

Each step prints ``step N loss X``. Needs ``wdstream[s3,llm]`` and torch (CPU is enough), and
``moto[server]`` when no endpoint is given.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import sys

import torch
from torch import nn

import wdstream

# ---- data ----------------------------------------------------------------------------------

NOUNS = "model shard token batch epoch worker rank seed stream window sample loss".split()
VERBS = "reads packs mixes streams shuffles resumes trains saves loads skips".split()
ADJECTIVES = "small large next first last exact fresh random".split()
CODE = "def f return if else for in range x y i n + - * = ( ) : [ ]".split()
SPECIALS = ["<unk>", "<eos>"]


def web_document(rng: random.Random) -> str:
    sentences = []
    for _ in range(rng.randint(1, 6)):
        sentence = ["the", rng.choice(ADJECTIVES), rng.choice(NOUNS), rng.choice(VERBS), "the",
                    rng.choice(NOUNS)]
        sentences.append(" ".join(sentence) + " .")
    return " ".join(sentences)


def code_document(rng: random.Random) -> str:
    lines = []
    for _ in range(rng.randint(1, 4)):
        n = rng.randint(0, 9)
        lines.append(f"def f ( x ) : return x + {n}" if rng.random() < 0.5 else
                     f"for i in range ( {n} ) : y = y * i")
    return " ".join(lines)


def vocabulary() -> list[str]:
    words = NOUNS + VERBS + ADJECTIVES + CODE + ["the", "."] + [str(n) for n in range(10)]
    return SPECIALS + sorted(set(words))


def write_tokenizer(url: str) -> None:
    """A word-level tokenizer.json over the corpora's words, built (not trained) so it is the
    same bytes on every run."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from wdstream.sources.objects import write_bytes

    vocab = {word: index for index, word in enumerate(vocabulary())}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    write_bytes(url, tokenizer.to_str().encode())


def prepare(bucket: str, workdir: str, documents: int) -> None:
    """Pack the two corpora and write the tokenizer, unless they are there already."""
    from wdstream.errors import StreamError
    from wdstream.sources.objects import read_bytes

    try:
        read_bytes(f"s3://{bucket}/tokenizer.json")
        return  # written last, so everything else is there
    except StreamError as error:
        if error.transient:
            raise
    os.makedirs(os.path.join(workdir, "data"), exist_ok=True)
    for name, make in (("web", web_document), ("code", code_document)):
        rng = random.Random(name)
        path = os.path.join(workdir, "data", f"{name}.jsonl")
        with open(path, "w") as f:
            for _ in range(documents):
                f.write(json.dumps({"text": make(rng)}) + "\n")
        wdstream.pack(path, f"s3://{bucket}/{name}/", max_count=100, overwrite=True)
    write_tokenizer(f"s3://{bucket}/tokenizer.json")


def write_config(path: str, bucket: str, seq_len: int, sequences_per_epoch: int) -> None:
    """The dataset config, as a trainer's YAML file (see docs/llm.md for every key)."""
    import yaml

    config = {
        "seed": 17,
        "seq_len": seq_len,
        "tokenizer": f"s3://{bucket}/tokenizer.json",
        "eos": "<eos>",
        "sequences_per_epoch": sequences_per_epoch,
        "shuffle_window": 50,
        "datasets": [
            {"path": f"s3://{bucket}/web/", "label": "web", "weight": 0.7, "streaming": True,
             "type": "pretrain", "text_field": "text"},
            {"path": f"s3://{bucket}/code/", "label": "code", "weight": 0.3, "streaming": True,
             "type": "pretrain", "text_field": "text"},
        ],
    }
    with open(path, "w") as f:
        yaml.safe_dump(config, f, sort_keys=False)


# ---- model ---------------------------------------------------------------------------------

class TinyLM(nn.Module):
    """Token and position embeddings, two small transformer layers, attention restricted to
    earlier tokens of the same document (documents are told apart by position_ids)."""

    def __init__(self, vocab: int, seq_len: int, dim: int = 64, heads: int = 4, layers: int = 2):
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, dim)
        self.position = nn.Embedding(seq_len, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.0, batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, vocab)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        length = input_ids.shape[1]
        document = torch.cumsum(position_ids == 0, dim=1)
        causal = torch.ones(length, length, dtype=torch.bool).tril()
        allowed = causal & (document[:, :, None] == document[:, None, :])
        mask = torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))
        mask = mask.repeat_interleave(self.heads, dim=0)
        x = self.embed(input_ids) + self.position(position_ids)
        return self.head(self.blocks(x, mask=mask))

    def loss(self, batch: dict) -> torch.Tensor:
        logits = self(batch["input_ids"], batch["position_ids"])
        targets = batch["labels"][:, 1:].clone()
        targets[batch["position_ids"][:, 1:] == 0] = -100  # a document's first token: no context
        return nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                           targets.reshape(-1), ignore_index=-100)


# ---- training ------------------------------------------------------------------------------

def save(path: str, state: dict) -> None:
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)  # a kill during the save leaves the previous checkpoint


def train(args) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    config_path = os.path.join(args.workdir, "data.yaml")
    write_config(config_path, args.bucket, args.seq_len, args.steps_per_epoch * args.batch_size)
    dataset = wdstream.from_config(config_path)
    loader = wdstream.DataLoader(dataset, batch_size=args.batch_size, num_workers=args.workers,
                                 drop_last=True)
    model = TinyLM(len(vocabulary()), dataset.seq_len)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    checkpoint_path = os.path.join(args.workdir, "checkpoint.pt")
    step = 0
    if args.resume and os.path.exists(checkpoint_path):
        checkpoint = torch.load(checkpoint_path)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        loader.load_state_dict(checkpoint["loader"])
        torch.set_rng_state(checkpoint["rng"])
        step = checkpoint["step"]
        print(f"resumed after step {step}", flush=True)

    while step < args.steps:
        for batch in loader:  # each new iteration reads the next epoch
            step += 1
            loss = model.loss(batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            print(f"step {step} loss {loss.item():.9f}", flush=True)
            if step % args.checkpoint_every == 0:
                save(checkpoint_path, {"model": model.state_dict(),
                                       "optimizer": optimizer.state_dict(),
                                       "loader": loader.state_dict(),
                                       "rng": torch.get_rng_state(), "step": step})
            if step == args.die_at:
                print(f"dying after step {step}", flush=True)
                if args.die_with == "exception":
                    raise RuntimeError(f"simulated crash after step {step}")
                os.kill(os.getpid(), signal.SIGKILL)
            if step >= args.steps:
                break


def start_local_s3(bucket: str):
    """A moto S3 server in this process, with ``bucket``, for running the example without an
    endpoint."""
    from moto.server import ThreadedMotoServer

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    os.environ.update({"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
                       "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1"})
    import boto3

    boto3.client("s3").create_bucket(Bucket=bucket)
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", required=True, help="checkpoints (and generated corpora)")
    parser.add_argument("--bucket", default="wdstream",
                        help="an existing bucket (tools/local-s3.sh creates 'wdstream')")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--steps-per-epoch", type=int, default=25)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--documents", type=int, default=400, help="per corpus")
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--die-at", type=int, help="crash right after this step")
    parser.add_argument("--die-with", choices=["kill", "exception"], default="kill")
    parser.add_argument("--resume", action="store_true", help="continue from the checkpoint")
    args = parser.parse_args(argv)

    os.makedirs(args.workdir, exist_ok=True)
    server = None
    if "AWS_ENDPOINT_URL" not in os.environ:
        server = start_local_s3(args.bucket)
    try:
        prepare(args.bucket, args.workdir, args.documents)
        train(args)
    finally:
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
