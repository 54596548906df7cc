"""``--data`` names a store's folder: a typo must never make one, of a missing folder or of one that holds
something else. Only ``topics create`` makes a new store."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli_runner import run_main


@pytest.mark.parametrize("command", [["groups", "list"], ["topics", "list"], ["consume", "x", "--until-end"],
                                     ["retention"], ["verify"]])
def test_a_folder_that_holds_no_store_is_refused_and_left_as_it_was(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]) -> None:
    other = tmp_path / "photos"
    other.mkdir()
    (other / "cat.jpg").write_bytes(b"\xff\xd8")
    result = run_main(capsys, other, *command)
    assert result.code == 2 and f"No data folder at {other} (it holds no store)" in result.err
    assert sorted(path.name for path in other.iterdir()) == ["cat.jpg"]


def test_a_file_given_as_the_data_folder_is_named_as_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "notes.txt"
    file.write_text("not a store")
    result = run_main(capsys, file, "topics", "list")
    assert result.code == 2 and f"No data folder at {file} (it is a file)" in result.err


def test_topics_create_makes_a_store_that_the_other_commands_then_take(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    new = tmp_path / "new"
    assert run_main(capsys, new, "topics", "create", "t").code == 0
    listed = run_main(capsys, new, "topics", "list")
    assert listed.code == 0 and listed.out.split() == ["t"]


def test_a_remote_uri_of_no_known_kind_is_refused_with_the_kinds_allowed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    assert run_main(capsys, data, "topics", "create", "t").code == 0
    result = run_main(capsys, data, "--remote", "bogus://x", "topics", "list")
    assert result.code == 2 and "s3://bucket/prefix or file:///mount/prefix. Nothing was changed." in result.err
