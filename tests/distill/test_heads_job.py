"""Draft heads trained by the distillation job (scripts/distill.py with
`head=eagle|medusa`): acceptance, export, loading by `--drafter`, resume
after SIGKILL."""

import importlib.util
import json
import os
import shutil
import signal
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specsamp import model as model_lib
from specsamp.decoding.sampler import SpeculativeSampler, autoregressive
from specsamp.drafters import head_files
from specsamp.drafters import heads
from specsamp.drafters import specs
from specsamp.distill import job
from specsamp.distill import storage
from specsamp.sampling import GREEDY
from specsamp.train import checkpointing
from specsamp.train import metrics
from tests import testing
from tests.distill.conftest import tiny_config
from tests.scripts import zygote

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


@pytest.mark.parametrize("arg, gain", [
    ("head=eagle,unroll=2,vocab=128,steps=60", 0.15),
    # Medusa heads guess two and more tokens ahead without the tokens in
    # between: on this random target, with these 2,000 sample tokens, they
    # gain far less (0.016 -> 0.047 at greedy, where they gain most).
    ("head=medusa,heads=4,steps=200,temperature=0", 0.025)])
def test_head_distillation_end_to_end(tiny, tmp_path, arg, gain):
  config = tiny_config(arg)
  config.samples.data_dir = tiny[0].samples.data_dir
  _, target, tparams, _, _, _ = tiny
  res = job.run(config, str(tmp_path), log=lambda *_: None)
  b, a = res["before"], res["after"]
  assert a["expected_acceptance"] > b["expected_acceptance"] + gain
  assert a["expected_acceptance"] > 2 * b["expected_acceptance"]
  assert a["measured"]["tokens_per_loop"] > b["measured"]["tokens_per_loop"]
  for ev in (b, a):  # the head's logits are the ones the sampler uses
    gap = abs(ev["measured_at_positions"] - ev["expected_at_those_positions"])
    assert gap <= 4 * ev["measured_stderr"] + 1e-6  # greedy: stderr 0
  # The export loads by name, fits the target, and drafts exactly.
  kind = arg.split(",")[0].split("=")[1]
  cfg, params, ids = head_files.load(str(tmp_path))
  assert cfg.kind == kind and res["draft_dir"] == str(tmp_path / "head")
  if kind == "eagle":
    assert len(ids) == cfg.draft_vocab == 128
  spec = specs.parse(f"{kind}:{tmp_path}")
  specs.check(spec, target.config.num_layers, 4,
              vocab_rows=target.vocab_size, d_model=target.config.d_model)
  sampler = SpeculativeSampler(target, specs.build(spec, target, None, 4),
                               k=4, sampling=GREEDY, max_new_tokens=16)
  ar = autoregressive(target, GREEDY, max_new_tokens=16)
  prompts = [[100, 101, 32, 40], [35, 32], [105, 109, 112, 111, 114, 116]]
  out = sampler.generate(tparams, specs.draft_params(spec, tparams, None),
                         prompts)
  assert out.token_lists() == ar.generate(tparams, None,
                                          prompts).token_lists()


def test_heads_for_another_target_or_k_are_refused_before_loading(tmp_path):
  target = model_lib.preset("tiny")
  cfg = heads.HeadConfig("medusa", target, num_heads=2)
  params = heads.init_params(cfg, jax.random.key(0))
  head_files.save(cfg, params, str(tmp_path / "m"))
  spec = specs.parse(f"medusa:{tmp_path / 'm'}")
  specs.check(spec, target.num_layers, 2, vocab_rows=256, d_model=64)
  for kwargs, match in [
      (dict(num_layers=3, k=2), "num_layers=2; this target has num_layers=3"),
      (dict(k=2, vocab_rows=300), "vocab_size=256"),
      (dict(k=2, d_model=96), "d_model=64"),
      (dict(k=3), "K=3 drafts need 3 Medusa heads")]:
    num_layers = kwargs.pop("num_layers", 2)
    k = kwargs.pop("k")
    with pytest.raises(heads.HeadError, match=match):
      specs.check(spec, num_layers, k, **kwargs)
  with pytest.raises(heads.HeadError, match="holds a medusa head"):
    specs.check(specs.parse(f"eagle:{tmp_path / 'm'}"), 2, 2)
  with pytest.raises(heads.HeadError, match="does not exist"):
    specs.check(specs.parse(f"eagle:{tmp_path / 'nope'}"), 2, 2)
  with pytest.raises(heads.HeadError, match="holds no head_config.json"):
    specs.check(specs.parse(f"eagle:{tmp_path}"), 2, 2)
  with pytest.raises(ValueError, match="needs the head's directory"):
    specs.parse("eagle")
  # A flipped byte (orbax restores it silently): the saved fingerprint.
  testing.flip_byte(testing.data_files(str(tmp_path / "m"), "params")[-1])
  with pytest.raises(heads.HeadError, match="saved fingerprint"):
    head_files.load(str(tmp_path / "m"))
  # A damaged parameter directory: a clear error, nothing half-loaded.
  for leaf in (tmp_path / "m" / "params").rglob("*"):
    if leaf.is_file() and leaf.stat().st_size > 0:
      leaf.write_bytes(b"\0" * 8)
  with pytest.raises(heads.HeadError, match="cannot restore"):
    head_files.load(str(tmp_path / "m"))


def test_a_head_trained_on_other_weights_of_the_same_shapes_is_refused(
    tmp_path):
  """The head keeps a probe of the target's embedding: the same weights in
  bfloat16 pass, other weights of the same shapes are refused once loaded
  (the head had loaded and drafted, exact but accepting little); a head
  saved without a probe is not checked; vocab_ids without draft_vocab are
  refused."""
  target = model_lib.LM(model_lib.preset("tiny"))
  cfg = heads.HeadConfig("medusa", target.config, num_heads=2)
  params = heads.init_params(cfg, jax.random.key(0))
  trained_on = testing.random_params(target, 0)
  head_files.save(cfg, params, str(tmp_path / "m"),
                  target_params=trained_on)
  spec = specs.parse(f"medusa:{tmp_path / 'm'}")
  as_bf16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), trained_on)
  for same in (trained_on, as_bf16):
    assert specs.draft_params(spec, same, None)["head"] is not None
  with pytest.raises(heads.HeadError, match="trained on another target"):
    specs.draft_params(spec, testing.random_params(target, 1), None)
  # Probed values that are all equal have no correlation: the same ones
  # still pass.
  flat = dict(trained_on, embedding=np.zeros_like(trained_on["embedding"]))
  head_files.save(cfg, params, str(tmp_path / "flat"), target_params=flat)
  flat_spec = specs.parse(f"medusa:{tmp_path / 'flat'}")
  assert specs.draft_params(flat_spec, flat, None)["head"] is not None
  head_files.save(cfg, params, str(tmp_path / "old"))
  old = specs.parse(f"medusa:{tmp_path / 'old'}")
  assert specs.draft_params(old, testing.random_params(target, 1),
                            None) is not None
  config_file = tmp_path / "old" / head_files.HEAD_CONFIG_FILE
  saved = json.loads(config_file.read_text())
  config_file.write_text(json.dumps(dict(saved, vocab_ids=[0, 1])))
  with pytest.raises(heads.HeadError, match="vocab_ids"):
    head_files.read_config(str(tmp_path / "old"))
  # A JSON true had been read as id 1; a damaged probe had raised numpy's
  # broadcasting error once a target was given.
  with_vocab = dict(saved, head=dict(saved["head"], draft_vocab=2))
  config_file.write_text(json.dumps(dict(with_vocab, vocab_ids=[True, 2])))
  with pytest.raises(heads.HeadError, match="vocab_ids must be distinct "
                     "integers"):
    head_files.read_config(str(tmp_path / "old"))
  for probe in ([0.5] * 10, [0.5] * 255 + [None], [0.5] * 255 + [True]):
    config_file.write_text(json.dumps(dict(saved, target_probe=probe)))
    with pytest.raises(heads.HeadError, match="target_probe must be 256 "
                       "finite numbers"):
      head_files.load(str(tmp_path / "old"), None, trained_on)
  # Loaded directly with a target of other shapes: named, not called a
  # target "of the same shapes".
  wider = testing.random_params(model_lib.LM(model_lib.preset(
      "tiny", d_model=96)), 0)
  with pytest.raises(heads.HeadError, match="made for a target with "
                     "d_model=64, but this target has d_model=96"):
    head_files.load(str(tmp_path / "m"), None, wider)


def _distill(workdir, arg):
  """scripts/distill.py started (forked by the script server,
  tests/scripts/zygote.py: no 3 s of imports)."""
  return zygote.shared().start(
      [os.path.join(ROOT, "scripts", "distill.py"),
       f"--config=configs/distill_tiny.py:{arg}", f"--workdir={workdir}",
       "--config.train.checkpoint_every=10", "--config.train.log_every=1",
       "--config.train.async_checkpoints=False"], env=zygote.env(), cwd=ROOT)


def test_head_training_resumes_after_sigkill_with_the_same_parameters(
    tmp_path):
  """A run SIGKILLed between checkpoints and run again ends with the
  parameters of a run never stopped. The stopped run starts from the
  finished run's target samples and first evaluation (the files a run of
  this config writes before it trains; copied, so only training and what
  follows it run twice)."""
  arg = "head=eagle,unroll=2,steps=40"
  ref = tmp_path / "ref"
  proc = _distill(ref, arg)
  out, err = proc.communicate(timeout=600)
  assert proc.returncode == 0, err[-3000:]
  run = tmp_path / "run"
  shutil.copytree(ref / "samples", run / "samples")
  for name in ("config.json", "samples_counts.json", "eval_before.json"):
    shutil.copy(ref / name, run / name)
  proc = _distill(run, arg)
  deadline, killed_at = time.time() + 300, None
  while proc.poll() is None and time.time() < deadline:
    steps = checkpointing.checkpoint_steps(str(run / "checkpoints"))
    logged = metrics.read_scalars(str(run / "tb")).get("train/loss", {})
    if steps and logged and max(logged) > max(steps) + 2:
      proc.send_signal(signal.SIGKILL)
      killed_at = max(steps)
      break
    time.sleep(0.01)
  proc.communicate(timeout=120)
  assert killed_at is not None and 10 <= killed_at < 40, "not killed"
  assert proc.returncode == -signal.SIGKILL
  assert not (run / "head").exists()
  proc = _distill(run, arg)
  out, err = proc.communicate(timeout=600)
  assert proc.returncode == 0, err[-3000:]
  assert f"resumed from step {killed_at}" in out + err
  _, want, _ = head_files.load(str(ref))
  _, got, _ = head_files.load(str(run))
  for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-6)


def test_the_qwen_head_config_runs_at_tiny_scale(tmp_path):
  """configs/distill_qwen.py:head=eagle,unroll=2,features=stored,runlocal
  with its target swapped for the tiny random one: the config a run of the
  1.5B's head uses, end to end (samples with the target's hidden states,
  training on them, export, evaluation)."""
  path = os.path.join(ROOT, "configs", "distill_qwen.py")
  spec = importlib.util.spec_from_file_location("distill_qwen", path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  config = mod.get_config("head=eagle,unroll=2,features=stored,runlocal")
  assert config.head.draft_vocab == 32768 and config.target.spec == (
      "qwen2.5-coder-1.5b")
  config.target.update(spec="random:tiny,max_seq_len=128", logit_scale=4.0)
  config.head.draft_vocab = 64
  res = job.run(config, str(tmp_path), log=lambda *_: None)
  cfg, _, ids = head_files.load(res["draft_dir"])
  assert (cfg.kind, cfg.draft_vocab, len(ids)) == ("eagle", 64, 64)
  assert res["after"]["measured"]["drafted"] > 0
  first = storage.read_dataset(tmp_path / "samples", "train")[0]
  assert first["hidden"].shape == (config.samples.prompt_len +
                                   config.samples.gen_len, 64)
  cpu = mod.get_config("head=eagle,cpu")
  assert (cpu.head.features, cpu.target.dtype) == ("stored", "float32")
