"""The loading rules: files, encodings, YAML syntax, duplicate keys, aliases, depth, floats."""

from __future__ import annotations

import os
import time

import pytest
from conftest import spec_yaml_blocks
from hypothesis import given, settings
from hypothesis import strategies as st

from mf_config import ConfigError, load_config
from mf_config.yaml_source import (
    MAX_FILE_BYTES,
    MAX_MAPPING_DEPTH,
    MAX_NESTING_DEPTH,
    MAX_VALUES,
    UnreadableFile,
    dump_text,
    load_text,
)

SKELETON = spec_yaml_blocks()[0]


def only_issue(exc: pytest.ExceptionInfo[ConfigError]):
    assert len(exc.value.errors) == 1, exc.value.errors
    return exc.value.errors[0]


def write(tmp_path, text: str | bytes, name: str = "train.yaml"):
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def test_missing_file_names_it(tmp_path) -> None:
    with pytest.raises(UnreadableFile) as exc:
        load_config(tmp_path / "nope.yaml")
    issue = only_issue(exc)
    assert issue.file == str(tmp_path / "nope.yaml") and "file not found" in issue.message
    assert str(issue) == f"{tmp_path / 'nope.yaml'}: file not found"


def test_directory_is_not_a_config(tmp_path) -> None:
    with pytest.raises(UnreadableFile) as exc:
        load_config(tmp_path)
    assert "is a directory" in only_issue(exc).message


@pytest.mark.parametrize(("path", "message"), [
    ("/dev/zero", "/dev/zero: is not a regular file (a device, a pipe or a socket); give a "
                  "YAML file"),
    ("fifo.yaml", "fifo.yaml: is not a regular file (a device, a pipe or a socket); give a "
                  "YAML file"),
    ("huge.yaml", "huge.yaml: is larger than 64 MiB, far more than a configuration file; give "
                  "the train.yaml")])
def test_a_file_that_is_no_configuration_is_not_read_whole(tmp_path, monkeypatch, path,
                                                           message) -> None:
    """The read is bounded: a device or a named pipe is never read (nor waited for), a file
    past the limit only to it."""
    monkeypatch.chdir(tmp_path)
    os.mkfifo("fifo.yaml")  # no writer: a plain open would wait for ever
    with open("huge.yaml", "wb") as huge:
        huge.truncate(MAX_FILE_BYTES + 1)  # sparse: costs nothing on disk
    with pytest.raises(UnreadableFile) as exc:
        load_config(path)
    assert str(only_issue(exc)) == message


def test_non_utf8_names_line_and_byte(tmp_path) -> None:
    path = write(tmp_path, "training:\n  steps: 10\n# caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    issue = only_issue(exc)
    assert issue.line == 3 and "not UTF-8" in issue.message and "0xe9" in issue.message
    assert issue.file == str(path)


def test_utf8_bom_is_accepted(tmp_path) -> None:
    path = write(tmp_path, b"\xef\xbb\xbf" + SKELETON.encode("utf-8"))
    assert load_config(path).training.global_batch_size == 8


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n"])
def test_empty_file(tmp_path, text: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(write(tmp_path, text))
    assert "the file is empty" in only_issue(exc).message


@pytest.mark.parametrize(("text", "kind"), [("- a\n- b\n", "a list"), ("42\n", "int 42"),
                                            ("hello\n", "str 'hello'")])
def test_top_level_must_be_a_mapping(tmp_path, text: str, kind: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(write(tmp_path, text))
    assert only_issue(exc).message == f"the top level must be a mapping of sections, got {kind}"


def test_syntax_error_has_line_and_column(tmp_path) -> None:
    path = write(tmp_path, "training:\n  steps: 10\n  seed: [1, 2\nmodel: {}\n")
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    issue = only_issue(exc)
    assert issue.line == 4
    assert issue.message.startswith("YAML syntax error:") and "(column 6)" in issue.message
    assert "did not find expected ',' or ']'" in issue.message


def test_tab_indentation_is_a_syntax_error_with_line() -> None:
    with pytest.raises(ConfigError) as exc:
        load_text("training:\n\tsteps: 1\n", "t.yaml")
    assert only_issue(exc).line == 2


def test_duplicate_key_is_an_error_naming_both_lines() -> None:
    text = "training:\n  steps: 10\n  seed: 1\n  steps: 20\n"
    with pytest.raises(ConfigError) as exc:
        load_text(text, "t.yaml")
    issue = only_issue(exc)
    assert issue.line == 4
    assert issue.message == "duplicate key 'steps' in one mapping (first written on line 2)"


def test_duplicate_sections_are_errors_too() -> None:
    with pytest.raises(ConfigError) as exc:
        load_text("training: {}\nmodel: {}\ntraining: {steps: 1}\n")
    assert "duplicate key 'training'" in only_issue(exc).message


def test_every_duplicate_is_reported() -> None:
    with pytest.raises(ConfigError) as exc:
        load_text("a: 1\na: 2\nb: {x: 1, x: 2}\n")
    assert [issue.line for issue in exc.value.errors] == [2, 3]


ALIAS_BOMB = (f"YAML aliases add more than {MAX_VALUES} values to the document (an alias "
              "bomb?); write the values out or use fewer aliases")


def test_alias_bomb_fails_fast() -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for level in range(1, 10):
        previous = f"*a{level - 1}"
        lines.append(f"a{level}: &a{level} [{', '.join([previous] * 10)}]")
    start = time.perf_counter()
    with pytest.raises(ConfigError) as exc:
        load_text("\n".join(lines) + "\n", "bomb.yaml")
    assert time.perf_counter() - start < 10  # 10**10 values if expanded; fails long before
    # Copies add 100 (a1), 1,100 (a2), 11,100 (a3) values: a4's pass the limit.
    assert str(only_issue(exc)) == f"bomb.yaml:5: {ALIAS_BOMB}"


@pytest.mark.parametrize(("items", "copies"), [(1000, 100), (1000, 101), (7, 14285),
                                               (7, 14286), (100_000, 1), (100_001, 1)])
def test_only_values_that_aliases_add_count(items: int, copies: int) -> None:
    lines = [f"a: &a [{', '.join(['1'] * items)}]", "b:", *["  - *a"] * copies]
    if items * copies <= MAX_VALUES:
        assert load_text("\n".join(lines) + "\n").data["b"] == [[1] * items] * copies
        return
    with pytest.raises(ConfigError) as exc:
        load_text("\n".join(lines) + "\n", "t.yaml")
    assert str(only_issue(exc)) == f"t.yaml:2: {ALIAS_BOMB}"  # b:, which uses the aliases


def test_merges_count_as_aliases() -> None:
    entries = ", ".join(f"k{i}: {i}" for i in range(1000))
    lines = [f"d: &d {{{entries}}}"] + [f"m{i}: {{<<: *d}}" for i in range(101)]
    with pytest.raises(ConfigError) as exc:
        load_text("\n".join(lines) + "\n", "t.yaml")
    assert str(only_issue(exc)) == f"t.yaml:102: {ALIAS_BOMB}"  # m100's merge: 101,000 values
    assert len(load_text("\n".join(lines[:101]) + "\n").data) == 101


def test_a_large_file_without_aliases_loads() -> None:
    # Five times as many values as aliases may add; none of them is added by an alias.
    rows = MAX_VALUES // 5
    text = "model:\n" + "".join(f"  key_{i}: [{i}, {i + 1}, v{i}, {i / 2}]\n" for i in range(rows))
    model = load_text(text, "big.yaml").data["model"]
    assert len(model) == rows and model[f"key_{rows - 1}"] == [rows - 1, rows, f"v{rows - 1}",
                                                               (rows - 1) / 2]


def test_modest_aliases_are_fine() -> None:
    data = load_text("base: &b {hidden_size: 64}\nmodel: *b\n").data
    assert data["model"] == {"hidden_size": 64}


def test_merge_keys_take_explicit_values_first() -> None:
    text = "defaults: &d {steps: 5, seed: 1}\ntraining:\n  <<: *d\n  seed: 7\n"
    source = load_text(text)
    assert source.data["training"] == {"steps": 5, "seed": 7}
    assert source.lines[("training", "seed")] == 4


def test_mapping_depth_limit() -> None:
    def nested(depth: int) -> str:
        keys = "".join(f"{'  ' * i}k{i}:\n" for i in range(depth - 1))
        return keys + "  " * (depth - 1) + "v: 1\n"

    load_text(nested(MAX_MAPPING_DEPTH))
    with pytest.raises(ConfigError) as exc:
        load_text(nested(MAX_MAPPING_DEPTH + 1))
    assert f"deeper than {MAX_MAPPING_DEPTH}" in only_issue(exc).message


def test_lists_do_not_count_toward_depth() -> None:
    value = load_text("a: [[[[[[[[[[[[1]]]]]]]]]]]]\n").data["a"]
    for _ in range(12):
        value = value[0]
    assert value == 1


TOO_DEEP = (f"nesting deeper than {MAX_NESTING_DEPTH} levels (lists and mappings); a "
            "configuration needs a handful")


def nested_text(kinds: str, block: bool) -> str:
    """`x:` holding one collection per letter of `kinds` (l: list, m: mapping), innermost 1.

    In block style, the collection at nesting level N (the top-level mapping is level 1)
    starts on line N; in flow style everything is on line 1.
    """
    if not block:
        opening = "".join("[" if kind == "l" else "{k: " for kind in kinds)
        return f"x: {opening}1{''.join(']' if kind == 'l' else '}' for kind in reversed(kinds))}\n"
    entries = ["  " * level + ("-" if kind == "l" else "k:") for level, kind in
               enumerate(kinds, 1)]
    return "\n".join(["x:", *entries[:-1], entries[-1] + " 1"]) + "\n"


@st.composite
def container_kinds(draw: st.DrawFn) -> str:
    """Lists and mappings nested around the limit, with no more mappings than allowed."""
    depth = draw(st.integers(MAX_NESTING_DEPTH - 4, MAX_NESTING_DEPTH + 4)) - 1  # - the top
    mappings = draw(st.sets(st.integers(0, depth - 1), max_size=MAX_MAPPING_DEPTH - 1))
    return "".join("m" if level in mappings else "l" for level in range(depth))


@settings(max_examples=60, deadline=None)
@given(kinds=container_kinds(), block=st.booleans())
def test_lists_and_mappings_nest_at_most_max_nesting_depth_together(kinds: str,
                                                                    block: bool) -> None:
    text = nested_text(kinds, block)
    if 1 + len(kinds) <= MAX_NESTING_DEPTH:
        value = load_text(text, "t.yaml").data["x"]
        for kind in kinds:
            value = value[0] if kind == "l" else value["k"]
        assert value == 1
        return
    with pytest.raises(ConfigError) as exc:
        load_text(text, "t.yaml")
    line = MAX_NESTING_DEPTH + 1 if block else 1
    assert str(only_issue(exc)) == f"t.yaml:{line}: {TOO_DEEP}"


@pytest.mark.parametrize("depth", [500, 999, 5000])
@pytest.mark.parametrize(("block", "line"), [(False, 1), (True, MAX_NESTING_DEPTH + 1)])
def test_very_deep_lists_are_one_clear_error(depth: int, block: bool, line: int) -> None:
    # libyaml refuses 1000 levels itself; that is reported with the same message, at the
    # line where it stopped.
    if block and depth >= 999:
        line = 1000
    with pytest.raises(ConfigError) as exc:
        load_text(nested_text("l" * depth, block), "t.yaml")
    assert str(only_issue(exc)) == f"t.yaml:{line}: {TOO_DEEP}"


def test_merge_chains_count_as_nesting() -> None:
    lines = ["a0: &a0 {v: 1}"] + [f"a{i}: &a{i} {{<<: *a{i - 1}}}" for i in range(1, 150)]
    with pytest.raises(ConfigError) as exc:
        load_text("\n".join(lines) + "\n", "t.yaml")
    # a99 (line 100) merges a98, which merges a97, ...: a0 is the 101st level.
    assert str(only_issue(exc)) == f"t.yaml:{MAX_NESTING_DEPTH}: {TOO_DEEP}"
    assert load_text("\n".join(lines[:MAX_NESTING_DEPTH - 1]) + "\n").data["a98"] == {"v": 1}


@pytest.mark.parametrize(("text", "value"), [
    ("1e-5", 1e-5), ("1.e-5", 1e-5), ("1.0e-5", 1e-5), ("1E5", 1e5), ("-2e+3", -2e3),
    ("3.", 3.0), (".5", 0.5), ("1_000.5", 1000.5), ("+.5e1", 5.0),
])
def test_exponent_floats_are_floats(text: str, value: float) -> None:
    parsed = load_text(f"x: {text}\n").data["x"]
    assert parsed == value and isinstance(parsed, float)


@pytest.mark.parametrize(("text", "value"), [
    ("'1e-5'", "1e-5"), ("10", 10), ("0x10", 16), ("1.2.3", "1.2.3"), ("2024-01-01", "2024-01-01"),
    ("e5", "e5"), ("True", True), ("None", "None"), ("null", None), ("~", None),
])
def test_other_scalars_keep_their_yaml_meaning(text: str, value: object) -> None:
    parsed = load_text(f"x: {text}\n").data["x"]
    assert parsed == value and type(parsed) is type(value)


def test_learning_rate_1e_5_loads_as_float(tmp_path) -> None:
    text = SKELETON.replace("learning_rate: 1.e-5", "learning_rate: 1e-5")
    assert "learning_rate: 1e-5" in text
    config = load_config(write(tmp_path, text))
    assert config.lr_scheduler.learning_rate == 1e-5


@pytest.mark.parametrize("text", [
    "x: !!python/object/apply:os.system ['true']\n",
    "x: !!python/name:os.system\n",
    "x: !custom 3\n",
    "x: !!set {a, b}\n",
    "x: !!binary aGk=\n",
    "x: !!timestamp 2001-12-14\n",
    "!!set a: 1\n",
    "x: !!omap [a: 1]\n",
])
def test_no_python_or_custom_tags(text: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_text(text)
    assert only_issue(exc).line == 1


def test_lines_are_recorded_for_entries_and_items() -> None:
    source = load_text("a:\n  b:\n    - 1\n    - c: 2\n")
    assert source.lines[("a",)] == 1
    assert source.lines[("a", "b")] == 2
    assert source.lines[("a", "b", 1)] == 4
    assert source.lines[("a", "b", 1, "c")] == 4


def test_several_documents_are_rejected() -> None:
    with pytest.raises(ConfigError) as exc:
        load_text("a: 1\n---\nb: 2\n")
    assert "YAML syntax error" in only_issue(exc).message


@pytest.mark.parametrize(("text", "message"), [
    ("x: 0b_\n", "cannot read '0b_' as int"),
    ("x: !!float abc\n", "cannot read 'abc' as float"),
    ("x: &a [*a]\n", "a recursive alias"),
    ("x: &a {<<: *a}\n", "a recursive alias"),
])
def test_odd_scalars_and_recursive_aliases_are_config_errors(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_text(text)
    assert message in only_issue(exc).message


def test_dump_quotes_what_the_loader_would_read_as_numbers() -> None:
    data = {"a": "1e5", "b": "-.5", "c": "5", "d": "None", "e": 1e-05, "f": "true", "g": "中文"}
    assert load_text(dump_text(data)).data == data
