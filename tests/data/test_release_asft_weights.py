"""GUI-Libra's released ASFT weighting (SFT/src/aguvis/dataset.py with use_action_weight,
action_weight 2; loss in SFT/src/aguvis/trainer.py: sum(w * CE) / sum(w)), token by token
with the real Qwen tokenizer, worked by hand from the release's code:

    action_weights = 1; [after tok("<answer>")[:-1], first tok("</answer>")[:-1]) *= 2;
    [after tok('"point_2d":')[1:], end of sequence) *= 2 * 2
"""
import jax
import jax.numpy as jnp
import numpy as np

from guilibra_jax import actions as A
from guilibra_jax import losses as L
from guilibra_jax.data import pipeline as PL
from guilibra_jax.data import tokenize as T
from data_fixtures import make_native_dataset

# The release's own answer layout (README: pretty-printed JSON). Its patterns are
# <,answer | </,answer | point,_,2,d,": and all three match here, so the release's
# weights are: 1 up to "answer" of <answer>; 2 from ">\n" to "}\n"... except that the
# tail x4 starts after '":' of "point_2d": (x8 inside the answer, x4 from "</" on).
PRETTY = '<think>\nOK.\n</think>\n<answer>\n{\n  "action_type": "Click",\n  "point_2d": [64, 3]\n}\n</answer>'
PRETTY_WEIGHTS = [("<think>", 1), ("\n", 1), ("OK", 1), (".\n", 1), ("</think>", 1), ("\n", 1), ("<", 1),
                  ("answer", 1), (">\n", 2), ("{\n", 2), (" ", 2), (' "', 2), ("action", 2), ("_type", 2),
                  ('":', 2), (' "', 2), ("Click", 2), ('",\n', 2), (" ", 2), (' "', 2), ("point", 2), ("_", 2),
                  ("2", 2), ("d", 2), ('":', 2), (" [", 8), ("6", 8), ("4", 8), (",", 8), (" ", 8), ("3", 8),
                  ("]\n", 8), ("}\n", 8), ("</", 4), ("answer", 4), (">", 4), ("<|im_end|>", 4)]


def _weights(tok, text):
    ids, segs = T.encode_target(tok, text, weighting="release")
    w = np.asarray(L.segment_weights(jnp.asarray(segs), 2.0, 4.0, "release"))
    return [(tok.decode([int(t)]), float(x)) for t, x in zip(ids, w)], ids, segs


def test_release_weights_on_the_release_layout_match_hand_table(qwen_tok):
    got, _, segs = _weights(qwen_tok, PRETTY)
    assert got == [(t, float(w)) for t, w in PRETTY_WEIGHTS]
    # the paper's parts are kept underneath the flags
    paper_ids, paper_segs = T.encode_target(qwen_tok, PRETTY)
    np.testing.assert_array_equal(segs & T.PART_MASK, paper_segs)


def test_release_weights_on_our_compact_answer(qwen_tok):
    text = A.render_response(A.Action("Click", "tap", None, (64, 3)), "OK.", "qwen2_5_vl")
    got, _, _ = _weights(qwen_tok, text)
    # "]}</" merges the closing brackets with "</": the release's token pattern for
    # </answer> finds nothing there (no x2 at all); the character spans keep its layout's
    # meaning: the merged token is inside the answer and after "point_2d": -> 8.
    tail = [t for t, w in got if w == 8.0]
    assert "".join(tail) == " [64, 3]}</"
    assert [w for t, w in got][-3:] == [4.0, 4.0, 4.0] and [t for t, _ in got][-3:] == ["answer", ">", "<|im_end|>"]
    assert all(w == 1.0 for t, w in got[:got.index(("answer", 1.0)) + 1])      # reasoning and "<answer"
    assert {w for t, w in got} == {1.0, 2.0, 4.0, 8.0}
    # a direct-action sample: no think block, the same answer weights
    direct, _, _ = _weights(qwen_tok, A.render_response(A.Action("Back", "go back", None, None)))
    assert "".join(t for t, w in direct if w == 8.0) == " [-100, -100]}</"   # the placeholder too


def test_release_weighting_loss_is_token_sum_normalised(qwen_tok):
    _, ids, segs = _weights(qwen_tok, PRETTY)
    n, V = len(ids), 11
    logits = jax.random.normal(jax.random.PRNGKey(0), (2, n, V))
    targets = jnp.asarray(np.stack([ids % V, (ids + 3) % V]))
    seg = jnp.asarray(np.stack([segs, np.where(np.arange(n) < n // 2, segs, 0)]))
    loss, _ = L.asft_loss(logits, targets, seg, normalize="token", weighting="release")
    w = np.asarray([w for _, w in PRETTY_WEIGHTS], np.float64)
    w2 = np.stack([w, np.where(np.arange(n) < n // 2, w, 0.0)])
    x = np.asarray(logits, np.float64)
    logp = x - np.log(np.exp(x).sum(-1, keepdims=True))
    nll = -np.take_along_axis(logp, np.asarray(targets)[..., None], -1)[..., 0]
    np.testing.assert_allclose(float(loss), (w2 * nll).sum() / w2.sum(), rtol=1e-5)


def test_sft_loader_carries_release_flags_only_when_asked(tmp_path, qwen_tok, qwen25_config):
    path = make_native_dataset(str(tmp_path), 4)
    cfg = dict(inputs=path, format="native", batch_size=4, max_pixels=64 * 64, patch_bucket=64,
               seq_buckets=(2048,), seed=0, num_epochs=1, shuffle=False)
    paper = next(PL.make_sft_loader(cfg, qwen_tok, qwen25_config, shard_index=0, shard_count=1))
    rel = next(PL.make_sft_loader({**cfg, "loss_weighting": "release"}, qwen_tok, qwen25_config, shard_index=0,
                                  shard_count=1))
    assert set(np.unique(paper["loss_segments"]).tolist()) <= {0, 1, 2, 3}
    np.testing.assert_array_equal(rel["loss_segments"] & T.PART_MASK, paper["loss_segments"])
    assert ((rel["loss_segments"] & T.IN_ANSWER) > 0).any() and ((rel["loss_segments"] & T.AFTER_POINT) > 0).any()
