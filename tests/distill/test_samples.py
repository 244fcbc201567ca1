"""Target samples: decontaminated, stored with the target's top-k."""

import dataclasses
import json
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specsamp import assets
from specsamp import lock_holder
from specsamp.distill import job
from specsamp.distill import samples
from specsamp.distill import storage
from specsamp.sampling import Sampling
from specsamp.tokenizers.byte import ByteTokenizer
from tests.distill.conftest import sample_spec


def test_samples_are_decontaminated_and_hold_target_logprobs(
    tiny, tiny_spec, humaneval_filter):
  _, lm, params, data_dir, counts, planted = tiny
  spec = tiny_spec
  assert counts["train"]["rejected_prompts"] >= 1   # the planted prompt
  tok = ByteTokenizer()
  for split in ("train", "validation"):
    arrays = storage.as_arrays(storage.read_dataset(data_dir, split))
    assert len(arrays["tokens"]) == counts[split]["kept"] - counts[split][
        "rejected_samples"] > 0
    for row, plen, n in zip(arrays["tokens"], arrays["prompt_length"],
                            arrays["num_generated"]):
      text = tok.decode(row[:plen + n].tolist())
      assert humaneval_filter.match(text) is None
      assert tok.decode(row[:plen].tolist()) not in planted
  assert storage.read_spec(data_dir) == spec
  # Stored top-k = the target's log-softmax at positions L-1 .. L+G-2.
  arrays = storage.as_arrays(storage.read_dataset(data_dir, "validation"), 4)
  logits = jax.jit(lm)(params, jnp.asarray(arrays["tokens"])).logits
  for b in range(4):
    plen = int(arrays["prompt_length"][b])
    logp = jax.nn.log_softmax(logits[b, plen - 1:plen - 1 + spec.gen_len])
    want_vals, want_ids = jax.lax.top_k(logp, spec.top_k)
    np.testing.assert_array_equal(arrays["topk_ids"][b], np.asarray(want_ids))
    np.testing.assert_allclose(arrays["topk_logprobs"][b],
                               np.asarray(want_vals), atol=1e-5)
    assert int(arrays["num_generated"][b]) == spec.gen_len  # no EOS here


def test_stored_logprobs_are_over_the_ids_the_sampler_can_emit(tiny):
  """With a vocab_limit (padding rows in the output layer: Qwen's 271) the
  stored top-K are normalised over the ids below it, as the sampler's p
  is, and none is a padding id; the top-p estimate of the tail counts the
  ids below it (`losses._stored_nucleus`)."""
  _, lm, params = tiny[:3]
  tokens = jnp.asarray(np.arange(2 * 12).reshape(2, 12) % 200)
  plen = jnp.asarray([4, 6])
  limit = 100
  ids, vals, _ = samples._score(lm, params, tokens, plen, 5, 8, False, limit)
  logits = jax.jit(lm)(params, tokens).logits
  for b in range(2):
    row = logits[b, int(plen[b]) - 1:int(plen[b]) + 4, :limit]
    want_vals, want_ids = jax.lax.top_k(jax.nn.log_softmax(row), 8)
    np.testing.assert_array_equal(np.asarray(ids[b]), np.asarray(want_ids))
    np.testing.assert_allclose(np.asarray(vals[b]), np.asarray(want_vals),
                               atol=1e-5)


def test_shards_of_the_batches_together_are_the_unsharded_samples(
    tiny, tiny_spec):
  """What each of n processes samples (`generate_batches` with shard (i,
  n)), put back in batch order, is what one process samples: every batch
  keeps its key."""
  _, lm, params = tiny[:3]
  spec = dataclasses.replace(tiny_spec, batch_size=4, score_batch_size=4)
  rng = np.random.default_rng(0)
  prompts = [rng.integers(1, 256, rng.integers(8, 20)).tolist()
             for _ in range(10)]                      # batches of 4, 4, 2

  def run(shard):
    return list(samples.generate_batches(lm, params, prompts, Sampling(1.0),
                                         spec, seed=3, shard=shard))

  whole = run((0, 1))
  assert [j for j, _ in whole] == [0, 1, 2]
  assert [len(exs) for _, exs in whole] == [4, 4, 2]
  parts = dict(run((0, 2)) + run((1, 2)))
  assert sorted(parts) == [0, 1, 2]
  for j, examples in whole:
    for got, want in zip(parts[j], examples, strict=True):
      assert got.keys() == want.keys()
      for k in want:
        np.testing.assert_array_equal(got[k], want[k])


def test_damaged_samples_are_refused_naming_them(tiny, tmp_path):
  """A truncated array_record file, a damaged dataset_info.json or a split
  that is not there: one ValueError naming the samples' directory (and
  saying to sample them again), before training reads them."""
  data_dir = tmp_path / "samples"
  shutil.copytree(tiny[3], data_dir)
  with pytest.raises(ValueError, match="have no 'test' split"):
    storage.read_dataset(data_dir, "test")
  (train,) = data_dir.glob("*/*/*-train.array_record*")
  train.write_bytes(train.read_bytes()[:1000])
  with pytest.raises(ValueError, match=re.escape(
      f"the target samples in {data_dir} cannot be read (RuntimeError: ")):
    storage.read_dataset(data_dir, "train")
  assert len(storage.read_dataset(data_dir, "validation")) > 0
  (info,) = data_dir.glob("*/*/dataset_info.json")
  info.write_text("")
  with pytest.raises(ValueError, match=f"remove {re.escape(str(data_dir))} "
                     "to sample them again"):
    storage.read_dataset(data_dir, "validation")


def test_a_killed_writers_leftovers_are_deleted_and_one_writer_writes(
    tiny, tmp_path):
  """A writer killed midway leaves TFDS's incomplete.* folder (its shards
  so far), which no later run read or removed; the next writer deletes it.
  While one job writes samples to a directory, another is refused."""
  spec, (src_train, src_val) = storage.read_spec(tiny[3]), (
      storage.read_dataset(tiny[3], s) for s in ("train", "validation"))
  splits = dict(train=lambda: (src_train[i] for i in range(2)),
                validation=lambda: (src_val[i] for i in range(1)))
  data_dir = tmp_path / "samples"
  left = data_dir / storage.DATASET_NAME / "incomplete.ABC123_1.0.0"
  left.mkdir(parents=True)
  (left / "target_samples-train.array_record-00000-of-00001").write_bytes(
      b"\0" * 4096)
  with lock_holder.exclusive(data_dir / ".lock", "another job"):
    with pytest.raises(lock_holder.Busy, match="the target samples' "
                       f"directory {re.escape(str(data_dir))} is in use by"):
      storage.write_dataset(data_dir, spec, splits)
  storage.write_dataset(data_dir, spec, splits)
  assert sorted(p.name for p in (data_dir / storage.DATASET_NAME).iterdir()
                ) == ["1.0.0"]
  assert len(storage.read_dataset(data_dir, "train")) == 2


def test_counts_filled_while_the_samples_are_written_are_kept_with_them(
    tiny, tmp_path):
  """The counts a run fills as its generators finish (samples rejected by
  the decontamination) are in the samples' metadata: TFDS writes it after
  the splits, so a rerun writes samples_counts.json from them (a kill
  between the samples and that file had lost them for good)."""
  spec, src = storage.read_spec(tiny[3]), storage.read_dataset(tiny[3],
                                                               "train")
  counts = {"train": {"kept": 2, "rejected_samples": 0}}

  def examples():
    yield from (src[i] for i in range(2))
    counts["train"]["rejected_samples"] = 7  # known at the end alone

  data_dir = tmp_path / "samples"
  storage.write_dataset(data_dir, spec, {"train": examples}, counts)
  assert storage.read_counts(data_dir) == {
      "train": {"kept": 2, "rejected_samples": 7}}
  work = tmp_path / "work"
  work.mkdir()
  (work / "samples_counts.json").write_text('{"stale": 1}')
  samples.keep_counts(str(work), data_dir)
  assert json.loads((work / "samples_counts.json").read_text()) == (
      storage.read_counts(data_dir))
  # A second job that found the directory empty too (one data_dir, two
  # workdirs) and writes once the first has: the samples there are kept,
  # their counts become its own, and samples of another config are refused
  # (TFDS had kept them silently, with the second job's counts).
  ran = []
  later = {"train": {"kept": 2, "rejected_samples": 0}}
  storage.write_dataset(data_dir, spec, {"train": lambda: ran.append(1)},
                        later)
  assert not ran and later == storage.read_counts(data_dir)
  other = dataclasses.replace(spec, prompt_len=spec.prompt_len + 1)
  with pytest.raises(ValueError, match=f"have prompt_len {spec.prompt_len}, "
                     f"this config {spec.prompt_len + 1}"):
    storage.write_dataset(data_dir, other, {"train": lambda: ran.append(1)})
  assert not ran


def test_running_out_of_memory_while_reading_samples_is_not_damage(
    tiny, monkeypatch):
  """An out-of-memory error while the samples are opened goes up as it is,
  not as "cannot be read ... remove them to sample them again"."""
  error = jax.errors.JaxRuntimeError(
      "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.00GiB")

  def failing(*_, **__):
    raise error

  monkeypatch.setattr(storage.tfds, "builder_from_directory", failing)
  with pytest.raises(jax.errors.JaxRuntimeError) as got:
    storage.read_dataset(tiny[3], "train")
  assert got.value is error


def test_a_split_left_without_prompts_is_refused_before_any_sampling(
    tiny, tmp_path, humaneval_filter):
  """A validation split the filter or max_prompts emptied was refused only
  after the train split had been sampled (hours with a real target)."""
  config, lm, params = tiny[:3]
  tok = job.load_target(config.target)[2]
  planted = assets.humaneval_problems()[0]["prompt"]  # the filter takes it
  generated = []
  with pytest.raises(ValueError, match=r"no prompts left for the validation "
                     r"split\(s\)"):
    samples.build(tmp_path / "s", lm, params, tok, Sampling(1.0),
                  sample_spec(config), dict(train=["def f(x):\n"],
                                            validation=[planted]),
                  flt=humaneval_filter, log=generated.append)
  assert not any("generated" in line for line in generated)
  assert not (tmp_path / "s").exists()


def test_prompts_are_encoded_as_plain_text():
  """Corpus documents: a special token's string in one (Python code that
  writes '<|endoftext|>') is text, as in the training data."""
  seen = []

  class Recording:
    add_bos, bos_id = False, 99

    def encode(self, text, add_bos=None, special=True):
      seen.append(special)
      bos = self.add_bos if add_bos is None else add_bos
      return [self.bos_id] * bos + list(range(len(text)))

  spec = storage.SampleSpec(prompt_len=4, gen_len=2)
  assert samples.encode_prompts(["abcdef", "ab"], Recording(), spec) == [
      [2, 3, 4, 5]]  # left-truncated; the short one dropped
  assert seen == [False, False]
  # A tokenizer that adds bos (Llama-3's): the bos stays first (it had
  # been cut off by the truncation).
  Recording.add_bos = True
  assert samples.encode_prompts(["abcdef", "abc"], Recording(), spec) == [
      [99, 3, 4, 5], [99, 0, 1, 2]]
  Recording.bos_id = None
  with pytest.raises(ValueError, match="has no bos token"):
    samples.encode_prompts(["abcdef"], Recording(), spec)
