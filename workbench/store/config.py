"""`workbench.toml`: the user's settings, read from the store folder and the working directory
(later folders win).

    [aliases]
    loss = ["my_model/train_xent"]   # globs over tags (workbench.store.aliases)

    [ingest]
    max_tags_per_run = 10000         # past this many distinct tags, a run's further tags are
                                     # not stored and the file gets a problem row

A file that is not valid TOML, or a setting of the wrong type, is a WorkbenchError naming the
file and the line, for every command that reads it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.errors import WorkbenchError

if TYPE_CHECKING:
    import tomllib

CONFIG_FILE = "workbench.toml"
DEFAULT_MAX_TAGS_PER_RUN = 10_000


class ConfigError(WorkbenchError):
    """A `workbench.toml` (or other settings file) that cannot be used as written."""


def read_toml(path: Path) -> dict[str, Any]:
    """The parsed file; ConfigError naming the file and line for anything unreadable."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte at offset {e.start}); fix or remove it") from None
    except OSError as e:
        raise ConfigError(
            f"{path}: cannot be read ({e.strerror}); fix its permissions or remove it"
        ) from None
    import tomllib  # only where a settings file exists (a read of the store loads none)

    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}, line {toml_error_line(e, text)}: {toml_error_text(e)}; fix it") from None


def toml_error_line(e: tomllib.TOMLDecodeError, text: str) -> int:
    """The 1-based line of a TOML error (tomllib says it in the message; "end of document" is
    the last line)."""
    if lineno := getattr(e, "lineno", None):  # Python 3.14 and later
        return int(lineno)
    if m := re.search(r"at line (\d+)", str(e)):
        return int(m.group(1))
    return max(1, len(text.splitlines()))


def toml_error_text(e: tomllib.TOMLDecodeError) -> str:
    """What is wrong, without tomllib's position (said as a line already)."""
    return re.sub(r"\s*\((?:at line \d+, column \d+|at end of document)\)$", "", str(e).splitlines()[0])


def line_of(path: Path, pattern: str) -> int | None:
    """The first line of the file matching `pattern` (a regex), to point a message at a key."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    rx = re.compile(pattern)
    return next((i for i, line in enumerate(lines, 1) if rx.search(line)), None)


def settings_folders(store_root: Path) -> tuple[Path, ...]:
    """The folders whose `workbench.toml` count, in order: the store's, then the working folder
    (not when it was removed under this process: its settings went with it)."""
    try:
        return (store_root, Path.cwd())
    except OSError:
        return (store_root,)


def config_files(*dirs: Path) -> list[Path]:
    return [Path(d) / CONFIG_FILE for d in dirs if (Path(d) / CONFIG_FILE).is_file()]


def section(name: str, *dirs: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Each config file's `[name]` table (empty when absent), with its file, in order."""
    out = []
    for f in config_files(*dirs):
        table = read_toml(f).get(name, {})
        if not isinstance(table, dict):
            where = line_of(f, rf"^\s*{re.escape(name)}\s*=")
            raise ConfigError(f"{f}, line {where or 1}: {name} must be a table ([{name}]); fix it")
        out.append((f, table))
    return out


def max_tags_per_run(*dirs: Path) -> int:
    """`[ingest] max_tags_per_run`, else the default."""
    value = DEFAULT_MAX_TAGS_PER_RUN
    for f, table in section("ingest", *dirs):
        if "max_tags_per_run" in table:
            v = table["max_tags_per_run"]
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                where = line_of(f, r"^\s*max_tags_per_run\s*=")
                raise ConfigError(
                    f"{f}, line {where or 1}: max_tags_per_run must be a whole number of at least 1, got {v!r}"
                )
            value = v
    return value
