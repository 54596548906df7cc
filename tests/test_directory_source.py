"""The directory source on its own: a folder that is not there, and a file cut shorter than what was read of it,
stop the source with an error saying what is wrong and what to do, instead of reading nothing, or skipping the
file's new lines, without a word."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledgerview.service.config import SourceSection
from ledgerview.service.sources import DirectorySource, SourceFileChangedError, SourceFolderMissingError


def _source(folder: Path) -> DirectorySource:
    return DirectorySource(SourceSection(name="drops", type="directory", topic="prices", path=str(folder)))


def test_a_folder_that_is_not_there_is_named_instead_of_read_as_empty(tmp_path: Path) -> None:
    source = _source(tmp_path / "incomming")
    with pytest.raises(SourceFolderMissingError, match=r"Source 'drops': its path .*incomming does not exist\. "
                                                        r"Create the folder or correct the source's path"):
        source.read(source.initial_position())
    (tmp_path / "a-file").write_text("k\tv\n")
    source = _source(tmp_path / "a-file")
    with pytest.raises(SourceFolderMissingError, match="is not a folder"):
        source.read(source.initial_position())


def test_a_file_cut_shorter_than_what_was_read_stops_the_source(tmp_path: Path) -> None:
    path = tmp_path / "001.tsv"
    path.write_text("k1\tv1\nk2\tv2\n")
    source = _source(tmp_path)
    batch = source.read(source.initial_position())
    assert batch is not None and batch.messages["value"].to_pylist() == [b"v1", b"v2"]
    assert source.read(batch.next_position) is None  # all read: nothing new
    path.write_text("k3\tv3\n")  # replaced in place by a shorter file
    with pytest.raises(SourceFileChangedError, match=r"001\.tsv is now 6 bytes, but the source had read 12 bytes "
                                                     r"of it: a file must not change once it appears"):
        source.read(batch.next_position)
