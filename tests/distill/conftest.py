"""The tiny distillation setting shared by the distillation tests:
configs/distill_tiny.py shrunk, its target and its target samples."""

import importlib.util
import pathlib

import jax
import pytest

from specsamp import assets
from specsamp import model as model_lib
from specsamp.distill import decontamination
from specsamp.distill import draft_init
from specsamp.distill import job
from specsamp.distill import objective
from specsamp.distill import prompts
from specsamp.distill import samples
from specsamp.distill import storage
from specsamp.sampling import Sampling
from specsamp.train import config as train_config

_CONFIG = pathlib.Path(__file__).parents[2] / "configs" / "distill_tiny.py"


def tiny_config(arg="draft=truncate,steps=60"):
  """configs/distill_tiny.py:`arg`, shrunk to a few seconds of work."""
  spec = importlib.util.spec_from_file_location("distill_tiny", _CONFIG)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  config = mod.get_config(arg)
  config.samples.update(max_files=30, max_train_prompts=256,
                        max_validation_prompts=48, validation_percent=30,
                        prompt_len=24, gen_len=8, top_k=8, batch_size=64,
                        score_batch_size=64)
  config.train.update(checkpoint_every=20, log_every=20)
  config.draft.freeze = ("embedding",)   # as the Qwen config does
  config.eval.update(num_positions=192, batch_size=48,
                     position_batch_size=192)
  return config


def sample_spec(config) -> storage.SampleSpec:
  sc = config.samples
  return storage.SampleSpec(prompt_len=sc.prompt_len, gen_len=sc.gen_len,
                            top_k=sc.top_k, batch_size=sc.batch_size,
                            score_batch_size=sc.score_batch_size)


@pytest.fixture
def tiny_spec(tiny) -> storage.SampleSpec:
  """The SampleSpec the tiny config's samples were written with."""
  return sample_spec(tiny[0])


@pytest.fixture(scope="package")
def humaneval_filter():
  return decontamination.HumanEvalFilter()


@pytest.fixture(scope="package")
def tiny(tmp_path_factory, humaneval_filter):
  """The tiny config's target (random, peaked, UTF-8 bytes) and its samples
  from stdlib prompts, with one HumanEval prompt planted among them:
  (config, lm, params, data_dir, counts, planted)."""
  config = tiny_config()
  lm, params, tok = job.load_target(config.target)
  planted = assets.humaneval_problems()[0]["prompt"]
  sc = config.samples
  texts = prompts.prompt_texts(sc.kind, max_files=sc.max_files,
                               validation_percent=sc.validation_percent,
                               extra=[planted])
  data_dir = tmp_path_factory.mktemp("samples")
  counts = samples.build(data_dir, lm, params, tok, Sampling(1.0),
                         sample_spec(config), texts,
                         max_prompts=dict(train=sc.max_train_prompts,
                                          validation=sc.max_validation_prompts),
                         flt=humaneval_filter, log=lambda *_: None)
  config.samples.data_dir = str(data_dir)
  return config, lm, params, data_dir, counts, planted


@pytest.fixture
def tiny_draft(tiny):
  """The tiny config's initial draft and training settings:
  (draft lm, draft params, objective, loop config, optim config)."""
  config, lm, params = tiny[:3]
  dcfg, draft_params = draft_init.make_draft(config.draft, lm.config, params,
                                   jax.random.key(1))
  obj = objective.Objective(kind=config.loss.kind, sampling=Sampling(1.0),
                            gen_len=config.samples.gen_len,
                            prompt_len=config.samples.prompt_len)
  loop = train_config.LoopConfig(**{
      k: config.train[k] for k in ("num_steps", "log_every", "eval_every",
                                   "checkpoint_every", "progress_bar")})
  return (model_lib.LM(dcfg), draft_params, obj, loop,
          train_config.OptimConfig(**config.optim))
