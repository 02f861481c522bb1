"""The YAML config of a mount (`avafs mount --config avafs.yaml MOUNTPOINT`).

    namespace:
      imagenet: s3://datasets/imagenet
      scratch: file:///data/scratch
    disk_cache: 100GiB
    metadata_ttl: inf

Errors name the file and line, because a config is usually written by hand and checked in; a
mistyped key gets the nearest known one. A relative `cache_dir` or `log_file` is taken relative
to the config file's directory, so a config checked in beside its cache works from any working
directory.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml

from ..errors import AvafsError
from .options import OPTIONS_BY_NAME, parse_option, size_spelling_warning


def _where(path: Path, node: yaml.Node) -> str:
    return f"{path}, line {node.start_mark.line + 1}"


def _scalar(path: Path, node: yaml.Node) -> Any:
    if not isinstance(node, yaml.ScalarNode):
        raise AvafsError(f"invalid config {_where(path, node)}: expected a single value")
    return yaml.safe_load(yaml.serialize(node))


def check_namespace_name(name: str, where: str) -> None:
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise AvafsError(f"invalid namespace entry {name!r} ({where}): a name must be one "
                         "directory name, without '/'")


def load_config(path: Path, warnings: list[str] | None = None
                ) -> tuple[dict[str, str], dict[str, Any]]:
    """(sources by directory name, option values by name) from a config file; a line for
    each value written in a way that reads two ways (`size_spelling_warning`) is added to
    `warnings`, if given."""
    try:
        text = path.read_text()
    except OSError as error:
        raise AvafsError(f"cannot read config {path}: {error.strerror}") from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark
        line = f", line {mark.line + 1}" if mark else ""
        raise AvafsError(f"bad YAML in {path}{line}: {error.problem}") from None
    if root is None or not isinstance(root, yaml.MappingNode):
        raise AvafsError(f"invalid config {path}: expected a mapping with a 'namespace' key")

    sources: dict[str, str] = {}
    values: dict[str, Any] = {}
    for key_node, value_node in root.value:
        key = str(key_node.value)
        where = _where(path, key_node)
        if key == "namespace":
            if not isinstance(value_node, yaml.MappingNode) or not value_node.value:
                raise AvafsError(f"invalid config {where}: 'namespace' must map directory "
                                 "names to source URLs")
            for name_node, url_node in value_node.value:
                name = str(name_node.value)
                check_namespace_name(name, _where(path, name_node))
                if name in sources:
                    raise AvafsError(f"invalid config {_where(path, name_node)}: "
                                     f"namespace entry {name!r} appears twice")
                sources[name] = str(_scalar(path, url_node))
        elif key in OPTIONS_BY_NAME:
            scalar = _scalar(path, value_node)
            values[key] = parse_option(key, scalar, f"{key!r} in {where}")
            warning = size_spelling_warning(key, scalar, f"{where}: {key}:")
            if warning and warnings is not None:
                warnings.append(warning)
        else:
            near = difflib.get_close_matches(key.replace("-", "_"),
                                             ["namespace", *OPTIONS_BY_NAME], n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            raise AvafsError(f"unknown config key {key!r} ({where}): {hint}keys are 'namespace' "
                             "and mount flags' long names with underscores, e.g. disk_cache")
    if not sources:
        raise AvafsError(f"invalid config {path}: it has no 'namespace' mapping")
    for name in ("cache_dir", "log_file"):
        if values.get(name):
            values[name] = str(path.absolute().parent / Path(values[name]).expanduser())
    return sources, values
