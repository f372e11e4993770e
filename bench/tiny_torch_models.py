"""Tiny pure-torch versions of the architectures issue #27 names, for ``bench/export_models.py``.

Written here (no transformers, no torchvision) the way the originals compute their shapes, so the
exporter leaves the same patterns in the graph: window attention whose ``Pad`` amounts come from
the input's height and width (Swin), a U-Net with self-attention over a 64×64 latent, a GPT-2-style
decoder (positions from ``arange``, a causal mask cut from the sequence length), and BERT (extended
attention mask, token types, pooler). Needs torch; imported only by the export script.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F


class WindowBlock(nn.Module):
    """Swin block: LayerNorm, optional cyclic shift, pad H and W up to the window, window attention,
    un-pad, MLP. The pads are ``(window - size % window) % window`` of the runtime size."""

    def __init__(self, dim: int, heads: int, window: int, shift: int) -> None:
        super().__init__()
        self.heads, self.window, self.shift = heads, window, shift
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.bias = nn.Parameter(torch.randn(heads, window * window, window * window) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, H, W, C]
        b, h, w, c = x.shape
        ws = self.window
        y = self.norm1(x)
        pad_h = (ws - h % ws) % ws
        pad_w = (ws - w % ws) % ws
        y = F.pad(y, (0, 0, 0, pad_w, 0, pad_h))
        if self.shift:
            y = torch.roll(y, shifts=(-self.shift, -self.shift), dims=(1, 2))
        hp, wp = y.shape[1], y.shape[2]
        windows = y.view(b, hp // ws, ws, wp // ws, ws, c).permute(0, 1, 3, 2, 4, 5)
        windows = windows.reshape(-1, ws * ws, c)
        qkv = self.qkv(windows).reshape(windows.shape[0], ws * ws, 3, self.heads, c // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        attn = (q @ k.transpose(-2, -1)) * (c // self.heads) ** -0.5 + self.bias
        out = (attn.softmax(-1) @ v).transpose(1, 2).reshape(-1, ws * ws, c)
        out = self.proj(out).view(b, hp // ws, wp // ws, ws, ws, c).permute(0, 1, 3, 2, 4, 5)
        out = out.reshape(b, hp, wp, c)
        if self.shift:
            out = torch.roll(out, shifts=(self.shift, self.shift), dims=(1, 2))
        x = x + out[:, :h, :w, :]
        return x + self.mlp(self.norm2(x))


class TinySwin(nn.Module):
    """Patch embedding (4×4), two window blocks (the second shifted), patch merging, a classifier."""

    def __init__(self, dim: int = 32, window: int = 7, classes: int = 10) -> None:
        super().__init__()
        self.embed = nn.Conv2d(3, dim, 4, stride=4)
        self.blocks = nn.ModuleList(
            [WindowBlock(dim, 2, window, 0), WindowBlock(dim, 2, window, window // 2)]
        )
        self.merge = nn.Linear(4 * dim, 2 * dim)
        self.head = nn.Linear(2 * dim, classes)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x = self.embed(pixel_values).permute(0, 2, 3, 1)
        for block in self.blocks:
            x = block(x)
        h, w = x.shape[1], x.shape[2]
        x = F.pad(x, (0, 0, 0, w % 2, 0, h % 2))
        x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], -1)
        return self.head(self.merge(x).mean(dim=(1, 2)))


class ResBlock(nn.Module):
    def __init__(self, cin: int, cout: int, temb: int) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(8, cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.time = nn.Linear(temb, cout)
        self.norm2 = nn.GroupNorm(8, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x))) + self.time(F.silu(t))[:, :, None, None]
        return self.skip(x) + self.conv2(F.silu(self.norm2(h)))


class SelfAttention(nn.Module):
    """One-head self-attention over every pixel: at 64×64 a [4096, 4096] score matrix."""

    def __init__(self, ch: int) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(8, ch)
        self.qkv = nn.Linear(ch, 3 * ch)
        self.out = nn.Linear(ch, ch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        y = self.norm(x).view(b, c, h * w).transpose(1, 2)
        q, k, v = self.qkv(y).chunk(3, dim=-1)
        attn = torch.softmax((q * c**-0.5) @ k.transpose(1, 2), dim=-1)  # scaled before, as timm
        out = self.out(attn @ v).transpose(1, 2).reshape(b, c, h, w)
        return x + out


class TinyUNet(nn.Module):
    """A two-level conditional-on-timestep U-Net with self-attention at the full latent size."""

    def __init__(self, ch: int = 16, temb: int = 32) -> None:
        super().__init__()
        self.temb = temb
        self.time = nn.Sequential(nn.Linear(temb, temb), nn.SiLU(), nn.Linear(temb, temb))
        self.conv_in = nn.Conv2d(4, ch, 3, padding=1)
        self.down1 = ResBlock(ch, ch, temb)
        self.attn1 = SelfAttention(ch)
        self.pool = nn.Conv2d(ch, ch, 3, stride=2, padding=1)
        self.mid = ResBlock(ch, 2 * ch, temb)
        self.up = nn.ConvTranspose2d(2 * ch, ch, 2, stride=2)
        self.up1 = ResBlock(2 * ch, ch, temb)
        self.conv_out = nn.Conv2d(ch, 4, 3, padding=1)

    def forward(self, sample: torch.Tensor, timestep: torch.Tensor) -> torch.Tensor:
        half = self.temb // 2
        freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32) / half)
        angles = timestep[:, None].float() * freqs[None, :]
        t = self.time(torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1))
        t = t.expand(sample.shape[0], -1)
        h0 = self.attn1(self.down1(self.conv_in(sample), t))
        h1 = self.mid(self.pool(h0), t)
        h = self.up1(torch.cat([self.up(h1), h0], dim=1), t)
        return self.conv_out(F.silu(h))


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, causal: bool) -> None:
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, s, d = x.size()
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // self.heads)
        if self.causal:
            keep = torch.tril(torch.ones(s, s, dtype=torch.bool, device=x.device))
            scores = scores.masked_fill(~keep, torch.finfo(scores.dtype).min)
        scores = scores + mask
        out = (scores.softmax(-1) @ v).transpose(1, 2).contiguous().view(b, s, d)
        return self.proj(out)


class Layer(nn.Module):
    def __init__(self, dim: int, heads: int, causal: bool) -> None:
        super().__init__()
        self.pre = causal  # GPT-2 normalises before each sublayer, BERT after
        self.attn = Attention(dim, heads, causal)
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.fc, self.out = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.gelu = nn.GELU(approximate="tanh" if causal else "none")

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.pre:
            x = x + self.attn(self.ln1(x), mask)
            return x + self.out(self.gelu(self.fc(self.ln2(x))))
        x = self.ln1(x + self.attn(x, mask))
        return self.ln2(x + self.out(self.gelu(self.fc(x))))


def _extended_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, S] of 1/0 → [B, 1, 1, S] of 0/-large, as BERT and GPT-2 build it."""
    mask = attention_mask[:, None, None, :].to(torch.float32)
    return (1.0 - mask) * torch.finfo(torch.float32).min


class TinyGPT(nn.Module):
    def __init__(self, vocab: int = 1000, dim: int = 64, layers: int = 2, positions: int = 256):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Embedding(positions, dim)
        self.layers = nn.ModuleList([Layer(dim, 4, causal=True) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(dim)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], dtype=torch.long)[None, :]
        x = self.wte(input_ids) + self.wpe(positions)
        mask = _extended_mask(attention_mask)
        for layer in self.layers:
            x = layer(x, mask)
        return self.ln_f(x) @ self.wte.weight.t()  # tied LM head


class TinyBert(nn.Module):
    def __init__(self, vocab: int = 1000, dim: int = 64, layers: int = 2, positions: int = 256):
        super().__init__()
        self.words, self.positions = nn.Embedding(vocab, dim), nn.Embedding(positions, dim)
        self.types = nn.Embedding(2, dim)
        self.ln = nn.LayerNorm(dim)
        self.layers = nn.ModuleList([Layer(dim, 4, causal=False) for _ in range(layers)])
        self.pooler = nn.Linear(dim, dim)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(input_ids.size(1), dtype=torch.long).unsqueeze(0)
        positions = positions.expand_as(input_ids)
        x = self.words(input_ids) + self.positions(positions) + self.types(token_type_ids)
        x = self.ln(x)
        mask = _extended_mask(attention_mask)
        for layer in self.layers:
            x = layer(x, mask)
        return x, torch.tanh(self.pooler(x[:, 0]))
