"""Text classifiers over int64 token ids (N x L, right-padded with id 0), PFLlib's text models on the head
contract: each keeps its classifier in ``fc`` and returns raw logits. ``hidden`` is ``-fd`` (PFLlib's
``feature_dim``: the embedding and hidden width), ``vocab_size`` comes from the split's config (else ``-vs``)
and ``max_len`` is the split's sequence length L.

Where PFLlib processes padding as if it were text (its texts are all 200 tokens long, so its LSTM reads the
padding and its fastText divides by 200), these models leave the padding out: fastText and TextCNN zero the
padding's embeddings and fastText averages over the real tokens, the LSTMs read each text's states at its
last real token, and the Transformer masks padded keys. No model branches on the data (no packed
sequences, no ``.item()``), so ``torch.func.vmap`` can take per-sample gradients of each (``-dp``).
"""
from __future__ import annotations

import math

import torch
from torch import nn

PAD = 0  # the padding id of every text split


def _check_tokens(x: torch.Tensor, model: str) -> None:
    if x.is_floating_point():
        raise ValueError(f"{model} takes int64 token ids (N x L), got {x.dtype} inputs; use a model for "
                         f"vectors or images (-m auto picks one)")


def _token_mask(x: torch.Tensor) -> torch.Tensor:
    """N x L x 1: 1.0 at real tokens, 0.0 at padding."""
    return (x != PAD).unsqueeze(-1).float()


def _lengths(x: torch.Tensor) -> torch.Tensor:
    """Real tokens per text, N (at least 1, so an all-padding text still has a state)."""
    return (x != PAD).sum(1).clamp_min(1)


def _at(out: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``out[i, index[i]]`` for N x L x d outputs: N x d."""
    return out.gather(1, index.view(-1, 1, 1).expand(-1, 1, out.size(2))).squeeze(1)


def _reversed_text(x: torch.Tensor) -> torch.Tensor:
    """Each text's real tokens in reverse order, its padding left where it was (right)."""
    t = torch.arange(x.size(1), device=x.device).expand_as(x)
    n = _lengths(x).unsqueeze(1)
    return x.gather(1, torch.where(t < n, n - 1 - t, t))


class FastText(nn.Module):
    """fastText (Joulin et al., EACL 2017, "Bag of Tricks for Efficient Text Classification") in PFLlib's
    shape: embedding (d = -fd) -> mean over the text's tokens -> fc1 (d -> d, no activation) -> fc (d -> C)."""

    def __init__(self, vocab_size: int, num_classes: int, hidden: int = 512):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, hidden, padding_idx=PAD)
        self.fc1 = nn.Linear(hidden, hidden)
        self.fc = nn.Linear(hidden, num_classes)

    def forward(self, x):
        _check_tokens(x, "fastText")
        mask = _token_mask(x)
        mean = (self.embedding(x) * mask).sum(1) / mask.sum(1).clamp_min(1.0)  # N x d
        return self.fc(self.fc1(mean))


class TextCNN(nn.Module):
    """TextCNN (Kim, EMNLP 2014, "Convolutional Neural Networks for Sentence Classification"): embedding
    (d = -fd) -> three 1-d convolutions (100 maps each, widths 3/4/5) + ReLU, each max-pooled over time ->
    concatenation (300) -> dropout -> fc. Dropout 0.5 is the paper's (PFLlib: 0.8)."""

    def __init__(self, vocab_size: int, num_classes: int, hidden: int = 512, max_len: int = 200,
                 channels: int = 100, kernels: tuple[int, ...] = (3, 4, 5), dropout: float = 0.5):
        super().__init__()
        if max_len < max(kernels):
            raise ValueError(f"TextCNN's widest convolution spans {max(kernels)} tokens; the texts have {max_len}")
        self.embedding = nn.Embedding(vocab_size, hidden, padding_idx=PAD)
        for i, k in enumerate(kernels, 1):  # conv1, conv2, conv3: PFLlib's names
            setattr(self, f"conv{i}", nn.Sequential(nn.Conv1d(hidden, channels, k), nn.ReLU(),
                                                    nn.MaxPool1d(max_len - k + 1)))
        self.n_convs = len(kernels)
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(channels * len(kernels), num_classes)

    def forward(self, x):
        _check_tokens(x, "TextCNN")
        e = (self.embedding(x) * _token_mask(x)).permute(0, 2, 1)  # N x d x L
        feats = [getattr(self, f"conv{i}")(e).squeeze(2) for i in range(1, self.n_convs + 1)]
        return self.fc(self.dropout(torch.cat(feats, 1)))


class LSTMNet(nn.Module):
    """PFLlib's LSTMNet: embedding (d = -fd) -> 2-layer LSTM (hidden d, dropout 0.2 between layers) ->
    the top layer's output at the text's last real token (PFLlib: at position L) -> ReLU -> dropout 0.2 -> fc."""

    def __init__(self, vocab_size: int, num_classes: int, hidden: int = 512, num_layers: int = 2,
                 dropout: float = 0.2):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, hidden, padding_idx=PAD)
        self.lstm = nn.LSTM(hidden, hidden, num_layers=num_layers, dropout=dropout, batch_first=True)
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(hidden, num_classes)

    def forward(self, x):
        _check_tokens(x, "LSTM")
        out, _ = self.lstm(self.embedding(x))  # N x L x d; a state depends only on the tokens before it
        return self.fc(self.dropout(torch.relu(_at(out, _lengths(x) - 1))))


class BiLSTM(nn.Module):
    """PFLlib's BiLSTM_TextClassification (from FedNLP) as PFLlib builds it (one layer, no dropout, no
    attention): embedding (d = -fd) -> a bidirectional LSTM (hidden d) -> both directions' final states
    (forward after the last real token, backward after the first) -> fc1 (2d -> d, no activation) -> fc.
    PFLlib instead reads both directions at position L, where its backward direction has seen one token.
    The two directions are two LSTMs (``lstm_layer``, ``lstm_layer_reverse``), the second reading each text's
    real tokens reversed, so neither reads padding before a real token."""

    def __init__(self, vocab_size: int, num_classes: int, hidden: int = 512):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, hidden, padding_idx=PAD)
        self.lstm_layer = nn.LSTM(hidden, hidden, batch_first=True)
        self.lstm_layer_reverse = nn.LSTM(hidden, hidden, batch_first=True)
        self.fc1 = nn.Linear(2 * hidden, hidden)
        self.fc = nn.Linear(hidden, num_classes)

    def forward(self, x):
        _check_tokens(x, "BiLSTM")
        last = _lengths(x) - 1
        forward, _ = self.lstm_layer(self.word_embeddings(x))
        backward, _ = self.lstm_layer_reverse(self.word_embeddings(_reversed_text(x)))
        return self.fc(self.fc1(torch.cat([_at(forward, last), _at(backward, last)], 1)))


class PositionalEncoding(nn.Module):
    """Sinusoidal positions (Vaswani et al. 2017) added to N x L x d inputs, then dropout. The table is a
    non-persistent buffer: the same on every client, so it never crosses the wire."""

    def __init__(self, d_model: int, dropout: float = 0.1, max_len: int = 200):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        position = torch.arange(max_len, dtype=torch.float32).unsqueeze(1)
        div = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(1, max_len, d_model)
        pe[0, :, 0::2] = torch.sin(position * div)
        pe[0, :, 1::2] = torch.cos(position * div)
        self.register_buffer("pe", pe, persistent=False)

    def forward(self, x):
        return self.dropout(x + self.pe[:, :x.size(1)])


class TransformerClassifier(nn.Module):
    """PFLlib's TransformerModel: embedding (d = -fd) * sqrt(d) + sinusoidal positions -> 2 encoder layers
    (8 heads, feed-forward 2048, dropout 0.1) -> the first token's output -> fc. Padded keys are masked
    (PFLlib attends to padding)."""

    def __init__(self, vocab_size: int, num_classes: int, d_model: int = 512, max_len: int = 200,
                 nhead: int = 8, nlayers: int = 2, d_hid: int = 2048, dropout: float = 0.1):
        super().__init__()
        if d_model % nhead:
            raise ValueError(f"the Transformer's width -fd {d_model} must be a multiple of its {nhead} heads")
        self.d_model = d_model
        self.embedding = nn.Embedding(vocab_size, d_model)
        self.pos_encoder = PositionalEncoding(d_model, dropout, max_len)
        layer = nn.TransformerEncoderLayer(d_model, nhead, d_hid, dropout, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, nlayers, enable_nested_tensor=False)
        self.fc = nn.Linear(d_model, num_classes)
        nn.init.uniform_(self.embedding.weight, -0.1, 0.1)  # PFLlib's (and the PyTorch tutorial's) init
        nn.init.uniform_(self.fc.weight, -0.1, 0.1)
        nn.init.zeros_(self.fc.bias)

    def forward(self, x):
        _check_tokens(x, "Transformer")
        pad = x == PAD
        pad[:, 0] = False  # the pooled first position always attends, so an all-padding text stays finite
        h = self.pos_encoder(self.embedding(x) * math.sqrt(self.d_model))
        return self.fc(self.encoder(h, src_key_padding_mask=pad)[:, 0])
