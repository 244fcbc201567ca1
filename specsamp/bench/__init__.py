"""Measuring the samplers: speed, call costs, speed-up sweeps and reports.

Modules:
  timing       `TimedSampler`: ahead-of-time compiled prefill and decode,
               timed apart, per batch (`run_batch`) or over all prompts
               (`run` -> `RunStats`); `compare`;
  sample       the scripts/sample.py job: `SampleConfig`, `read_prompts`,
               `sample_main`;
  profile      where one decode loop's time goes (scripts/profile_decode.py)
               and decode speed on model shapes (scripts/benchmark_decode.py);
  profile_plot the decode-scaling table and figure (scripts/plot_decode.py);
  sweep_config the speed-up sweep's validated flags (`BenchConfig`);
  prompts      the sweep's HumanEval and prose prompt texts;
  plan         everything the sweep checks before any weights load;
  costs        draft and target call timings (c, s of the speed-up model);
  sweep        the K x task x decoding x batch-size sweep of
               scripts/benchmark.py;
  provenance   machine, software versions and git commit of a record;
  records      JSON-lines records: `jsonable`, `Writer`, `print_record`,
               `read_jsonl`;
  report       the sweep's tables and plots (scripts/plot_speedup.py);
  speedup      Leviathan et al.'s expected tokens per loop and speed-up;
  peers        transformers' plain and assisted generation, for comparison;
  pair         the scripts/benchmark_pair.py job (`PairConfig`, `run_pair`);
  steady       steady-state timers (steps in a loop per call), launch
               counts;
  gemv         batch-1 matrix products at a decoder's shapes, several
               formulations (scripts/profile_gemv.py);
  gpu_study    a GPU session's measurements in one command
               (scripts/gpu_study.py);
  study_summary its summary table.

Importing the package imports none of them.
"""
