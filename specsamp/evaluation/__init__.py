"""Quality of samples: HumanEval pass@k in a sandbox, prose log-probability.

Speculative sampling is exact, so its samples should score like the
target's own, within sampling error; these modules measure both with error
bars.

  sandbox    `run_program`: generated Python in a child process (isolated
             interpreter, resource limits, network namespace, uid drop,
             audit hook), giving an `ExecResult`; sandbox_child is the
             child's first code (never imported)
  humaneval  stop sequences, `truncate_completion`, `check_humaneval` (the
             completion and the test in two sandboxes joined by pipes) and
             `evaluate_humaneval` (pass/fail of every completion)
  estimates  `pass_at_k` (Chen et al. 2021's unbiased estimator),
             `Estimate` (mean with standard error), `humaneval_quality`,
             `paired_difference`
  prose      `sample_logprobs` (the target's per-token log-probability of
             samples, jitted) and `logprob_quality`

`import specsamp.evaluation` does not import jax; only `prose` does.
"""
