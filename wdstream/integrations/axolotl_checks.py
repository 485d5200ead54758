"""The axolotl plugin's checks at start (``WdstreamPlugin.register``), before the model
loads: every key of a streamed entry and of ``wdstream:`` is one wdstream or axolotl knows
(a misspelling is an error naming the entry, the key and the known key it resembles), the
data settings a stream does not honour are refused by name, and
each file of an entry has the columns its prompt format reads (from a Parquet or Arrow
file's schema, a JSON Lines file's first row). Every mistake is reported at once."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from wdstream.printable import printable
from wdstream.stages.config.keys import DATASET_KEYS, TOP_KEYS, Report, resembled
from wdstream.tables.formats import FileUnits
from wdstream.tables.reads import Access
from wdstream.tables.units import FORMATS, UnitTable

# the plugin's own keys under wdstream: (beside from_config's)
# records packed together (sample_packing with datasets:); held-out examples evaluated
PLUGIN_KEYS = ("packing_buffer", "eval_examples")
WHERE = "the axolotl config"  # how errors name the config
# axolotl's schema of each kind of entry (a pydantic model in axolotl.utils.schemas.datasets)
SCHEMAS = {"datasets": "SFTDataset", "pretraining_dataset": "PretrainingDataset",
           "test_datasets": "SFTDataset"}


def label_of(key: str, index: int, entry) -> str:
    """``datasets[0] (s3://bucket/alpaca/)``: how messages name an entry."""
    path = entry.get("path") if isinstance(entry, Mapping) else None
    return f"{key}[{index}]" + (f" ({printable(path)})" if isinstance(path, str) else "")


def known_entry_keys(kind: str) -> set[str]:
    """The keys of a ``kind`` entry (``datasets`` or ``pretraining_dataset``): wdstream's and
    those of axolotl's schema for it."""
    from axolotl.utils.schemas import datasets as schemas

    return set(DATASET_KEYS) | set(getattr(schemas, SCHEMAS[kind]).model_fields)


def known_own_keys() -> set[str]:
    """The keys ``wdstream:`` knows (those axolotl's own settings give are refused by name
    after this check)."""
    return set(TOP_KEYS) | set(PLUGIN_KEYS)


def unknown_keys(where: str, given: Iterable, known: set[str]) -> list[str]:
    """One message per key of ``given`` not in ``known``, with the known key it resembles."""
    problems = []
    for key in given:
        if key in known:
            continue
        problems.append(f"{where}: unknown key {printable(repr(key))}"
                        f"{resembled(key, known, cutoff=0.75)}")
    return problems


def key_problems(plain: Mapping) -> list[str]:
    """Every unknown key of the streamed entries and of ``wdstream:``."""
    problems = []
    for kind in SCHEMAS:
        value = plain.get(kind)
        entries = [value] if isinstance(value, Mapping) else list(value or [])
        known = known_entry_keys(kind) if entries else set()
        for index, entry in enumerate(entries):
            if isinstance(entry, Mapping):
                problems += unknown_keys(label_of(kind, index, entry), entry, known)
    own = plain.get("wdstream")
    if isinstance(own, Mapping):
        problems += unknown_keys("wdstream", own, known_own_keys())
    return problems


def check_keys(plain: Mapping) -> None:
    """``InputError`` naming every unknown key of the streamed entries and ``wdstream:``, and
    every setting of axolotl's a stream does not honour (or only the trainer's kind, when the
    plugin does not feed it)."""
    raise_all(trainer_problems(plain) or key_problems(plain) + setting_problems(plain))


# the trainers whose datasets the plugin does not stream: what axolotl reads of each
NOT_STREAMED = {"rl": "preference pairs or prompts", "reward_model": "preference pairs",
                "process_reward_model": "stepwise-labelled completions"}


def trainer_problems(plain: Mapping) -> list[str]:
    """The training kind the plugin does not feed (``rl:``, a reward model), named: it streams
    the examples of SFT and pretraining, which these trainers do not take."""
    return [f"{key}: {printable(repr(plain[key]))[:60]}: the wdstream plugin streams the "
            f"examples of SFT and pretraining; this trainer reads {what} through TRL's own "
            "dataset preparation, which it does not feed. Remove the plugin from plugins: to "
            "let axolotl load these datasets itself"
            for key, what in NOT_STREAMED.items() if plain.get(key)]


def setting_problems(plain: Mapping) -> list[str]:
    """axolotl's data settings a streamed run does not honour, each named."""
    problems = []
    if plain.get("dataset_exact_deduplication"):
        problems.append("dataset_exact_deduplication: a stream is not deduplicated (that "
                        "needs every row at once); deduplicate the files before, and set it "
                        "to false")
    if str(plain.get("excess_length_strategy") or "drop").lower() not in ("drop", "truncate"):
        problems.append("excess_length_strategy: a stream drops or truncates the examples "
                        "longer than sequence_len ('drop', 'truncate'), it cannot stop at one "
                        f"({plain.get('excess_length_strategy')!r})")
    if plain.get("test_datasets") and plain.get("pretraining_dataset"):
        problems.append("test_datasets: evaluated with datasets: entries; a streamed "
                        "pretraining_dataset has no test datasets")
    return problems


def raise_all(problems: list[str]) -> None:
    """The problems (each ``"label: message"``) in one ``InputError``, said as every config's
    errors are (``keys.Report``)."""
    report = Report(WHERE)
    report.errors.extend(problems)
    report.raise_errors()


# ---- columns ------------------------------------------------------------------------------
def columns_read(entry: Mapping) -> tuple[str, ...]:
    """The columns a ``datasets:`` entry's prompt format cannot do without (empty: a format
    whose columns are not known here)."""
    kind = entry.get("type")
    if kind is None:  # rows already tokenized (as axolotl takes a dataset without type)
        return ("input_ids", "attention_mask", "labels")
    if isinstance(kind, Mapping):  # a format written in the config: its fields
        return tuple(kind.get(key) or default for key, default in (
            ("field_instruction", "instruction"), ("field_output", "output")))
    base = kind.partition(":")[0].partition(".")[0] if isinstance(kind, str) else None
    if base == "alpaca":
        return ("instruction", "output")
    if base == "chat_template":
        return (entry.get("field_messages") or "messages",)
    if base == "completion":
        return (entry.get("field") or "text",)
    if base == "input_output":
        return ("segments",)
    return ()


def pretraining_columns(entry: Mapping) -> tuple[str, ...]:
    return (entry.get("text_column") or entry.get("text_field") or entry.get("field")
            or "text",)


def column_problems(mix, plain: Mapping, kind: str | None = None) -> list[str]:
    """For each streamed entry of raw files (of ``kind``: by default the training ones), its
    files lacking a column its format reads."""
    kind = kind or ("datasets" if plain.get("datasets") else "pretraining_dataset")
    value = plain.get(kind)
    entries = [value] if isinstance(value, Mapping) else list(value or [])
    read = pretraining_columns if kind == "pretraining_dataset" else columns_read
    problems = []
    for index, (entry, dataset) in enumerate(zip(entries, mix.datasets, strict=True)):
        needed = read(entry)
        if not needed:
            continue
        for file, columns in file_columns(dataset):
            missing = [name for name in needed if name not in columns]
            if missing:
                problems.append(
                    f"{label_of(kind, index, entry)}: {printable(file)} has no column "
                    f"{missing[0]!r}, which type {printable(repr(entry.get('type')))} reads "
                    f"(its columns: {', '.join(map(str, columns)) or 'none'})")
                break  # one file per entry says it
    return problems


def check_columns(mix, plain: Mapping, tests=None) -> None:
    """``InputError`` naming each entry, file and column its prompt format misses (of the
    ``tests`` mixture's ``test_datasets:`` entries too)."""
    raise_all(column_problems(mix, plain)
              + (column_problems(tests, plain, "test_datasets") if tests is not None else []))


def file_columns(dataset) -> list[tuple[str, list]]:
    """(file URL, its columns) of a ``StreamingDataset`` of raw files: every Parquet and Arrow
    file from its schema, the first JSON Lines file from its first row; [] for shards."""
    table = getattr(dataset, "shards", None)
    if not isinstance(table, UnitTable):
        return []
    found = []
    first_lines = None
    for index, (file, metadata) in enumerate(zip(table.files, table.metadata, strict=True)):
        if file.format != "jsonl":
            # (Parquet and Arrow declare them: never None)
            found.append((file.url, FORMATS[file.format].columns(FileUnits([], metadata)) or []))
        elif first_lines is None:
            first_lines = index
    if first_lines is not None:
        unit = int((table.file == first_lines).argmax())
        options = dataset.read_options
        rows = table.read(unit, Access(options.opener, options.timeout))
        try:
            first = rows.rows(0, 1) if len(rows) else []
        finally:
            getattr(rows, "close", lambda: None)()
        if first:
            found.append((table.files[first_lines].url, list(first[0])))
    return found
