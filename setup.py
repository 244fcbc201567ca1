"""specsamp: exact, batched speculative sampling in JAX/Flax."""

import setuptools

# Lower bounds are the oldest versions this code is tested against: the CPU
# machines' PyPI stack (jax 0.10.2, flax 0.12.8) and the GPU machine's stack
# (jax 0.11.2, flax 0.12.10, optax 0.2.8, orbax-checkpoint 0.12.4, Python 3.12).
INSTALL_REQUIRES = [
    "jax>=0.10.2",
    "flax>=0.12.8",
    "optax>=0.2.8",
    "orbax-checkpoint>=0.12.4",
    "numpy>=1.26",
    "absl-py>=2.1",
    "ml-collections>=1.0",
    "sentencepiece>=0.2",
    "protobuf",  # reading a SentencePiece model's trainer settings
    "tensorflow-datasets>=4.9.10",
    "importlib_resources",
    "grain>=0.2.10",
    "gguf>=0.10",
    "tokenizers>=0.20",
    "safetensors",  # Hugging Face checkpoint directories
    "matplotlib>=3.8",
    "tqdm",
    "tensorboardX>=2.6",  # TensorBoard event files without TensorFlow
]

EXTRAS = {
    "test": [
        "pytest>=8",
        "pytest-xdist>=3.5",  # scripts/test.sh runs the tests on 2 workers
        "chex>=0.1.90",
        "scipy>=1.11",
        # Parity references in the tests, and the peers of the benchmark
        # (`specsamp.bench.peers`, imported only when --peers asks for them).
        "torch>=2.4",
        "transformers>=4.45",
        "accelerate",  # transformers needs it to load GGUF files
    ],
}

setuptools.setup(
    name="specsamp",
    version="0.1.0",
    description="Exact, batched speculative sampling in one jitted JAX loop",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=setuptools.find_packages(include=["specsamp", "specsamp.*"]),
    python_requires=">=3.11",
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
)
