"""Config files read from storage, YAML or JSON, within bounds (see docs/security.md):

- at most the "config" size limit (``wdstream.limits``, 16 MiB by default), checked while
  reading;
- nested at most ``limits.MAX_DEPTH`` levels, checked before a recursive parser descends
  (JSON: ``limits.json_loads``; YAML: ``BoundedLoader``, as it composes);
- YAML aliases are allowed (trainer configs share settings with ``&name`` / ``*name`` and
  ``<<: *name``), but the document with every alias expanded holds at most
  ``MAX_YAML_VALUES`` values, counted as it is composed: a "billion laughs" file of a few
  hundred bytes is refused after reading that many values, rather than expanded. An alias
  to a value that contains it (a cycle) is refused.

Every failure is an ``InputError`` naming the file.
"""

from __future__ import annotations

import functools

from wdstream.errors import InputError, WdstreamError
from wdstream.limits import MAX_DEPTH, json_loads
from wdstream.sources.objects import read_bytes

# Values (scalars, lists, mappings; keys count) in a config with its aliases expanded: a
# trainer config with a thousand datasets holds some 10,000.
MAX_YAML_VALUES = 100_000


class ConfigLimitError(ValueError):
    """A YAML document past a bound of the loader (a ``ValueError``, as a constructor's)."""


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
    loader = bounded_loader()(text)
    try:
        return loader.get_single_data()
    except (yaml.YAMLError, ValueError) as error:  # ValueError: a constructor's (a date)
        raise InputError(f"{url}: not valid YAML: {error}") from error
    finally:
        loader.dispose()


@functools.cache
def bounded_loader() -> type:
    """``BoundedLoader``: PyYAML's ``SafeLoader`` that counts, as it composes the document,
    how deep it nests and how many values it holds with its aliases expanded."""
    import yaml

    class BoundedLoader(yaml.SafeLoader):
        def __init__(self, stream):
            super().__init__(stream)
            self._below: list[int] = []  # per node being composed: the values under it so far
            self._values: dict[int, int] = {}  # id(node) -> values, its aliases expanded

        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                node = super().compose_node(parent, index)
                if id(node) not in self._values:
                    raise ConfigLimitError("an alias to a value that contains it")
                self._count(self._values[id(node)])
                return node
            if len(self._below) >= MAX_DEPTH:
                raise ConfigLimitError(f"nested deeper than {MAX_DEPTH} levels")
            self._below.append(0)
            node = super().compose_node(parent, index)
            values = 1 + self._below.pop()
            self._values[id(node)] = values
            self._count(values)
            return node

        def _count(self, values: int) -> None:
            if self._below:
                self._below[-1] += values
            if values > MAX_YAML_VALUES or self._below and self._below[-1] > MAX_YAML_VALUES:
                raise ConfigLimitError(f"more than {MAX_YAML_VALUES:,} values with its "
                                       "aliases expanded")

    return BoundedLoader
