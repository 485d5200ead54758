"""axolotl: ``plugins: [wdstream.integrations.axolotl.WdstreamPlugin]`` makes ``axolotl train``
stream its ``datasets:`` / ``pretraining_dataset:`` entries with wdstream (read as
``from_config`` reads them; pretraining text packed by ``PackedSequences``, prompt formats by
axolotl's strategies in the workers, their examples packed by ``PackedExamples`` under
``sample_packing``, ``val_set_size`` held out by key) and checkpoint and resume the stream
exactly. Its checks at start are ``axolotl_checks``'s.
``is_streamed(path)`` decides which entries are wdstream's. See docs/axolotl.md."""

from __future__ import annotations

import copy
import logging
import os

from axolotl.integrations.base import BasePlugin
from pydantic import BaseModel

from wdstream.errors import InputError, WdstreamError
from wdstream.integrations.axolotl_checks import (
    PLUGIN_KEYS,
    WHERE,
    check_columns,
    check_keys,
    columns_read,
)
from wdstream.integrations.axolotl_packing import (
    PackedExamples,
    PackedRows,
    eval_split,
    held_out_share,
    packed_examples,
    samples_of,
    tests_split,
)
from wdstream.integrations.hf_trainer import steps, use_loader
from wdstream.printable import printable
from wdstream.sources import urls
from wdstream.sources.stores import store_for
from wdstream.stages.config.build import from_file_values
from wdstream.stages.config.keys import DATASET_KEYS, TRAINER_KEYS, check_values
from wdstream.stages.sequences import PackedSequences
from wdstream.stream.load.contract import world_info
from wdstream.stream.load.loader import DataLoader
from wdstream.tables.files import file_format, listed_names

# under axolotl's name: its console shows the INFO records of its own loggers only
log = logging.getLogger("axolotl.integrations.wdstream")

ENTRY_KEYS = ("datasets", "pretraining_dataset")
TESTS = "test_datasets"  # evaluated at eval_steps (with datasets: entries)
# the top-level keys of an axolotl config that from_config reads as axolotl means them
SHARED_KEYS = ("seed", "shuffle_merged_datasets")
MODEL_INPUTS = ("input_ids", "attention_mask", "labels", "position_ids")
PRETOKENIZED = MODEL_INPUTS[:3]  # the columns of an entry without type (already tokenized)
# wdstream: keys of the packing, which the plugin does with the model's tokenizer
PACKING_KEYS = ("sequences_per_epoch", "tokens_per_epoch", "long_documents")


class WdstreamArgs(BaseModel):
    """The plugin's key in axolotl's config schema: ``wdstream:``, a mapping of
    ``from_config``'s top-level keys (``shuffle_window``, ``opener``, ``tokens_per_epoch``...)."""

    wdstream: dict | None = None


class WdstreamPlugin(BasePlugin):
    """The plugin named in ``plugins:``. axolotl calls ``register`` with the config as
    written, ``load_datasets`` with the validated one, then ``post_trainer_create``."""

    def __init__(self):
        super().__init__()
        self.written: dict | None = None  # the wdstream config taken from the file
        self.mix = None
        self.tests = None  # the test_datasets: entries' mixture
        self.loader = None
        self.shown_rows = 0  # rows --debug renders (axolotl's schema drops the key)

    def get_input_args(self) -> str:
        return f"{__name__}.WdstreamArgs"

    def register(self, cfg) -> None:
        """Take the entries as written (axolotl's schema drops ``weight`` and the other keys
        it does not know) and check them now: a mistake fails before anything is loaded,
        said in one message without a traceback (``SystemExit``)."""
        try:
            self.take(cfg)
        except WdstreamError as error:  # the config's or the data's mistake, said as such
            raise SystemExit(f"{type(error).__name__}: {error}") from None

    def take(self, cfg) -> None:
        """``register``'s work: the wdstream config of ``cfg``, checked, and its mixture."""
        self.written = wdstream_config(cfg)
        if self.written is not None:
            show_in_axolotl_console()
            self.shown_rows = _debug_examples(cfg)
            check_settings(cfg, self.written)
            trainer_numbers(cfg, self.written)
            self.mix = mixture(self.written)  # every mistake of the entries, at once
            if self.written.get(TESTS):
                self.tests = tests_mixture(self.written)
            plain = _plain(cfg)
            check_columns(self.mix, plain, self.tests)
            if self.written.get("datasets") and not cfg.get("max_steps"):
                check_one_each(_listed(plain.get("datasets")), cfg)

    def load_datasets(self, cfg, preprocess: bool = False):
        """The train and eval datasets, built before the model loads; a mistake found here
        (a record its format cannot read, no held-out example) is said as ``register`` says
        one."""
        if self.written is None:
            return None
        try:
            return self.datasets(cfg, self.written, preprocess)
        except WdstreamError as error:
            raise SystemExit(f"{type(error).__name__}: {error}") from None

    def datasets(self, cfg, written: dict, preprocess: bool):
        """``load_datasets``' work: the loader, its length in steps and the eval split."""
        from axolotl.common.datasets import TrainDatasetMeta
        from axolotl.loaders import load_tokenizer

        tokenizer = load_tokenizer(cfg)
        if preprocess or (self.shown_rows and world_info()[0] == 0):
            preview(cfg, written, tokenizer, preprocess, self.shown_rows or DEBUG_EXAMPLES)
        if preprocess:  # nothing to write: the data is tokenized while training
            return TrainDatasetMeta(train_dataset=None, eval_dataset=None, total_num_steps=0)
        self.loader = make_loader(cfg, written, self.mix, tokenizer)
        total = cfg.max_steps or steps(self.loader, cfg.num_epochs or 1,
                                       cfg.gradient_accumulation_steps or 1)
        evaluated = None
        if held_out_share(cfg):
            evaluated = eval_split(mixture(written), written,
                                   prompt_formats(self.mix, tokenizer, cfg), cfg)
        elif self.tests is not None:
            evaluated = tests_split(self.tests, written,
                                   prompt_formats(self.tests, tokenizer, cfg, cfg.test_datasets),
                                   cfg)
        return TrainDatasetMeta(train_dataset=StreamColumns(self.loader.dataset),
                                eval_dataset=evaluated, total_num_steps=total)

    def get_training_args(self, cfg) -> dict:
        return {"ignore_data_skip": True} if self.written is not None else {}

    def post_trainer_create(self, cfg, trainer) -> None:
        if self.loader is not None:
            use_loader(trainer, self.loader)


def is_streamed(path) -> bool:
    """Whether wdstream reads the dataset at ``path``: a bucket (``s3://``, ``gs://``), a
    local folder of shards (with or without a manifest) or of raw Parquet, JSON Lines or Arrow
    files (at any depth), a shard, a manifest or a raw file."""
    if not isinstance(path, str) or not path:
        return False
    if store_for(path).buckets:
        return True
    local = urls.to_local_path(path)
    if local is None:
        return False
    if os.path.isdir(local):
        return _holds_data(local)
    return local.endswith((".tar", "index.json")) or file_format(local) is not None


def _holds_data(folder: str) -> bool:
    """Whether a local folder holds shards, a manifest or raw files (at any depth; ``.json``
    files where they are its only raw files, as its listing takes them)."""
    found = []
    for root, _dirs, names in os.walk(folder):
        if any(name == "index.json" or name.endswith(".tar") for name in names):
            return True
        found += [os.path.join(root, name) for name in names]
    return bool(listed_names(found))


def wdstream_config(cfg) -> dict | None:
    """The ``from_config`` config of an axolotl config as written, or None when none of its
    entries is wdstream's."""
    plain = _plain(cfg)
    entries = {key: _listed(plain.get(key)) for key in (*ENTRY_KEYS, TESTS)}
    if not _all_streamed(entries):
        return None
    check_keys(plain)
    config = {key: plain[key] for key in SHARED_KEYS if plain.get(key) is not None}
    config.update(_own_settings(plain.get("wdstream")))
    if entries["pretraining_dataset"]:
        config["pretraining_dataset"] = entries["pretraining_dataset"]
    else:  # the prompt strategy's keys are axolotl's: from_config gets the stream's
        for key in ("datasets", TESTS):
            if entries[key]:
                config[key] = [_stream_keys(entry) for entry in entries[key]]
    return config


def _all_streamed(entries: dict) -> bool:
    """Whether the entries are wdstream's (False: none is); a mixture of both is refused."""
    labelled = [(f"{key}[{i}]", entry) for key, items in entries.items()
                for i, entry in enumerate(items)]
    streamed = [label for label, entry in labelled
                if isinstance(entry, dict) and is_streamed(entry.get("path"))]
    if not streamed:
        return False
    others = [label for label, _ in labelled if label not in streamed]
    if others:
        raise InputError(f"{', '.join(others)}: not a wdstream dataset, beside the wdstream "
                         f"ones ({', '.join(streamed)}); a mixture streams and resumes only "
                         "wdstream datasets: pack it with `wdstream pack`")
    if entries["datasets"] and entries["pretraining_dataset"]:
        raise InputError("datasets and pretraining_dataset: give one or the other")
    return True


def _own_settings(own) -> dict:
    """The ``wdstream:`` mapping, without the settings axolotl's own keys give."""
    if own is None:
        return {}
    if not isinstance(own, dict):
        raise InputError(f"wdstream: a mapping of wdstream's settings, not {own!r:.60}")
    clashing = [key for key in own if key in ENTRY_KEYS or key in (
        "seq_len", "sequence_len", "tokenizer", "eos", "special_tokens")]
    if clashing:
        raise InputError(f"wdstream.{clashing[0]}: axolotl's own settings give it (the "
                         "entries, sequence_len, the model's tokenizer), not wdstream:")
    return own


def check_settings(cfg, config: dict) -> None:
    """The axolotl settings a streamed run cannot honour, refused by name."""
    share = cfg.get("val_set_size") or 0
    if isinstance(share, bool) or not isinstance(share, int | float):
        raise InputError(f"val_set_size: a number, not {share!r:.60}")
    if config.get("datasets") and (cfg.get("sample_packing") or share) \
            and not cfg.get("max_steps"):
        raise InputError("max_steps: packed examples (sample_packing: true) and a held-out "
                         "share (val_set_size) make as many batches as the examples' lengths "
                         "and keys allow, unknown before they are read: set it")
    if share and config.get("pretraining_dataset"):
        raise InputError("val_set_size: held out of datasets: entries; a streamed "
                         "pretraining_dataset has no held-out part (set val_set_size: 0)")
    if not 0 <= share < 1:
        raise InputError(f"val_set_size: a streamed dataset holds out a share of its rows "
                         f"(0 < val_set_size < 1), not a count ({share!r})")
    if config.get("pretraining_dataset") and not cfg.get("sequence_len"):
        raise InputError("sequence_len: packing pretraining_dataset entries needs it")


def check_one_each(entries: list, cfg, formats: dict | None = None) -> None:
    """Without ``max_steps`` the steps are the records' batches, so each record must give one
    example: a format that splits records (by its ``type``) or filters them (``formats``, once
    built), or dropping long examples, is refused naming the fix."""
    for index, entry in enumerate(entries):
        kind = entry.get("type") if isinstance(entry, dict) else None
        found = None if formats is None else list(formats.values())[index]
        if split_type(kind) in SPLITTING or found is not None and not found.one_each:
            raise InputError(f"max_steps: datasets[{index}] ({entry.get('path')}): type "
                             f"{kind!r} can make several examples of a record, or none, so an "
                             "epoch's steps are known only once its records are read: set "
                             "max_steps")
    if (cfg.get("excess_length_strategy") or "").lower() == "drop":
        raise InputError("max_steps: excess_length_strategy: drop leaves out examples longer "
                         "than sequence_len, so an epoch's steps are known only once its "
                         "records are read: set max_steps, or excess_length_strategy: "
                         "truncate")


def mixture(config: dict):
    """``from_config``'s ``Mix`` of the entries (the packing is ``packed``'s), their paths
    with the trust of the file they were written in."""
    return from_file_values({key: value for key, value in config.items()
                             if key not in PACKING_KEYS and key not in PLUGIN_KEYS
                             and key != TESTS}, WHERE)


def tests_mixture(config: dict):
    """The ``test_datasets:`` entries' mixture (the ``datasets:`` entries' settings)."""
    return mixture({**{key: value for key, value in config.items() if key != "datasets"},
                    "datasets": config[TESTS]})


def packed(mix, config: dict, tokenizer, cfg):
    """The pretraining entries' mixture tokenized with the model's tokenizer and packed into
    ``sequence_len`` sequences; by default as many as ``max_steps`` trains on."""
    fields = [entry.get("text_column") or entry.get("text_field") or entry.get("field")
              or "text" for entry in config["pretraining_dataset"]]
    numbers = trainer_numbers(cfg, config)
    options = {key: numbers[key] for key in PACKING_KEYS if key in numbers}
    if "long_documents" in config:
        options["long_documents"] = config["long_documents"]
    return PackedSequences(
        mix, tokenizer.backend_tokenizer, numbers["seq_len"], eos=tokenizer.eos_token_id,
        text_field=fields[0] if len(set(fields)) == 1 else dict(zip(mix.names, fields,
                                                                     strict=True)),
        **options)


def trainer_numbers(cfg, config: dict) -> dict:
    """The numbers the plugin passes on (``sequence_len``, ``micro_batch_size``, the
    packing's...; by default the sequences ``max_steps`` trains on), checked by
    ``from_config``'s rows (``keys.TRAINER_KEYS``), under ``from_config``'s names."""
    given = {key: cfg.get(key) for key in TRAINER_KEYS}
    given.update({key: config[key] for key in PACKING_KEYS if key in config})
    numbers = check_values(given, TRAINER_KEYS, WHERE)
    if not {"sequences_per_epoch", "tokens_per_epoch"} & set(numbers) \
            and numbers.get("max_steps"):
        numbers["sequences_per_epoch"] = (numbers["max_steps"] * numbers.get("micro_batch_size", 1)
                                          * numbers.get("gradient_accumulation_steps", 1)
                                          * _world())
        check_values(numbers, TRAINER_KEYS, f"{WHERE} (max_steps' sequences)")
    return numbers


class _UnderAxolotl(logging.Handler):
    """Hands wdstream's records (a resume's restored state, an epoch's plan) on under axolotl's
    logger names: axolotl's console drops other libraries' records below WARNING."""

    def emit(self, record: logging.LogRecord) -> None:
        renamed = logging.makeLogRecord({**record.__dict__,
                                         "name": f"axolotl.integrations.{record.name}"})
        logging.getLogger(renamed.name).handle(renamed)


def show_in_axolotl_console() -> None:
    """Route the ``wdstream`` loggers' records through ``_UnderAxolotl`` (once a process),
    not also to the root logger's handlers, which would show a warning twice, at the level
    of axolotl's own loggers (``AXOLOTL_LOG_LEVEL``, INFO by default)."""
    wdstream_log = logging.getLogger("wdstream")
    if not any(isinstance(h, _UnderAxolotl) for h in wdstream_log.handlers):
        wdstream_log.addHandler(_UnderAxolotl())
        wdstream_log.propagate = False
        wdstream_log.setLevel(logging.getLogger("axolotl").getEffectiveLevel())


DEBUG_EXAMPLES = 3  # rows rendered by `axolotl preprocess` and `--debug`


def _debug_examples(cfg) -> int:
    """How many rows ``--debug`` (or ``debug:``) asks to see in the config as written
    (``debug_num_examples``, else ``DEBUG_EXAMPLES``); 0 without it."""
    if not (cfg.get("debug") or cfg.get("debug_text_only") or cfg.get("debug_num_examples")):
        return 0
    return int(cfg.get("debug_num_examples") or DEBUG_EXAMPLES)


def preview(cfg, config: dict, tokenizer, preprocess: bool, wanted: int) -> None:
    """Check the run's plan and log its first ``wanted`` rows as axolotl's ``--debug`` does
    (each token with its label), from a loader of their own in this process: the training loader is not
    touched, so its epoch and state stay those of a run without a preview. The loader
    is closed when the rows are taken (its workers end)."""
    from axolotl.utils.tokenization import check_example_labels

    loader = make_loader(cfg, config, mixture(config), tokenizer)
    rows = 0
    batches = iter(loader)
    for batch in batches:
        for index in range(len(batch["input_ids"])):
            labels = batch["labels"] if "labels" in batch else batch["input_ids"]
            example = {"input_ids": batch["input_ids"][index], "labels": labels[index]}
            check_example_labels(_unpadded(example, tokenizer), tokenizer,
                                 text_only=bool(cfg.get("debug_text_only")))
            rows += 1
            if rows == wanted:
                break
        if rows == wanted:
            break
    batches.close()
    plan = f"{len(loader):,} batches of {cfg.micro_batch_size} per process" \
        if _sized(loader) else "a stream of unknown length"
    log.info("wdstream: the plan holds (%s); %d row(s) rendered above%s", plan, rows,
             "; nothing is written: rows are tokenized while training" if preprocess else "")


def _unpadded(example: dict, tokenizer) -> dict:
    """An example's tokens and labels without the padding the collator added on the right."""
    ids, labels = example["input_ids"].tolist(), example["labels"].tolist()
    pad = tokenizer.pad_token_id
    end = len(ids)
    while end and ids[end - 1] == pad and labels[end - 1] == -100:
        end -= 1
    return {"input_ids": ids[:end], "labels": labels[:end]}


def _sized(loader) -> bool:
    try:
        len(loader)
    except TypeError:
        return False
    return True


def make_loader(cfg, config: dict, mix, tokenizer):
    """The ``wdstream.DataLoader`` of the run: ``micro_batch_size`` per rank,
    ``dataloader_num_workers`` workers, batches made by ``Batches`` (with ``max_steps``:
    ``PackedExamples``, packed rows or one example a row)."""
    formats = None
    if config.get("datasets"):
        dataset = mix
        formats = prompt_formats(mix, tokenizer, cfg)
        check_first_records(mix, formats, cfg.datasets)
        if cfg.max_steps:
            dataset = packed_examples(mix, config, formats, cfg)
            formats = None
        else:
            check_one_each(_listed(cfg.datasets), cfg, formats)
    else:
        dataset = packed(mix, config, tokenizer, cfg)
    collate: Batches | PackedRows = Batches(tokenizer, formats, bool(cfg.sample_packing),
                                            cfg.sequence_len)
    if isinstance(dataset, PackedExamples):
        collate = PackedRows(tokenizer, cfg)
    return DataLoader(dataset, batch_size=cfg.micro_batch_size,
                      num_workers=cfg.dataloader_num_workers or 0, collate_fn=collate)


def prompt_formats(mix, tokenizer, cfg, entries=None) -> dict:
    """Each ``datasets:`` entry's (or ``entries``') ``PromptFormat``, by its name in the
    mixture."""
    return {name: PromptFormat(entry, tokenizer, cfg)
            for name, entry in zip(mix.names, cfg.datasets if entries is None else entries,
                                   strict=True)}


class PromptFormat:
    """axolotl's prompt strategy for one ``datasets:`` entry, applied to one record.

    axolotl builds a strategy and maps a Hugging Face dataset through it
    (``get_dataset_wrapper``); given a ``RecordedMaps`` in place of the dataset, the maps and
    filters it asks for are recorded, and run here on each record as ``datasets`` would run
    them: a record gives the examples they leave of it, none, one or several."""

    def __init__(self, entry, tokenizer, cfg):
        from axolotl.utils.data.wrappers import get_dataset_wrapper

        kind = entry.get("type")
        self.path = entry.get("path")
        self.kind = kind
        if kind is None:  # no type: rows already tokenized, used as they are (as axolotl)
            self.steps = [(mapped, pretokenized, False)]
            return
        base, _, style = kind.partition(":") if isinstance(kind, str) else (None, "", "")
        maps = RecordedMaps.make()
        get_dataset_wrapper(dataset_config=entry, tokenizer=tokenizer, cfg=cfg,
                            dataset_base_type=base, dataset=maps,
                            dataset_prompt_style=style or None)
        self.steps = maps.steps

    @property
    def one_each(self) -> bool:
        """Whether every record gives exactly one example: a format that neither filters nor
        splits a long text into several (``SPLITTING``)."""
        return split_type(self.kind) not in SPLITTING \
            and all(step is mapped for step, _f, _b in self.steps)

    def __call__(self, record: dict) -> list[dict]:
        rows = [record]
        for step, function, batched in self.steps:
            rows = step(function, batched, rows, self.path) if rows else rows
        return rows


# formats whose records may each give several examples (text longer than sequence_len split)
SPLITTING = ("completion", "pretrain")


def split_type(kind) -> str | None:
    """The strategy of a ``type`` (``alpaca`` of ``alpaca:chat``); None: no type, or not a
    name."""
    return kind.partition(":")[0] if isinstance(kind, str) else None


def mapped(function, batched: bool, rows: list[dict], path) -> list[dict]:
    """The rows a ``map`` makes of ``rows`` (batched: of their columns, any number)."""
    if not batched:
        return [function(row) for row in rows]
    made = function(columns_of(rows))
    lengths = {len(column) for column in made.values()}
    if len(lengths) > 1:
        raise InputError(f"{path}: the prompt format made columns of {sorted(lengths)} "
                         "rows from one record")
    return [dict(zip(made, values, strict=True)) for values in zip(*made.values(), strict=True)]


def kept(function, batched: bool, rows: list[dict], path) -> list[dict]:
    """The rows a ``filter`` keeps of ``rows``."""
    if not batched:
        return [row for row in rows if function(row)]
    keep = list(function(columns_of(rows)))
    if len(keep) != len(rows):
        raise InputError(f"{path}: the prompt format's filter gave {len(keep)} answers "
                         f"for {len(rows)} rows")
    return [row for row, wanted in zip(rows, keep, strict=True) if wanted]


def columns_of(rows: list[dict]) -> dict[str, list]:
    return {key: [row[key] for row in rows] for key in rows[0]}


def pretokenized(record: dict) -> dict:
    """A tokenized row's example: its ``input_ids``, ``attention_mask`` and ``labels``."""
    return {key: record[key] for key in PRETOKENIZED}


class RecordedMaps:
    """Stands in for the ``datasets.IterableDataset`` axolotl wraps: records each ``map``."""

    steps: list  # (mapped or kept, function, batched) of each map and filter

    @classmethod
    def make(cls):
        import datasets

        class Recorder(RecordedMaps, datasets.IterableDataset):
            def __init__(self):
                examples = datasets.iterable_dataset.ExamplesIterable(_no_examples, {})
                datasets.IterableDataset.__init__(
                    self, examples, info=datasets.DatasetInfo(features=datasets.Features()))
                self.steps = []

        return Recorder()

    @property
    def data(self):
        """No rows: what a ``datasets.Dataset`` a strategy builds on the maps it asked for
        (``TokenizedPromptDataset``) is made of."""
        from datasets.table import InMemoryTable

        return InMemoryTable.from_pydict({})

    def map(self, function=None, *_args, batched: bool = False, **_kwargs):
        if function is not None:
            self.steps.append((mapped, function, batched))
        return self

    def filter(self, function=None, *_args, batched: bool = False, **_kwargs):
        if function is not None:
            self.steps.append((kept, function, batched))
        return self


def _no_examples():
    return iter(())


class Batches:
    """The collate function: each sample formatted (``formats`` by ``__source__``: one
    example a record; packed sequences as they are), its model inputs cut to ``seq_len``
    tokens and padded into a batch by axolotl's collator."""

    def __init__(self, tokenizer, formats: dict | None, keep_positions: bool,
                 seq_len: int | None = None):
        from axolotl.utils.collators import DataCollatorForSeq2Seq

        self.formats, self.seq_len = formats, seq_len
        self.keys = MODEL_INPUTS if keep_positions or formats else MODEL_INPUTS[:3]
        self.pad = DataCollatorForSeq2Seq(tokenizer, padding=True, return_tensors="pt")

    def __call__(self, samples: list) -> dict:
        examples = []
        for sample in samples:
            if self.formats is not None:
                sample = one_example(self.formats, sample)
            examples.append({key: _ints(sample[key])[:self.seq_len] for key in self.keys
                             if key in sample})
        return self.pad(examples)


def one_example(formats: dict, sample: dict) -> dict:
    """A sample's one example, formatted by its source's prompt format (``formats``)."""
    made = examples_of(formats, sample)
    found = formats[sample["__source__"]]
    if len(made) != 1:
        raise InputError(f"{found.path}: the prompt format made {len(made)} examples of the "
                         f"record {sample['__key__']}, so an epoch's steps are not one per "
                         "record: set max_steps")
    return made[0]


# what a prompt strategy raises on a record it cannot read (a missing column, another type)
UNREADABLE = (KeyError, TypeError, ValueError, IndexError, AttributeError)


def examples_of(formats: dict, sample: dict) -> list[dict]:
    """The examples a sample's record gives under its source's prompt format (``formats`` by
    ``__source__``); a record the format cannot read is an ``InputError`` naming the entry's
    path, the record (file and row) and its columns."""
    found = formats[sample["__source__"]]
    record = record_of(sample)
    try:
        return found(record)
    except WdstreamError:
        raise
    except UNREADABLE as error:
        kind, key = printable(repr(found.kind))[:80], printable(str(sample.get("__key__")))
        columns = printable(", ".join(map(str, record)))[:200]
        raise InputError(f"{printable(str(found.path))}: type {kind} cannot read the record "
                         f"{key} ({type(error).__name__}: {printable(str(error))[:200]}; its "
                         f"columns: {columns})") from error


def check_first_records(mix, formats: dict, entries: list) -> None:
    """Each entry whose format's columns are not known to the start-up check
    (``columns_read``): its first record formatted now, so that a record the format cannot
    read fails before the model loads."""
    for entry, name, dataset in zip(entries, mix.names, mix.datasets, strict=True):
        if entry.get("type") is None or columns_read(entry):
            continue
        for sample in samples_of(dataset):
            examples_of(formats, {**sample, "__source__": name})
            break


def record_of(sample: dict) -> dict:
    """A streamed sample's record: its ``json`` member, else its members by name."""
    record = sample.get("json")
    if isinstance(record, dict):
        return record
    return {key: value for key, value in sample.items() if not key.startswith("__")}


class StreamColumns:
    """What axolotl's trainer reads of the train dataset before the loader takes over: its
    columns (the dataset itself is iterated only through the ``wdstream.DataLoader``)."""

    column_names = list(MODEL_INPUTS)

    def __init__(self, dataset):
        self.dataset = dataset

    def __iter__(self):
        return iter(self.dataset)


def _ints(value) -> list:
    return value.tolist() if hasattr(value, "tolist") else list(value)


def _stream_keys(entry):
    """An entry's keys ``from_config`` reads."""
    if not isinstance(entry, dict):
        return entry
    return {key: value for key, value in entry.items() if key in DATASET_KEYS and key != "type"}


def _listed(value) -> list:
    if value is None:
        return []
    return [value] if isinstance(value, dict | str) else list(value)


def _plain(cfg) -> dict:
    """The config as plain dicts and lists (axolotl's ``DictDefault`` copied)."""
    to_dict = getattr(cfg, "to_dict", None)
    return copy.deepcopy(to_dict() if to_dict is not None else dict(cfg))


def _world() -> int:
    return world_info()[1]
