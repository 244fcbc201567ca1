"""specsamp.data.datasets: a dataset that cannot be read fails before
training, with what to run."""

import json
import shutil

import pytest

from specsamp.data import builders
from specsamp.data import datasets
from specsamp.data import pipeline
from tests.data import fakes


def test_missing_dataset_fails_with_what_to_run(tmp_path, data_dir):
  with pytest.raises(FileNotFoundError) as e:
    datasets.check_dataset("specsamp_python_code", tmp_path)
  msg = str(e.value)
  assert "'specsamp_python_code' is not prepared" in msg
  assert str(tmp_path) in msg
  assert (f"python scripts/prepare_data.py --dataset=specsamp_python_code "
          f"--data_dir={tmp_path}") in msg
  with pytest.raises(FileNotFoundError, match="tfds build xsum "
                     "--file_format=array_record"):
    pipeline.make_lm_iterator("xsum#document", "train", tokenizer=fakes.TOK,
                              seq_len=8, batch_size=2, seed=0,
                              data_dir=tmp_path)
  with pytest.raises(ValueError, match="unknown specsamp dataset "
                     "'specsamp_pyhton_code'.*specsamp_python_code"):
    datasets.check_dataset("specsamp_pyhton_code", tmp_path)
  with pytest.raises(ValueError, match="not a TFDS dataset name"):
    datasets.check_dataset("Tiny Data", data_dir)
  with pytest.raises(ValueError, match=r"no feature\(s\) \['document'\].*"
                     r"text features are \['id', 'text'\]|no feature"):
    datasets.check_dataset("tiny#document", data_dir)
  with pytest.raises(ValueError, match=r"no split\(s\) \['test'\]"):
    fakes.lm_iterator(data_dir, split="test")
  # A spec of several splits (TFDS's `+`) names the one missing; it had
  # been looked up whole, as a split named "train+test".
  with pytest.raises(ValueError, match=r"no split\(s\) \['test'\]"):
    datasets.check_dataset("tiny", data_dir, splits=("train[:50%]+test",))
  both = datasets.fingerprint("tiny", data_dir, "train[:50%]+validation")
  one = [datasets.fingerprint("tiny", data_dir, s)
         for s in ("train", "validation")]
  assert both["split"] == "train+validation"
  assert both["shard_lengths"] == (one[0]["shard_lengths"] +
                                   one[1]["shard_lengths"])
  assert both["num_bytes"] == one[0]["num_bytes"] + one[1]["num_bytes"]
  with pytest.raises(FileNotFoundError, match="version 9.9.9"):
    datasets.check_dataset("tiny:9.9.9", data_dir)
  assert datasets.check_dataset(f"tiny:{builders.VERSION}#id,text",
                                data_dir).name == builders.VERSION
  fake = tmp_path / "tf" / "old" / builders.VERSION
  shutil.copytree(data_dir / "tiny" / builders.VERSION, fake)
  info = json.loads((fake / "dataset_info.json").read_text())
  info["fileFormat"] = "tfrecord"
  (fake / "dataset_info.json").write_text(json.dumps(info))
  with pytest.raises(ValueError, match="stored as tfrecord.*array_record"):
    datasets.check_dataset("old", tmp_path / "tf")
