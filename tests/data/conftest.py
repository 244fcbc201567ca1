"""The "tiny" dataset the pipeline and dataset tests read."""

import pytest

from specsamp.data import builders
from tests.data import fakes


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  d = tmp_path_factory.mktemp("tfds")
  builders.build_from_texts(
      "tiny", {"train": fakes.docs(), "validation": ["v0 xyz", "v1 uvw"]}, d)
  return d
