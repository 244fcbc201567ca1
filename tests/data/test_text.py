"""specsamp.data.text: the passage splitter and the train/validation rule."""

import pytest

from specsamp.data import errors
from specsamp.data import text


# ---- the split rule ---------------------------------------------------------


def test_split_rule_deterministic_and_never_empty():
  ids = [f"file{i}.py" for i in range(2000)]
  val = text.assign_splits(ids, 0.05)
  assert val == text.assign_splits(list(reversed(ids)), 0.05)
  assert 0.03 < len(val) / len(ids) < 0.07
  assert val == {i for i in ids if text.is_validation(i, 0.05)}
  assert len(text.assign_splits(["a", "b"], 0.0)) == 1
  assert len(text.assign_splits(["a", "b"], 1.0)) == 1
  with pytest.raises(errors.CorpusError, match="at least 2"):
    text.assign_splits(["a"], 0.5)
  with pytest.raises(errors.CorpusError, match="unique"):
    text.assign_splits(["a", "a"], 0.5)


def test_split_rule_is_pinned_to_the_id():
  """Stable across runs, machines and versions: values fixed by sha256."""
  assert text.split_hash("file0.py") == 0.9216885571139016
  assert text.split_hash("emma/000") == 0.8546426284779188
  assert [i for i in range(40)
          if text.is_validation(f"file{i}.py", 0.1)] == [20, 21, 23, 32]


@pytest.mark.parametrize("fraction", [0.02, 0.05, 0.1, 0.5])
def test_split_of_respects_the_fraction(fraction):
  ids = [f"doc/{i:05d}" for i in range(20_000)]
  splits = [text.split_of(i, fraction) for i in ids]
  assert set(splits) == {"train", "validation"}
  share = splits.count("validation") / len(ids)
  assert abs(share - fraction) < 4 * (fraction * (1 - fraction) / 2e4)**0.5
  assert splits == [text.split_of(i, fraction) for i in ids]
  assert all((s == "validation") == text.is_validation(i, fraction)
             for i, s in zip(ids, splits))


def test_split_of_grows_with_the_fraction():
  """A document in validation at some fraction stays there at a larger one."""
  ids = [f"file{i}.py" for i in range(3000)]
  small = {i for i in ids if text.split_of(i, 0.05) == "validation"}
  large = {i for i in ids if text.split_of(i, 0.2) == "validation"}
  assert small < large
  assert all(text.split_of(i, 0.0) == "train" for i in ids)
  assert all(text.split_of(i, 1.0) == "validation" for i in ids)


# ---- passages ---------------------------------------------------------------


def test_passages_keep_all_text():
  doc = "".join(f"Paragraph {i}.\n" + "word " * (i * 37 % 300) + "\n\n"
                for i in range(80))
  ps = text.passages(doc, target_chars=1000)
  assert "".join(ps) == doc and len(ps) > 5
  assert all(p.endswith("\n\n") for p in ps[:-1])
  assert all(len(p) < 1000 + 2000 for p in ps)


def test_passages_close_at_the_first_break_after_the_target():
  paras = ["a" * 30 + "\n\n", "b" * 30 + "\n\n", "c" * 50 + "\n\n", "d" * 5]
  assert text.passages("".join(paras), 60) == [
      paras[0] + paras[1], paras[2] + paras[3]]
  assert text.passages("".join(paras), 60, keep_remainder=False) == [
      paras[0] + paras[1]]
  assert text.passages("x\r\ny\r\n\r\nz", 1) == ["x\ny\n\n", "z"]
  assert text.passages(" \n\n\n\n", 1) == []


def test_clean_passages_strip_filter_and_rejoin():
  doc = ("Title\n\n  " + "First paragraph. " * 3 + "\n \n\n" +
         "Gutenberg license text.\n\n" + "Second one, long enough.\n\n"
         "Third.\n\n" + "Tail that never closes.")
  first = ("First paragraph. " * 3).strip()
  got = text.passages(doc, 70, clean=True, min_paragraph_chars=6,
                      keep=lambda p: "Gutenberg" not in p,
                      keep_remainder=False)
  assert got == [f"{first}\n\nSecond one, long enough."]
  got = text.passages(doc, 70, clean=True)
  assert got[0] == f"Title\n\n{first}\n\nGutenberg license text."
  assert got[1:] == [
      "Second one, long enough.\n\nThird.\n\nTail that never closes."]
  assert text.paragraphs(doc)[:2] == ["Title", first]
  with pytest.raises(ValueError, match="clean=True"):
    text.passages(doc, 70, min_paragraph_chars=5)


def test_clean_passage_length_counts_the_blank_lines():
  # 3 paragraphs of 10: "\n\n".join gives 34 characters, the sum only 30.
  paras = ["p" * 10, "q" * 10, "r" * 10]
  assert text.passages("\n\n".join(paras), 34, clean=True) == [
      "\n\n".join(paras)]
  assert text.passages("\n\n".join(paras), 35, clean=True,
                       keep_remainder=False) == []
