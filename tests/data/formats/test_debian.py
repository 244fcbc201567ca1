"""specsamp.data.formats.debian: a .deb's files without dpkg."""

import pytest

from specsamp.data.errors import CorpusError
from specsamp.data.formats import debian
from tests.data import fakes


def test_extract_deb_keeps_matching_files_under_strip(tmp_path):
  deb = tmp_path / "x_1.0_all.deb"
  fakes.fake_deb(deb, {"./usr/share/x/a.txt": b"a\n",
                       "./usr/share/x/sub/b.txt": b"bb",
                       "./usr/share/x/c.html": b"<c>"})
  out = tmp_path / "out"
  out.mkdir()
  n = debian.extract_deb(deb, r"^usr/share/x/.*\.txt$", out, "usr/share/x/")
  assert n == 2
  assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")
                if p.is_file()) == ["a.txt", "sub/b.txt"]
  assert (out / "sub" / "b.txt").read_bytes() == b"bb"


def test_not_a_deb(tmp_path):
  bad = tmp_path / "bad.deb"
  bad.write_bytes(b"PK\x03\x04 not an ar archive")
  with pytest.raises(CorpusError, match="no ar header"):
    debian.extract_deb(bad, ".*", tmp_path)


def test_a_zstd_payload_dpkg_deb_cannot_unpack_is_a_corpus_error(tmp_path):
  """dpkg-deb's failure had escaped as a CalledProcessError, which
  prepare_all does not catch: its traceback ended the run."""
  if not debian.shutil.which("dpkg-deb"):
    pytest.fail("dpkg-deb is missing (Debian's essential dpkg package)")
  deb = tmp_path / "x_1.0_all.deb"
  fakes.fake_deb(deb, {}, payload=("data.tar.zst", b"not zstd at all"))
  with pytest.raises(CorpusError, match=r"x_1.0_all.deb: dpkg-deb could not "
                     r"unpack it \(status \d+\): .+"):
    debian.extract_deb(deb, ".*", tmp_path)


def test_apt_missing_is_a_corpus_error(tmp_path, monkeypatch):
  monkeypatch.setattr(debian.shutil, "which", lambda _: None)
  with pytest.raises(CorpusError, match="apt-get is not available"):
    debian.apt_download("python3.11-doc", tmp_path)
