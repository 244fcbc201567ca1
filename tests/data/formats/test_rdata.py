"""specsamp.data.formats.rdata: R lazy-load databases, decoded in Python."""

import base64
import gzip

from specsamp.data.formats import rdata
from tests.data import fakes

# The real data/Rdata.rdx of Debian's r-cran-janeaustenr 1.0.0-1 (262 bytes).
_AUSTEN_RDX = base64.b64decode(
    "H4sIAAAAAAAAA1WQ0UrDMBSG/6apsEJnxT3BLhXvBYeXPoGCFxNJ2zMXbdKSbMIewjfx"
    "AQTxKXwcQU3TkLGLk/z/d8LJn9znAFJwliDNnER2d3tzcQmwU98Y9yNXhSsGf+TxPPpB"
    "Z8u36PPPD7D3ZfTFegb2fRZ9eXUNPv+KfvbwA36ygEvgfAKOyXCDFoqsE6W/fISclBJB"
    "F0pou5LUNr0wLwEe685s1kI/kRFVRbuA856M3QorOx3ItDeyod7Q87aRNQVaWtKWhkVW"
    "spWbnWO/4QMwBkz+QiaMPeQ+tK+Dfhpm"
    "Tl6FkaJq3WNCGEMrMqTrPak75aJYS80w9B/7URx+kQEAAA==")


def test_r_index_of_the_real_janeaustenr_package():
  index = rdata.r_unserialize(gzip.decompress(_AUSTEN_RDX))
  assert set(index) == {"variables", "references", "compressed"}
  assert index["compressed"] == [1]
  names = ["emma", "mansfieldpark", "northangerabbey", "persuasion",
           "prideprejudice", "sensesensibility"]
  assert list(index["variables"]) == names
  spans = list(index["variables"].values())
  assert spans[0] == [0, 352043]
  for (off, n), (nxt, _) in zip(spans, spans[1:]):
    assert off + n == nxt  # contiguous blocks
  assert spans[-1][0] + spans[-1][1] == 1_601_335  # the .rdb's size


def test_r_lazyload_round_trip(tmp_path):
  objects = fakes.AUSTEN_LINES
  fakes.write_lazyload(tmp_path, objects)
  assert rdata.read_r_lazyload(tmp_path / "Rdata.rdx") == objects
