"""Child process of test_atomic_outputs.py: ``python atomic_worker.py SPEC.json``.

Writes every output of the spec once, completely, into ``<writer>/old/`` and prints
``COMPLETE {digests}``; then starts writing each again, over the complete one and into
``<writer>/fresh/``, each in a thread that blocks after the writer's first file is
written (the weights of an export or a merge; the first record of a conversion),
printing ``BLOCKED <writer>:<target>``; then waits to be killed with -9.
"""
import faulthandler
import hashlib
import json
import os
import signal
import sys
import threading
import time

OUTPUT = {"export": "model", "merge": "model", "native": "out.jsonl", "guilibra_sft": "out.json",
          "guilibra_rl": "out.parquet"}
_state = threading.local()


def digest(folder: str) -> dict:
    """relative path -> sha256 of every file under ``folder`` but temporary ones."""
    out = {}
    for root, dirs, names in os.walk(folder):
        dirs[:] = [d for d in dirs if ".tmp-" not in d and ".old-" not in d]
        for n in names:
            if ".tmp-" not in n:
                p = os.path.join(root, n)
                out[os.path.relpath(p, folder)] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    return out


def _say(line: str) -> None:
    """One line on stdout in one write (threads print at once; a pipe write this short is atomic)."""
    os.write(1, (line + "\n").encode())


def _block(what: str) -> None:
    if getattr(_state, "block", False):
        _say(f"BLOCKED {threading.current_thread().name} after {what}")
        time.sleep(3600)


def main(spec_path: str) -> None:
    faulthandler.register(signal.SIGUSR1, all_threads=True)   # the test's report when a write never blocks
    with open(spec_path) as f:
        spec = json.load(f)
    from transformers import AutoTokenizer

    from guilibra_jax import models as M
    from guilibra_jax.train import config as RC
    from guilibra_jax.train import merge as MG
    from guilibra_jax.train import model_factory as MF
    from launch import convert_data as CD

    real_save, real_kept = M.save_hf, CD._kept

    def save_hf(*a, **k):
        real_save(*a, **k)
        _block("the weights")

    def kept(src, log):
        for i, r in enumerate(real_kept(src, log)):
            if i == 1:
                _block("the first record")
            yield r

    M.save_hf, CD._kept = save_hf, kept
    graphdef, params, model_config = MF.load_frozen(spec["a"], dtype="float32", param_dtype="float32")
    config = RC.base_config()
    config.model.hf_path = spec["a"]
    tokenizer = AutoTokenizer.from_pretrained(spec["tokenizer"])
    jobs = {
        "export": lambda out: MF.export(graphdef, params, model_config, tokenizer, out, config=config),
        "merge": lambda out: MG.merge_folders("average", [spec["a"], spec["b"]], out),
        "native": lambda out: CD.convert([spec["jsonl"]], "native", out, "native"),
        "guilibra_sft": lambda out: CD.convert([spec["parquet"]], "guilibra_rl", out, "guilibra_sft"),
        "guilibra_rl": lambda out: CD.convert([spec["jsonl"]], "native", out, "guilibra_rl"),
    }
    root = spec["root"]
    for name, job in jobs.items():
        job(os.path.join(root, name, "old", OUTPUT[name]))
    _say("COMPLETE " + json.dumps({name: digest(os.path.join(root, name, "old")) for name in jobs}))

    def blocked(job, out):
        _state.block = True
        job(out)
        _say(f"FINISHED {threading.current_thread().name} (never blocked)")

    threads = [threading.Thread(target=blocked, args=(job, os.path.join(root, name, target, OUTPUT[name])),
                                name=f"{name}:{target}", daemon=True)
               for name, job in jobs.items() for target in ("old", "fresh")]
    for t in threads:
        t.start()
    time.sleep(3600)


if __name__ == "__main__":
    main(sys.argv[1])
