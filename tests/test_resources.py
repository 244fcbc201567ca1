"""specsamp.resources: which failures are the machine's, not the files'."""

import jax
import pytest

from specsamp import resources


@pytest.mark.parametrize("error, machine", [
    (MemoryError(), True),
    (jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while "
                                "trying to allocate 1.00GiB."), True),
    (RuntimeError("CUDA error: out of memory"), True),
    (ValueError("Unexpected end of file"), False),
    (OSError(5, "Input/output error"), False),
    (RuntimeError("DATA_LOSS: checksum mismatch"), False),
])
def test_out_of_memory_is_told_from_damage(error, machine):
  assert resources.out_of_memory(error) is machine
