"""The residual stream of a post-norm or sphere model as a sum of carried components: the
decompositions GroklensCache returns on those variants (the meaning: groklens.models.cache).

Stream bookkeeping: norm j = 0 is ln_embed (after the embedding sum), j = 2l+1 is blocks.{l}.ln1
(after the attention sum), j = 2l+2 is blocks.{l}.ln2 (after the MLP sum). A component added at
sum k (embeddings 0, layer l's attention 2l+1, its MLP 2l+2) passes norms k, k+1, ...; a reader's
target t is the stream after norm t: t = 2l for layer l's attention input (resid_pre l), 2l+1 for
its MLP input (resid_mid l), 2L for the unembedding (the last resid_post). Carried through norms
k..t with the cached scales s_j: P_t(...P_k(x) w_k ... ) w_t * prod_j 1/s_j, where P_j centres
(LayerNorm) and w_j is the norm's weight; the scales are scalars per position, so they factor
out of the position-independent part, which is what lets a neuron's W_out row be carried once.
"""

from __future__ import annotations

import torch
from transformer_lens.utilities import Slice

from groklens.models.tl_errors import TLUnsupported

_TARGET = "_groklens_target"  # attribute of a stack: the target index it was carried to, or "state"
STATE = "state"


def tag_stack(stack: torch.Tensor, target: int | str) -> torch.Tensor:
    """`stack` (a copy when it is a view) marked as built for `target`: a later call that carries
    it to another target knows what it holds."""
    if stack._base is not None:
        stack = stack.clone()
    setattr(stack, _TARGET, target)
    return stack


def target_of(stack: torch.Tensor) -> int | str | None:
    """The tag of a stack, or of the stack it is a view of (a slice of positions, rows or batch)."""
    for t in (stack, stack._base):
        if t is not None and getattr(t, _TARGET, None) is not None:
            return getattr(t, _TARGET)
    return None


def _as_slice(s) -> Slice:
    return s if isinstance(s, Slice) else Slice(s)


class Stream:
    def __init__(self, cache, pos_slice=None, batch_slice=None):
        self.cache, self.model = cache, cache.model
        self.L = self.model.cfg.n_layers
        self.pos = _as_slice(pos_slice)
        self.batch = None if batch_slice is None else _as_slice(batch_slice)

    def target(self, layer: int | None, mlp_input: bool = False) -> int:
        layer = self.L if layer is None or layer == -1 else layer
        if not 0 <= layer <= self.L or (mlp_input and layer == self.L):
            raise TLUnsupported(f"layer {layer}{' with mlp_input' if mlp_input else ''}: this model's readers are "
                                f"layers 0..{self.L - 1} (attention or MLP input) and the unembedding (layer {self.L} "
                                "or -1)")
        return 2 * layer + int(mlp_input)

    def norm(self, j: int):
        """(module, hook prefix) of stream norm j."""
        if j == 0:
            return self.model.ln_embed, "ln_embed"
        l, which = divmod(j - 1, 2)
        return getattr(self.model.blocks[l], f"ln{which + 1}"), f"blocks.{l}.ln{which + 1}"

    def stream(self, t: int) -> torch.Tensor:
        """The stream at target t, at the positions of pos_slice."""
        l, mid = divmod(t, 2)
        name = ("resid_post", self.L - 1) if t == 2 * self.L else (("resid_mid" if mid else "resid_pre"), l)
        return self.pos.apply(self.cache[name], dim=-2)

    def linear(self, x: torch.Tensor, first: int, last: int) -> torch.Tensor:
        """Norms first..last without their scales: centring (LayerNorm) and weight, in order."""
        for j in range(first, last + 1):
            mod, _ = self.norm(j)
            if getattr(mod, "kind", None) == "ln":
                x = x - x.mean(-1, keepdim=True)
            w = getattr(mod, "w", None)
            if w is not None:
                x = x * w
        return x

    def inv_scale(self, first: int, last: int):
        """prod_j 1 / s_j over norms first..last, [batch, pos, 1] sliced as the stack (or 1.0)."""
        out = 1.0
        for j in range(first, last + 1):
            s = self.pos.apply(self.cache[f"{self.norm(j)[1]}.hook_scale"], dim=-2)
            if self.batch is not None and self.cache.has_batch_dim:
                s = self.batch.apply(s)
            out = out / s
        return out

    def carry(self, x: torch.Tensor, entry: int, t: int) -> torch.Tensor:
        """x (added at sum `entry`, trailing dims [batch, pos, d] as the scales) carried to target t."""
        return self.linear(x, entry, t) * self.inv_scale(entry, t) if entry <= t else x

    def bias(self, t: int, like: torch.Tensor, mlp_biases: bool) -> torch.Tensor:
        """The norms' biases (and with mlp_biases each b_out) carried to target t, shaped like `like`."""
        total = torch.zeros_like(like)
        for j in range(t + 1):
            b = getattr(self.norm(j)[0], "b", None)
            if b is not None:
                total = total + self.carry(b, j + 1, t)
        for l in range(self.L) if mlp_biases else ():
            b_out = self.model.blocks[l].mlp.b_out
            if b_out is not None and 2 * l + 2 <= t:
                total = total + self.carry(b_out, 2 * l + 2, t)
        return total

    def has_norm_bias(self) -> bool:
        return getattr(self.model.ln_embed, "b", None) is not None

    # ------------------------------------------------------------------ rows
    def heads(self, layers: range, t: int) -> tuple[list[torch.Tensor], list[str]]:
        self.cache._ensure_head_results()
        rows, labels = [], []
        for l in layers:
            result = self.pos.apply(self.cache[("result", l, "attn")], dim=-3)  # [b, (p), h, d]
            rows.append(self.carry(result.movedim(-2, 0), 2 * l + 1, t))
            labels += [f"L{l}H{h}" for h in range(self.model.cfg.n_heads)]
        return rows, labels

    def neurons(self, layers: range, t: int, neuron_slice: Slice, project: torch.Tensor | None):
        """Each neuron's a_n W_out[n] carried to t (projected onto `project` [d, k] if given)."""
        rows, labels = [], []
        ids = neuron_slice.apply(torch.arange(self.model.cfg.d_mlp), dim=0)
        for l in layers:
            mlp = self.model.blocks[l].mlp
            a = neuron_slice.apply(self.pos.apply(self.cache[("post", l, "mlp")], dim=-2), dim=-1)  # [b, (p), m]
            W = self.linear(neuron_slice.apply(mlp.W_out, dim=0), 2 * l + 2, t)  # [m, d]
            W = W if project is None else W @ project
            rows.append(((a * self.inv_scale(2 * l + 2, t))[..., None] * W).movedim(-2, 0))
            labels += [f"L{l}N{int(n)}" for n in ids]
        return rows, labels

    def component(self, name, entry: int, t: int) -> torch.Tensor:
        return self.carry(self.pos.apply(self.cache[name], dim=-2), entry, t)


def _projection(p: torch.Tensor | None) -> tuple[torch.Tensor | None, bool]:
    if p is None:
        return None, False
    return (p[:, None], True) if p.ndim == 1 else (p, False)


def _empty(s: Stream, last: int | None = None) -> torch.Tensor:
    src = s.pos.apply(s.cache["hook_embed"], dim=-2)
    shape = src.shape if last is None else (*src.shape[:-1], last)
    return torch.zeros(0, *shape, dtype=src.dtype, device=src.device)


def decompose_resid(cache, layer, mlp_input, mode, pos_slice, incl_embeds, return_labels):
    s = Stream(cache, pos_slice)
    t = s.target(layer, mlp_input)
    layer = t // 2
    incl_attn, incl_mlp = mode != "mlp", mode != "attn" and not s.model.cfg.attn_only
    rows, labels = [], []
    if incl_embeds:
        for name, label in (("hook_embed", "embed"), ("hook_pos_embed", "pos_embed")):
            if name in cache.cache_dict:
                rows.append(s.component(name, 0, t))
                labels.append(label)
    for l in range(layer + int(mlp_input)):
        if incl_attn:
            rows.append(s.component(("attn_out", l), 2 * l + 1, t))
            labels.append(f"{l}_attn_out")
        if incl_mlp and l < layer:
            rows.append(s.component(("mlp_out", l), 2 * l + 2, t))
            labels.append(f"{l}_mlp_out")
    if mode == "all" and incl_embeds and rows and s.has_norm_bias():  # the stream holds the norms' biases too
        rows.append(s.bias(t, rows[0], mlp_biases=False))
        labels.append("bias")
    stack = tag_stack(torch.stack(rows), t)
    return (stack, labels) if return_labels else stack


def stack_head_results(cache, layer, return_labels, incl_remainder, pos_slice):
    s = Stream(cache, pos_slice)
    t = s.target(layer)
    rows, labels = s.heads(range(t // 2), t)
    stack = torch.cat(rows) if rows else _empty(s)
    if incl_remainder:
        stack = torch.cat([stack, (s.stream(t) - stack.sum(0))[None]])
        labels.append("remainder")
    stack = tag_stack(stack, t)
    return (stack, labels) if return_labels else stack


def stack_neuron_results(cache, layer, pos_slice, neuron_slice, return_labels, incl_remainder, project, mlp_input):
    s = Stream(cache, pos_slice)
    layer = s.L if layer is None or layer == -1 else layer
    # TL: layer 0 (not mlp_input) with a remainder is the whole model, resid_post of the last layer
    t = 2 * s.L if layer == 0 and not mlp_input else s.target(layer, mlp_input)
    neuron_slice = Slice.unwrap(neuron_slice)
    if neuron_slice.mode == "int":
        neuron_slice = Slice([neuron_slice.slice])
    P, squeeze = _projection(project)
    rows, labels = s.neurons(range(layer), t, neuron_slice, P)
    stack = torch.cat(rows) if rows else _empty(s, None if P is None else P.shape[-1])
    if incl_remainder:
        target = s.stream(t) if P is None else s.stream(t) @ P
        stack = torch.cat([stack, (target - stack.sum(0))[None]])
        labels.append("remainder")
    stack = stack.squeeze(-1) if squeeze else stack
    stack = tag_stack(stack, t) if P is None else stack
    return (stack, labels) if return_labels else stack


def full_resid_decomposition(cache, layer, mlp_input, expand_neurons, pos_slice, return_labels, project):
    s = Stream(cache, pos_slice)
    t = s.target(layer, mlp_input)
    layer = t // 2
    P, squeeze = _projection(project)
    proj = (lambda x: x) if P is None else (lambda x: x @ P)
    rows, labels = s.heads(range(layer + int(mlp_input)), t)
    rows = [proj(r) for r in rows]
    if layer > 0 and not s.model.cfg.attn_only:
        if expand_neurons:
            more, names = s.neurons(range(layer), t, Slice(None), P)
        else:
            more = [proj(s.component(("mlp_out", l), 2 * l + 2, t))[None] for l in range(layer)]
            names = [f"{l}_mlp_out" for l in range(layer)]
        rows, labels = rows + more, labels + names
    embeds = [s.component(name, 0, t) for name in ("hook_embed", "hook_pos_embed")]
    rows += [proj(e)[None] for e in embeds] + [proj(s.bias(t, embeds[0], mlp_biases=expand_neurons))[None]]
    labels += ["embed", "pos_embed", "bias"]
    stack = torch.cat(rows)
    stack = stack.squeeze(-1) if squeeze else stack
    stack = tag_stack(stack, t) if P is None else stack
    return (stack, labels) if return_labels else stack


def carry_stack(cache, stack, built_for, layer, mlp_input, pos_slice, batch_slice, has_batch_dim):
    """apply_ln_to_stack on a post-norm or sphere model (groklens.models.cache)."""
    s = Stream(cache, pos_slice, batch_slice)
    t = s.target(layer, mlp_input)
    if has_batch_dim:
        stack = _as_slice(batch_slice).apply(stack, dim=1)
    if built_for is None:
        raise TLUnsupported("apply_ln_to_stack: after a norm on every residual sum, a component's contribution "
                            "depends on where it entered the stream, which this stack does not say; pass a stack "
                            "straight from decompose_resid, stack_head_results, stack_neuron_results, "
                            "get_full_resid_decomposition or accumulated_resid")
    if built_for == STATE or built_for == t:
        return stack
    if built_for > t:
        raise TLUnsupported(f"apply_ln_to_stack: this stack was carried to a later point of the stream than layer "
                            f"{layer}{' (mlp_input)' if mlp_input else ''}; build it for that layer instead")
    return s.carry(stack, built_for + 1, t)
