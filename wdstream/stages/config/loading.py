"""Config files read from storage, YAML (PyYAML's safe loader, libyaml when built with it) or
JSON, within bounds: the "config" size limit while reading, ``limits.MAX_DEPTH`` levels of
nesting before a parser descends, and for YAML at most ``MAX_YAML_VALUES`` values with every
alias expanded, counted from the parser's events (no "billion laughs", no alias cycles).
Every failure is an ``InputError`` naming the file (docs/security.md)."""

from __future__ import annotations

from typing import Any

from wdstream.errors import InputError, WdstreamError
from wdstream.limits import MAX_DEPTH, json_loads
from wdstream.sources.objects import read_bytes

# Values (scalars, lists, mappings; keys count) in a config with its aliases expanded: a
# trainer config with a thousand datasets holds some 10,000.
MAX_YAML_VALUES = 100_000


class ConfigLimitError(ValueError):
    """A YAML document past a bound of ``check_yaml`` (a ``ValueError``, as a
    constructor's)."""


def load_config_file(url: str) -> dict:
    """The document in a YAML (``.yaml``/``.yml``, PyYAML needed) or JSON file."""
    try:
        text = read_bytes(url, limit="config").decode("utf-8")
    except (WdstreamError, OSError, UnicodeDecodeError) as error:
        raise InputError(f"{url}: cannot read the config: {error}") from error
    if url.endswith(".json"):
        try:
            return json_loads(text)
        except ValueError as error:  # JSONDecodeError, NestingError, an int of 5,000 digits
            raise InputError(f"{url}: not valid JSON: {error}") from error
    try:
        import yaml
    except ImportError as error:
        raise InputError(f"{url}: reading YAML needs PyYAML (pip install 'wdstream[llm]'); "
                         "or pass a dict or a .json file") from error
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser when built
    try:
        check_yaml(text, loader)
        return yaml.load(text, Loader=loader)  # a safe loader: no tag builds an object
    except (yaml.YAMLError, ValueError) as error:  # ValueError: a constructor's (a date)
        raise InputError(f"{url}: not valid YAML: {error}") from error


def check_yaml(text: str, loader: type) -> None:
    """``ConfigLimitError`` when the YAML ``text`` nests deeper than ``MAX_DEPTH``, holds more
    than ``MAX_YAML_VALUES`` values with its aliases expanded, or has an alias to a value
    that contains it; read from the parser's events (each value counted once, an alias as
    the values of its anchor), before anything is composed."""
    import yaml

    values: dict[str, int] = {}  # anchor -> the values of its node, aliases expanded
    below: list[list[Any]] = [[None, 0]]  # per open collection (first: the stream): its anchor, values so far
    for event in yaml.parse(text, Loader=loader):
        if isinstance(event, yaml.CollectionStartEvent):
            if len(below) > MAX_DEPTH:
                raise ConfigLimitError(f"nested deeper than {MAX_DEPTH} levels")
            below.append([event.anchor, 0])
            continue
        if isinstance(event, yaml.CollectionEndEvent):
            anchor, inner = below.pop()
            count = 1 + inner
        elif isinstance(event, yaml.ScalarEvent):
            anchor, count = event.anchor, 1
        elif isinstance(event, yaml.AliasEvent):
            if any(event.anchor == node[0] for node in below):
                raise ConfigLimitError("an alias to a value that contains it")
            anchor, count = None, values.get(event.anchor, 0)  # undefined: the loader says
        else:
            continue  # the stream's and documents' starts and ends
        if anchor is not None:
            values[anchor] = count
        below[-1][1] += count
        if below[-1][1] > MAX_YAML_VALUES:
            raise ConfigLimitError(f"more than {MAX_YAML_VALUES:,} values with its aliases "
                                   "expanded")
