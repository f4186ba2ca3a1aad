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
