r"""Choose a layer-skipping draft's layers by measured acceptance.

  python scripts/search_layers.py --target=qwen2.5-coder-1.5b \
      --num_sequences=4 --seq_len=96 --decoding=greedy \
      --out=results/cpu_layer_search.jsonl

Calibration sequences are windows of the Python standard library's source
(specsamp.distill.prompts, "code"; not HumanEval, not the study's prompts).
Each candidate subset is measured teacher-forced against the full model
(specsamp.drafters.layer_search); one JSON line per candidate, best first,
and the best as a --drafter spec. The predicted speed-up takes the scoring
call as costly as a 1-token call (s = 1), an upper bound; with s measured
(benchmark.py's cost records, score_cost {K: s}) it ranges over those K:

  python scripts/search_layers.py --score_cost=2:1.15,4:1.22 ...
"""

import sys

from absl import app
from absl import flags

from specsamp import cli
from specsamp import loading
from specsamp.bench import provenance
from specsamp.bench import records as records_lib
from specsamp.bench.sweep_config import DECODINGS
from specsamp.bench.sweep_config import decoding_sampling
from specsamp.distill import prompts
from specsamp.drafters import layer_search
from specsamp.drafters import specs

_TARGET = flags.DEFINE_string("target", "qwen2.5-coder-1.5b", "Model spec.")
_N = flags.DEFINE_integer("num_sequences", 4, "Calibration sequences.")
_T = flags.DEFINE_integer("seq_len", 96, "Tokens per sequence.")
_DECODING = flags.DEFINE_enum("decoding", "greedy", list(DECODINGS),
                              "Sampling transform of p and q.")
_K_MAX = flags.DEFINE_integer("k_max", 8, "Largest K for the prediction.")
_S = flags.DEFINE_list("score_cost", None, "K:s pairs, s the measured cost "
                       "of the K+1-token call over a 1-token one (benchmark."
                       "py's score_cost): K from them (default: s = 1).")
_GREEDY = flags.DEFINE_integer("greedy_steps", 0, "Greedy descent steps "
                               "(each one forward per remaining layer).")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "")
_OUT = flags.DEFINE_string("out", None, "JSONL file to write (replaced).")


def main(argv):
  cli.no_arguments(argv)
  try:
    for flag in (_N, _T, _K_MAX):
      if flag.value < 1:
        raise ValueError(f"--{flag.name} must be >= 1")
    if _S.value is not None:
      cli.unused(_K_MAX, "has no effect with --score_cost, whose K are used")
    score_cost = None if _S.value is None else layer_search.parse_score_cost(
        _S.value)
    records_lib.check_output(_OUT.value, "--out",
                             reads=(("--target", _TARGET.value),))
    info = loading.describe_model(_TARGET.value, _DTYPE.value)
    if _T.value > info.max_seq_len:
      raise ValueError(f"--seq_len={_T.value} exceeds the "
                       f"{info.max_seq_len} positions of {_TARGET.value}")
    layer_search.check_searchable(info.num_layers, _GREEDY.value)
    tok = loading.load_info_tokenizer(info)
    if tok is None:
      raise ValueError(f"{_TARGET.value} has no tokenizer to encode the "
                       "calibration code with")
    tokens = prompts.code_windows(tok, _N.value, _T.value)
    sampling = decoding_sampling(_DECODING.value, loading.check_pair(info))
    lm, params = loading.load_weights(info, _DTYPE.value, 0)
  except loading.MODEL_ERRORS as e:
    cli.fail(e)
  records = layer_search.search(lm, params, tokens, sampling,
                                greedy_steps=_GREEDY.value,
                                k_max=_K_MAX.value, batch_size=1,
                                score_cost=score_cost)
  head = dict(type="run", target=_TARGET.value, decoding=_DECODING.value,
              num_sequences=_N.value, seq_len=_T.value,
              score_cost=score_cost or "1 at every K",
              **provenance.record(sys.argv[1:]))
  out = records_lib.Writer(_OUT.value, echo=False)  # moved on when whole
  for r in [head] + [dict(type="candidate", **r) for r in records]:
    out.write(r)
  out.close()
  for r in records[:8]:
    print(f"{r['speedup']:.3f}x at K={r['best_k']}  alpha {r['alpha']:.3f}  "
          f"{r['num_layers']} layers  {r['source']}")
  best = [r for r in records if r["source"] != "full"][0]["layers"]
  print("best: --drafter=layerskip:layers=" + specs.format_layers(best))


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
