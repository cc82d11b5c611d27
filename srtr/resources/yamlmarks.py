"""YAML text → plain Python data plus the line of every key and list item.

Only `loading.py` calls this. pyyaml's safe composer builds the node graph; we convert it
ourselves so that each value's path (`("services", 2, "placement", "pool")`) maps to the line
it was written on, which is what turns a validation error into `recipe.yaml:14: ...`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

Path = tuple[str | int, ...]

# An alias shares its node with the anchor, so the graph can be tiny while the data it stands
# for is huge (the "billion laughs" recipe). Counting the expanded size with memoisation is
# exact and cheap; a recipe for 1,000 nodes and 20 services is a few thousand values.
MAX_EXPANDED_VALUES = 200_000


class YamlProblem(Exception):
    """The text is not a recipe-shaped YAML document. Carries a line (1-based) or 0."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line = line
        self.message = message


@dataclass
class Marked:
    """Parsed data and the line of each path in it."""

    data: Any
    lines: dict[Path, int] = field(default_factory=dict)

    def line_of(self, path: Path) -> int:
        """The line of `path`, or of its nearest ancestor that has one (1 for the root)."""
        # A short form (`metrics: {port: 0}` for a one-item list) has no index in the YAML:
        # drop list indexes that were never written before walking up.
        written: list[str | int] = []
        for part in path:
            if isinstance(part, int) and (*written, part) not in self.lines:
                continue
            written.append(part)
        for end in range(len(written), 0, -1):
            line = self.lines.get(tuple(written[:end]))
            if line is not None:
                return line
        return self.lines.get((), 1)


def _expanded_size(node: yaml.Node, memo: dict[int, int]) -> int:
    key = id(node)
    if key in memo:
        return memo[key]
    memo[key] = 1  # guards recursive aliases, which safe YAML cannot build anyway
    size = 1
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            size += _expanded_size(k, memo) + _expanded_size(v, memo)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            size += _expanded_size(item, memo)
    memo[key] = size
    return size


class YamlInt(int):
    """An int that remembers how it was written (`0755`, `1_000`), for text fields."""

    yaml_text: str


class YamlFloat(float):
    """A float that remembers how it was written (`1.10`), for text fields."""

    yaml_text: str


def _remember(value: Any, node: yaml.ScalarNode) -> Any:
    # Numbers in argv and env are text to the user: keep what they typed, not int('0755').
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        marked: Any = YamlInt(value)
    elif isinstance(value, float):
        marked = YamlFloat(value)
    else:
        return value
    marked.yaml_text = node.value
    return marked


BOOL_HINT = "YAML reads yes/no/on/off/true/false as booleans; quote it"


class _Converter:
    def __init__(self) -> None:
        self.constructor = yaml.constructor.SafeConstructor()
        self.lines: dict[Path, int] = {}
        self.problems: list[YamlProblem] = []

    def convert(self, node: yaml.Node, path: Path) -> Any:
        if isinstance(node, yaml.MappingNode):
            explicit = sum(1 for k, _ in node.value if k.tag != "tag:yaml.org,2002:merge")
            self.constructor.flatten_mapping(node)  # resolves `<<:` merge keys
            merged = len(node.value) - explicit  # merged entries come first; explicit ones win
            result: dict[str, Any] = {}
            own: set[str] = set()
            for position, (key_node, value_node) in enumerate(node.value):
                line = key_node.start_mark.line + 1
                key = self.constructor.construct_object(key_node, deep=True)
                if not isinstance(key, str):
                    hint = f" ({BOOL_HINT})" if isinstance(key, bool) else ""
                    self.problems.append(YamlProblem(line, f"key {key!r} must be a string{hint}"))
                    continue
                if position >= merged:
                    if key in own:
                        self.problems.append(YamlProblem(line, f"duplicate key '{key}'"))
                        continue
                    own.add(key)
                self.lines[(*path, key)] = line
                result[key] = self.convert(value_node, (*path, key))
            return result
        if isinstance(node, yaml.SequenceNode):
            items = []
            for index, item in enumerate(node.value):
                self.lines[(*path, index)] = item.start_mark.line + 1
                items.append(self.convert(item, (*path, index)))
            return items
        value = self.constructor.construct_object(node, deep=True)
        return _remember(value, node) if isinstance(node, yaml.ScalarNode) else value


def parse(text: str) -> Marked:
    """Parse one YAML document into data and line marks.

    Raises:
        YamlProblem: syntax errors, several documents, alias blow-ups, duplicate keys.
    """
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.composer.ComposerError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else 0
        raise YamlProblem(line, f"invalid YAML: {exc.problem}") from None
    except yaml.MarkedYAMLError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else 0
        raise YamlProblem(line, f"invalid YAML: {exc.problem or exc.context}") from None
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, max(exc.position, 0)) + 1
        raise YamlProblem(
            line,
            f"invalid YAML: unacceptable character #x{exc.character:04x} (control "
            "characters are not allowed)"
            if isinstance(exc.character, int)
            else f"invalid YAML: {exc.reason}",
        ) from None
    except yaml.YAMLError as exc:
        raise YamlProblem(0, "invalid YAML: " + " ".join(str(exc).split())) from None
    if root is None:
        raise YamlProblem(1, "the recipe is empty; it must be a mapping with at least `name`")
    size = _expanded_size(root, {})
    if size > MAX_EXPANDED_VALUES:
        raise YamlProblem(
            root.start_mark.line + 1,
            f"the recipe expands to more than {MAX_EXPANDED_VALUES:,} values through YAML "
            "anchors and aliases; refusing to load it",
        )
    if not isinstance(root, yaml.MappingNode):
        raise YamlProblem(
            root.start_mark.line + 1,
            "the recipe must be a mapping (key: value), not a "
            + ("list" if isinstance(root, yaml.SequenceNode) else "scalar"),
        )
    converter = _Converter()
    try:
        data = converter.convert(root, ())
    except yaml.constructor.ConstructorError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else 0
        raise YamlProblem(line, f"invalid YAML: {exc.problem}") from None
    if converter.problems:
        raise converter.problems[0]
    converter.lines[()] = root.start_mark.line + 1
    return Marked(data=data, lines=converter.lines)
