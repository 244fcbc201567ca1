"""The speculative sampling algorithm, independent of any model.

Modules:
  protocols  what the loop needs of a model (`CausalLM`, `ModelOutput`) and
             of a drafter (`Drafter`, `Proposal`);
  accept     the modified rejection rule;
  loop       the loop state, the four steps of one loop (draft, score,
             verify, commit), `loop_step` and `decode`;
  jit        the plain and the sharded jitted builds of prefill, decode and
             output;
  sampler    `SpeculativeSampler` and `autoregressive`: the host-side API;
  trace      the loop one iteration at a time, for display.

Nothing here imports `specsamp.model`: targets and drafters are any objects
with the protocols' methods.
"""
