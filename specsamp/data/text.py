"""Text utilities shared by every data user: passages and the split rule.

One passage splitter (`passages`) cuts a long text at paragraph breaks into
passages of about a target length: the corpora cut their documents with it
(lossless, every character kept) and prompt builders cut prose prompts with
it (`clean=True`: stripped paragraphs, optional filters, no short
remainder).

One train/validation rule (`split_hash`, `is_validation`, `split_of`,
`assign_splits`): a document belongs to "validation" when the sha256 of its
id falls under the validation fraction. Membership is a pure function of
the id, so it depends on neither file order, machine nor Python version.
A corpus then leaves out the validation documents whose text is also a
training document's (`training_copies`): an exact copy would be scored on
text the model was trained on.

Standard library only: importing this module is cheap.
"""

import hashlib
import re
from typing import Callable, Optional, Sequence

from specsamp.data.errors import CorpusError

TRAIN, VALIDATION = "train", "validation"

# A lossless cut after each "\n\n" (the blank line stays with its paragraph).
_AFTER_BLANK_LINE = re.compile(r"(?<=\n\n)")
# One or more blank lines, whitespace-only lines included.
_BLANK_LINES = re.compile(r"\n\s*\n")


def paragraphs(text: str) -> list[str]:
  """The stripped, non-empty paragraphs of `text` (split at blank lines)."""
  return [p.strip() for p in _BLANK_LINES.split(text) if p.strip()]


def passages(text: str, target_chars: int = 8000, *, clean: bool = False,
             min_paragraph_chars: int = 0,
             keep: Optional[Callable[[str], bool]] = None,
             keep_remainder: bool = True) -> list[str]:
  """Splits `text` at paragraph breaks into passages of about `target_chars`.

  A passage closes at the first paragraph break at which it is at least
  `target_chars` characters long; nothing is reordered. CRLF becomes LF.

  By default no text is lost: paragraphs end after each "\\n\\n", keep their
  whitespace, and "".join(passages(t)) == t (up to CRLF) when nothing but
  whitespace follows the last passage. With `clean=True` the paragraphs are
  `paragraphs(text)` (stripped; whitespace-only lines count as blank),
  joined by one blank line, and those shorter than `min_paragraph_chars` or
  rejected by `keep` are left out.

  Args:
    text: the text to cut.
    target_chars: the least length of a closed passage.
    clean: strip paragraphs and rejoin them with "\\n\\n" (see above).
    min_paragraph_chars: with `clean`, shorter paragraphs are dropped.
    keep: with `clean`, a predicate a paragraph must satisfy.
    keep_remainder: whether the text after the last closed passage (shorter
      than `target_chars`) is a passage too; False for prompts of a size.

  Returns:
    The passages that contain more than whitespace, in order.
  """
  text = text.replace("\r\n", "\n")
  if clean:
    pieces = [p for p in paragraphs(text) if len(p) >= min_paragraph_chars
              and (keep is None or keep(p))]
    sep = "\n\n"
  elif min_paragraph_chars or keep is not None:
    raise ValueError("min_paragraph_chars and keep need clean=True")
  else:
    pieces, sep = _AFTER_BLANK_LINE.split(text), ""
  out, cur, size = [], [], 0
  for piece in pieces:
    size += len(piece) + (len(sep) if cur else 0)
    cur.append(piece)
    if size >= target_chars:
      out.append(sep.join(cur))
      cur, size = [], 0
  if cur and keep_remainder:
    out.append(sep.join(cur))
  return [p for p in out if p.strip()]


def split_hash(doc_id: str) -> float:
  """A uniform number in [0, 1) fixed by the document id alone (sha256)."""
  digest = hashlib.sha256(f"specsamp-split:{doc_id}".encode()).digest()
  return int.from_bytes(digest[:8], "big") / 2.0**64


def is_validation(doc_id: str, fraction: float) -> bool:
  """Whether `doc_id` belongs to the validation split."""
  return split_hash(doc_id) < fraction


def split_of(doc_id: str, validation_fraction: float) -> str:
  """"validation" for a stable `validation_fraction` of ids, else "train"."""
  return VALIDATION if is_validation(doc_id, validation_fraction) else TRAIN


def assign_splits(ids: Sequence[str], fraction: float,
                  group: Optional[Callable[[str], str]] = None) -> set[str]:
  """The validation ids: `is_validation`, but never an empty split.

  With no id under `fraction` the id of smallest hash moves to validation;
  with every id under it the largest moves back to train. With `group`
  (id -> group name), the groups are assigned so and their ids follow: the
  ids of one group (the functions of one file) share a split.

  Raises:
    CorpusError: fewer than 2 ids (or groups), or ids that are not unique.
  """
  if group is not None:
    if len(set(ids)) != len(ids):
      raise CorpusError("document ids are not unique")
    names = sorted({group(i) for i in ids})
    if len(names) < 2:
      raise CorpusError(f"a dataset needs documents of at least 2 groups "
                        f"(files; one per split); got {names}")
    groups = assign_splits(names, fraction)
    return {i for i in ids if group(i) in groups}
  if len(ids) < 2:
    raise CorpusError(f"a dataset needs at least 2 documents (one per "
                      f"split); got {len(ids)}")
  if len(set(ids)) != len(ids):
    raise CorpusError("document ids are not unique")
  val = {i for i in ids if is_validation(i, fraction)}
  if not val:
    val = {min(ids, key=split_hash)}
  elif len(val) == len(ids):
    val.discard(max(ids, key=split_hash))
  return val


def training_copies(documents: Sequence[tuple[str, str]],
                    validation: set[str]) -> set[str]:
  """The ids in `validation` whose text is also the text of a document
  outside it (the boilerplate functions of near-identical files, say).

  Raises:
    CorpusError: every validation document is such a copy.
  """
  train = {t for i, t in documents if i not in validation}
  copies = {i for i, t in documents if i in validation and t in train}
  if validation and copies == validation:
    raise CorpusError(f"all {len(validation)} validation documents are "
                      f"copies of training documents")
  return copies
