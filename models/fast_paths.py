"""The transformer's fast attention paths: Attention.forward's output (models/transformer.py, the
hooked reference) computed with no hook inside, taken only where no hook can see it (Transformer.forward
chooses; docs/TRANSFORMERLENS.md, docs/PERFORMANCE.md):
    sdpa   torch's fused scaled_dot_product_attention (on CUDA by default; `_sdpa`)
    lean   the fewest large products, plain torch operations, on any device (`_lean`)
    table  the lean path of a first block whose input is a function of (position, token): projections
           and scores once per (position, token) pair, gathered per input (`table`, `own_value`)
Each gives the reference's output and gradients to float32 rounding (tests/models/test_fast_path.py);
the reference stays the path of record and of every hook.
Shapes: b batch, p position, d d_model, h head, e d_head, q query positions, k key positions.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


class AttentionFastPaths:
    """Mixed into transformer.Attention, whose state these read: cfg, W_Q / W_K / W_V / W_O, the
    `allowed` keys, `masked`, `last_sees_all`, and the patterns `_uniform` and `_with_rate`."""

    def _lean(self, x: torch.Tensor, query: slice | None, xq: torch.Tensor | None = None,
              scores_to: dict | None = None) -> torch.Tensor:
        """The same output from [b, p, d] inputs, with no hook inside, as few large products: K and
        V each in one matmul [b*p, d] @ [d, h e], Q in one (at the query positions only), the output
        projection in one [b*q, h e] @ [h e, d]; a short sequence's scores and mixing (p <= 8 keys)
        as broadcast products instead of many tiny batched matmuls. Device-agnostic.
        `scores_to`: a dict that receives hook_attn_scores' tensor (`_record_scores`)."""
        cfg = self.cfg
        b, n, d = x.shape
        h, e = cfg.n_heads, cfg.d_head
        if xq is None:
            xq = x if query is None else x[:, query]
        nq = xq.shape[1]
        flat = x.reshape(b * n, d)
        if cfg.attention == "uniform":  # pattern = 1 / (allowed keys), whatever q and k are
            v = self._project(flat, self.W_V).view(b, n, h, e)
            pattern = self._uniform_pattern(n, query, x)
        else:
            # K and V apart: contiguous, the broadcast products below run ~1.4x faster than on views of one [d, 2he]
            # product
            k, v = (self._project(flat, w).view(b, n, h, e) for w in (self.W_K, self.W_V))
            q = self._project(xq.reshape(b * nq, d), self.W_Q).view(b, nq, h, e)
            if n <= 8:
                scores = (q[:, :, None] * k[:, None]).sum(-1)  # [b, q, k, h]
            else:
                scores = torch.einsum("bqhe,bkhe->bqkh", q, k)
            scores = self._mask_scores(scores / math.sqrt(e), n, query)
            self._record_scores(scores_to, scores)
            pattern = self._with_rate(scores.softmax(dim=2), n, query, x, per_head_last=True)
        return self._mix(pattern, v)

    def _sdpa(self, x: torch.Tensor, query: slice | None) -> torch.Tensor:
        """The same output from [b, p, d] inputs, with no hook inside. The projections are the
        explicit path's einsums (one matmul each; under torch.func.vmap, as in the ensemble, they
        give the single run's numbers bit for bit); the softmax attention is torch's fused kernel."""
        n = x.shape[1]
        mask = self.allowed[:n, :n] if query is None else self.allowed[query, :n]
        v = torch.einsum("bpd,hde->bhpe", x, self.W_V)
        if self.cfg.attention == "uniform":  # pattern = 1 / (allowed keys), whatever q and k are
            z = self._uniform(n, query, x) @ v  # [b, h, q, e]
        else:
            xq = x if query is None else x[:, query]
            q = torch.einsum("bpd,hde->bhpe", xq, self.W_Q)
            k = torch.einsum("bpd,hde->bhpe", x, self.W_K)
            if not self.masked or (self.last_sees_all and query is not None and query.start == n - 1):
                mask = None  # every query sees every key (bidirectional, or the last position only)
            z = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=False)
            if (r := self.cfg.attention_rate) != 1:  # the mixture's pattern times v, as two products
                z = z * r + (self._uniform(n, query, x) @ v) * (1 - r)
        return torch.einsum("bhqe,hed->bqd", z, self.W_O)

    def table(self, x_tab: torch.Tensor, ids: torch.Tensor, query: slice | None,
              scores_to: dict | None = None) -> torch.Tensor:
        """The lean output where the input is a function of (position, token), as in the first
        block: x_tab [n, V, d] is the attention input of every position and token, ids [b, n]
        each input's row in x_tab.view(n V, d). K, V and Q are projected on the table's n V rows
        instead of the batch's b n, and the scores of every query row against every key row are
        one [h, nq V, n V] product, from which each input gathers its own; only the mixing with
        the pattern and the output projection run per input. The same numbers as `_lean` to float32
        rounding (the sums of the gathered gradients run in another order)."""
        n, V, d = x_tab.shape
        h, e = self.cfg.n_heads, self.cfg.d_head
        flat = x_tab.reshape(n * V, d)
        v = F.embedding(ids, self._project(flat, self.W_V)).view(*ids.shape, h, e)
        if self.cfg.attention == "uniform":  # pattern = 1 / (allowed keys), whatever q and k are
            return self._mix(self._uniform_pattern(n, query, x_tab), v)
        # the first query position (a slice may count from the end)
        start = 0 if query is None else range(n)[query].start
        q_rows = flat if query is None else x_tab[query].reshape(-1, d)  # [nq V, d]
        q_tab = self._project(q_rows, self.W_Q).view(-1, h, e).transpose(0, 1)  # [h, nq V, e]
        k_tab = self._project(flat, self.W_K).view(-1, h, e).permute(1, 2, 0)  # [h, e, n V]
        s_tab = ((q_tab @ k_tab) / math.sqrt(e)).permute(1, 2, 0).reshape(-1, h)  # [(nq V) (n V), h]
        q_ids = ids if query is None else ids[:, query]
        pairs = (q_ids - start * V)[:, :, None] * (n * V) + ids[:, None, :]  # [b, q, k]: each score's row
        scores = self._mask_scores(F.embedding(pairs, s_tab), n, query)  # [b, q, k, h]
        self._record_scores(scores_to, scores)
        return self._mix(self._with_rate(scores.softmax(dim=2), n, query, x_tab, per_head_last=True), v)

    def own_value(self, x: torch.Tensor) -> torch.Tensor:
        """The output [r, d] of a query that sees only its own key (softmax or uniform pattern 1
        on it): its value vector through the output projection, for inputs x [r, d]."""
        h, e = self.cfg.n_heads, self.cfg.d_head
        return self._project(x, self.W_V) @ self.W_O.reshape(h * e, -1)

    @staticmethod
    def _project(flat: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """[r, d] @ W [h, d, e] -> [r, h e], one matmul."""
        return flat @ w.permute(1, 0, 2).reshape(w.shape[1], -1)

    def _mask_scores(self, scores: torch.Tensor, n: int, query: slice | None) -> torch.Tensor:
        """The mask on scores [b, q, k, h] (none needed when the only query is the last position and it
        sees every key)."""
        if self.masked and not (self.last_sees_all and query is not None and query.start == n - 1):
            mask = self.allowed[:n, :n] if query is None else self.allowed[query, :n]
            scores = scores.masked_fill(~mask[None, :, :, None], float("-inf"))
        return scores

    def _record_scores(self, scores_to: dict | None, scores: torch.Tensor) -> None:
        """Store the masked scores [b, q, k, h] in `scores_to` under hook_attn_scores' name, as that
        hook sees them ([b, h, q, k], the query positions computed): a regularizer term reads them
        with no hook attached (Transformer.site_capture), in the graph."""
        if scores_to is not None:
            scores_to[self.hook_attn_scores.name] = scores.permute(0, 3, 1, 2)

    def _mix(self, pattern: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """pattern [b|1, q, k, h|1] times v [b, k, h, e], then the output projection: [b, q, d]."""
        b, n, h, e = v.shape
        nq = pattern.shape[1]
        # a single (readout) query broadcasts at any length: at 9 keys its einsum, a batched matmul of
        # inner size 1 in the backward pass, and its permute copies took a third of the structural-attention step
        if n <= 8 or nq == 1:
            z = (pattern[..., None] * v[:, None]).sum(2)  # [b, q, h, e]
        else:
            z = torch.einsum("bqkh,bkhe->bqhe", pattern.expand(b, -1, -1, h), v)
        return (z.reshape(b * nq, h * e) @ self.W_O.reshape(h * e, -1)).view(b, nq, -1)

    def _uniform_pattern(self, n: int, query: slice | None, like: torch.Tensor) -> torch.Tensor:
        """attention=uniform on the lean paths' layout: [1, q, k, 1]."""
        return self._uniform(n, query, like)[None, :, :, None]
