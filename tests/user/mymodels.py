from torch import nn


class MLPLM(nn.Module):
    """Token ids in, logits out: an embedding, residual MLP blocks, a head."""

    def __init__(self, vocab_size=512, dim=64, n_layers=2):
        super().__init__()
        self.vocab_size = vocab_size
        self.embed, self.head = nn.Embedding(vocab_size, dim), nn.Linear(dim, vocab_size)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, 4 * dim), nn.ReLU(),
                                                  nn.Linear(4 * dim, dim)) for _ in range(n_layers))

    def forward(self, tokens):
        h = self.embed(tokens)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)


# -- below: what the tests add (README's module ends above) --

class BatchNormLM(MLPLM):
    """With real buffers (BatchNorm's running statistics): DDP must broadcast them."""

    def __init__(self, vocab_size=512, dim=64, n_layers=2):
        super().__init__(vocab_size, dim, n_layers)
        self.bn = nn.BatchNorm1d(dim)

    def forward(self, tokens):
        h = self.embed(tokens)
        h = self.bn(h.transpose(1, 2)).transpose(1, 2)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)


class PerSequenceScore(nn.Module):
    """Breaks the contract: one value per sequence, not logits per token."""

    def __init__(self, vocab_size=512):
        super().__init__()
        self.vocab_size = vocab_size
        self.embed, self.score = nn.Embedding(vocab_size, 8), nn.Linear(8, 1)

    def forward(self, tokens):
        return self.score(self.embed(tokens).mean(1))


class PositionalLM(nn.Module):
    """Needs `max_seq_len` (a learned position table) and keeps no `vocab_size` attribute: both come from its YAML."""

    def __init__(self, vocab_size, dim, max_seq_len):
        super().__init__()
        self.embed, self.pos = nn.Embedding(vocab_size, dim), nn.Embedding(max_seq_len, dim)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim)) for _ in range(2))
        self.head = nn.Linear(dim, vocab_size)

    def forward(self, tokens):
        h = self.embed(tokens) + self.pos.weight[: tokens.shape[1]]   # past max_seq_len: too short, an error
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)


class CausalSelfAttention(nn.Module):
    """nanoGPT's attention: one fused projection whose rows are [Q | K | V], SDPA, an output projection. Under
    tensor parallelism the fused projection is `colwise` with `fused: 3` (docs/layouts.md): a rank's output is
    then [Q_r | K_r | V_r], split in 3 with `chunk`, its heads counted with -1."""

    def __init__(self, dim, n_head):
        super().__init__()
        self.head_dim = dim // n_head
        self.c_attn, self.c_proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x):
        import torch.nn.functional as F

        b, t, _ = x.shape
        q, k, v = (p.view(b, t, -1, self.head_dim).transpose(1, 2) for p in self.c_attn(x).chunk(3, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, -1))


class GPTBlock(nn.Module):
    def __init__(self, dim, n_head):
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(dim), CausalSelfAttention(dim, n_head), nn.LayerNorm(dim)
        self.fc, self.proj = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.proj(nn.functional.gelu(self.fc(self.ln_2(x))))


class TinyGPT(nn.Module):
    """A small GPT of the nanoGPT kind: learned positions, fused qkv, tied nothing."""

    def __init__(self, vocab_size=512, dim=64, n_head=4, n_layer=2, max_seq_len=128):
        super().__init__()
        self.vocab_size = vocab_size
        self.wte, self.wpe = nn.Embedding(vocab_size, dim), nn.Embedding(max_seq_len, dim)
        self.h = nn.ModuleList(GPTBlock(dim, n_head) for _ in range(n_layer))
        self.ln_f, self.lm_head = nn.LayerNorm(dim), nn.Linear(dim, vocab_size, bias=False)

    def forward(self, tokens):
        x = self.wte(tokens) + self.wpe.weight[: tokens.shape[1]]
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class FailsAtStep(MLPLM):
    """Raises a long error (as DTensor's sharding errors are) in its third real forward: a rank's failure."""

    def __init__(self, vocab_size=512, dim=64, n_layers=2):
        super().__init__(vocab_size, dim, n_layers)
        self.calls = 0

    def forward(self, tokens):
        import torch

        if type(tokens) is torch.Tensor and tokens.device.type != "meta":   # a real batch, not a probe
            self.calls += 1
            if self.calls == 3:
                raise RuntimeError("a long error: " + "spec " * 2000)
        return super().forward(tokens)


class StackedExperts(nn.Module):
    """E experts' weights stacked along dim 0, called as transformers' are: experts(hidden, top_k_index,
    top_k_weights) -> each token's weighted sum over its k experts; `num_experts` says how many it holds."""

    def __init__(self, num_experts, dim, hidden):
        import torch

        super().__init__()
        self.num_experts = num_experts
        self.w_in = nn.Parameter(torch.randn(num_experts, dim, hidden) * dim ** -0.5)
        self.w_out = nn.Parameter(torch.randn(num_experts, hidden, dim) * hidden ** -0.5)

    def forward(self, hidden, top_k_index, top_k_weights):
        import torch

        out = torch.zeros_like(hidden)
        for e in range(self.num_experts):
            token, slot = torch.where(top_k_index == e)
            y = torch.relu(hidden[token] @ self.w_in[e]) @ self.w_out[e]
            out = out.index_add(0, token, y * top_k_weights[token, slot, None])
        return out


class Mixture(nn.Module):
    """A softmax router's top k of the experts, its weights renormalised (Mixtral's): a mixture by ablate's rule
    (`top_k`, and `experts` with `num_experts`)."""

    def __init__(self, dim, num_experts, top_k, hidden):
        super().__init__()
        self.top_k, self.router = top_k, nn.Linear(dim, num_experts, bias=False)
        self.experts = StackedExperts(num_experts, dim, hidden)

    def forward(self, x):
        h = x.reshape(-1, x.shape[-1])
        weights, index = self.router(h).softmax(-1).topk(self.top_k, dim=-1)
        return self.experts(h, index, weights / weights.sum(-1, keepdim=True)).view_as(x)


class MixtureLM(MLPLM):
    """MLPLM whose blocks' MLPs are mixtures of experts."""

    def __init__(self, vocab_size=512, dim=64, n_layers=2, num_experts=4, top_k=2):
        super().__init__(vocab_size, dim, n_layers)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(dim), Mixture(dim, num_experts, top_k, 2 * dim))
                                    for _ in range(n_layers))
