"""Conformance snippets: tokens, config, losses, TL's analysis tools and what has no meaning for
a groklens task (a tokenizer, generation, next-token prediction), each against the reference pass
or the refusal."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tests.models.tl_common import TRANSFORMERS, Ctx, close


def to_tokens(c: Ctx):
    """to_tokens('3 5 =') / to_str_tokens / to_single_token / model('3 5 =')"""
    toks = c.model.to_tokens("3 5 =")
    assert toks.tolist() == [[3, 5, c.p]]
    assert c.model.to_str_tokens(toks[0]) == ["3", "5", "="]
    assert c.model.to_single_token("=") == c.p
    with torch.no_grad():
        close(c.model("3 5 =")[0], c.reference(c.data.inputs[3 * c.p + 5 : 3 * c.p + 6]).logits[0])


def to_str_tokens_list(c: Ctx):
    """to_str_tokens(['3 5 =', '1 2 ='])"""
    assert c.model.to_str_tokens(["3 5 =", "1 2 ="]) == [["3", "5", "="], ["1", "2", "="]]


def to_str_tokens_row(c: Ctx):
    """to_str_tokens of a [1, pos] tensor, a 1-D tensor and a numpy row"""
    toks = c.model.to_tokens("3 5 =")
    for t in (toks, toks[0], toks.numpy()):
        assert c.model.to_str_tokens(t) == ["3", "5", "="]


def to_str_tokens_batch(c: Ctx):
    """to_str_tokens of a [2, pos] batch (TL asserts one row)"""
    c.model.to_str_tokens(c.tokens[:2])


def to_string_batch(c: Ctx):
    """to_string of a batch; to_tokens(to_string(tokens)) == tokens"""
    strings = c.model.to_string(c.tokens)
    assert isinstance(strings, list) and len(strings) == len(c.tokens)
    assert torch.equal(c.model.to_tokens(strings), c.tokens)


def n_ctx_overflow(c: Ctx):
    """model(tokens) with more positions than n_ctx"""
    c.model(torch.cat([c.tokens, c.tokens[:, :1]], dim=1))


def prefix_input(c: Ctx):
    """model(tokens[:, :2]): a shorter input"""
    with torch.no_grad():
        close(c.model(c.tokens[:, :2]), c.reference(c.tokens[:, :2]).logits)


def return_type_loss(c: Ctx):
    """model(tokens, return_type='loss' / 'both' / None) is the trainer's task loss"""
    from groklens.trainers.single import SingleRun

    class _W:
        class f:
            filename = "unused.h5"

    tr = SingleRun(c.cfg, c.data, lambda _t: _W(), progress=False)
    tr.model.load_state_dict(c.model.state_dict())
    tr.model.eval()
    with torch.no_grad():
        want = tr.task_loss(tr.readout(tr.forward(tr.train_x)), tr.train_y)
        loss = c.model(tr.train_x, return_type="loss")
        logits, both = c.model(tr.train_x, return_type="both")
        assert c.model(tr.train_x, return_type=None) is None
    close(loss, want, atol=1e-6)
    close(both, want, atol=1e-6)
    close(logits, c.model(tr.train_x))
    close(loss, F.cross_entropy(c.reference(tr.train_x).logits[:, -1], tr.train_y), atol=1e-5)


def loss_per_token(c: Ctx):
    """model(tokens, return_type='loss', loss_per_token=True)"""
    with torch.no_grad():
        got = c.model(c.tokens, return_type="loss", loss_per_token=True)
    close(got, F.cross_entropy(c.ref.logits[:, -1], c.labels, reduction="none"), atol=1e-5)


def loss_fn(c: Ctx):
    """model.loss_fn(logits, tokens) == model(tokens, return_type='loss')"""
    with torch.no_grad():
        got = c.model.loss_fn(c.model(c.tokens), c.tokens)
        close(got, c.model(c.tokens, return_type="loss"))
    close(got, F.cross_entropy(c.ref.logits[:, -1], c.labels), atol=1e-5)


def bad_return_type(c: Ctx):
    """model(tokens, return_type='logprobs')"""
    c.model(c.tokens, return_type="logprobs")


def prepend_bos(c: Ctx):
    """to_tokens('3 5 =', prepend_bos=True)"""
    c.model.to_tokens("3 5 =", prepend_bos=True)


def tokenizer(c: Ctx):
    """model.tokenizer"""
    return c.model.tokenizer


def generate(c: Ctx):
    """model.generate('3 5 =')"""
    c.model.generate("3 5 =", max_new_tokens=1)


def test_prompt(c: Ctx):
    """transformer_lens.utilities.test_prompt('3 5 =', '8', model)"""
    from transformer_lens.utilities import test_prompt as tl_test_prompt

    tl_test_prompt("3 5 =", "8", c.model, print_details=False)


def cfg_to_dict(c: Ctx):
    """model.cfg.to_dict() and cfg.model_name"""
    d = c.model.cfg.to_dict()
    for k in ("d_model", "n_layers", "n_ctx", "d_vocab", "d_vocab_out", "act_fn"):
        assert d[k] == getattr(c.model.cfg, k)
    assert d["normalization_type"] == c.model.cfg.normalization_type
    assert isinstance(c.model.cfg.model_name, str) and c.model.cfg.model_name == d["model_name"]


def cfg_tl_fields(c: Ctx):
    """cfg's TL fields: d_vocab / d_vocab_out / n_ctx / normalization_type (the norm in front of readers)"""
    cfg, data = c.model.cfg, c.data
    assert (cfg.d_vocab, cfg.d_vocab_out, cfg.n_ctx) == (data.d_vocab, data.d_vocab_out, data.n_ctx)
    want = {"ln": "LN", "rms": "RMS", "uniform": "LN"}.get(c.variant)
    assert cfg.normalization_type == want, cfg.normalization_type


def logit_lens(c: Ctx):
    """cache.logit_lens(): the last state reproduces the logits"""
    _, cache = c.run()
    close(cache.logit_lens().readout.values[-1], c.ref.logits[:, -1])


def tl_logit_lens(c: Ctx):
    """transformer_lens.tools.analysis.logit_lens(model, tokens)"""
    from transformer_lens.tools.analysis.logit_lens import logit_lens as tl_lens

    res = tl_lens(c.model, c.tokens)
    close(res.readout.values[-1], c.ref.logits[:, -1])


def tl_logit_readout(c: Ctx):
    """transformer_lens.tools.analysis.logit_readout(model, resid_post[-1])"""
    from transformer_lens.tools.analysis.logit_lens import logit_readout

    x = c.ref.acts[f"blocks.{c.L - 1}.hook_resid_post"][:, -1].float()
    close(logit_readout(c.model, x).values, c.ref.logits[:, -1])


def head_detector(c: Ctx):
    """transformer_lens.head_detector.detect_head(model, '3 5', 'previous_token_head')"""
    from transformer_lens.head_detector import detect_head

    got = detect_head(c.model, "3 5", "previous_token_head")
    pattern = c.reference(c.model.to_tokens("3 5")).acts
    want = torch.stack([pattern[f"blocks.{l}.attn.hook_pattern"][0, :, 1, 0] / 2 for l in range(c.L)])
    close(got, want)


SNIPPETS = [to_tokens, to_str_tokens_list, to_str_tokens_row, to_str_tokens_batch, to_string_batch, n_ctx_overflow,
            prefix_input, return_type_loss, loss_per_token, loss_fn, bad_return_type, prepend_bos, tokenizer, generate,
            test_prompt, cfg_to_dict, cfg_tl_fields, logit_lens, tl_logit_lens, tl_logit_readout, head_detector]
MLP_APPLIES = {"to_tokens", "to_str_tokens_list", "to_str_tokens_row", "to_str_tokens_batch", "to_string_batch",
               "n_ctx_overflow", "prefix_input", "return_type_loss", "loss_per_token", "loss_fn", "bad_return_type",
               "prepend_bos", "tokenizer", "generate", "test_prompt", "cfg_to_dict", "cfg_tl_fields", "logit_lens"}
_ALL = set(TRANSFORMERS) | {"mlp"}
EXPECT_REFUSE = {
    "to_str_tokens_batch": _ALL, "n_ctx_overflow": _ALL, "bad_return_type": _ALL, "prepend_bos": _ALL,
    "tokenizer": _ALL, "generate": _ALL, "test_prompt": _ALL,
    "prefix_input": {"mlp"},  # the MLP concatenates exactly n_ctx - 1 operand embeddings
    "logit_lens": {"mlp"},
}
NOT_APPLICABLE: dict[str, set[str]] = {}
