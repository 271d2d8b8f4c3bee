"""Multi-class-token towers (clip-temperature-multi-class-tokens.txt Sec. 3, Fig. 6; methods-spec 2.2-2.3, 2.7).

Both of open_clip's towers are *subclassed* (the transformer, patch embedding, token embedding, LNs and projections
stay open_clip's, every weight keeping its name and initialisation); only the token bookkeeping changes. Each
tower returns the m per-token projections concatenated, [B, m * n], not normalised.
"""
from __future__ import annotations

import torch
from torch import nn
from open_clip.transformer import TextTransformer, VisionTransformer


class MultiTokenVisionTransformer(VisionTransformer):
    """m learned class tokens: open_clip's ``class_embedding`` plus m - 1 new ones, random init
    ``width**-0.5 * randn`` to break symmetry (paper Sec. 3), each with its own positional embedding (open_clip's
    row 0 for the first, m - 1 new rows); output ``ln_post`` of the m tokens, then open_clip's ``proj``
    (width -> n) *shared by all tokens* (ref-code, spec 2.7.5)."""

    n_class_tokens: int

    def _add_tokens(self, m: int) -> None:
        if self.attn_pool is not None or getattr(self, "pool_type", "tok") != "tok":
            raise ValueError("multi-class-token ViT needs open_clip's plain class-token pooling")
        width = self.class_embedding.shape[0]
        self.n_class_tokens = int(m)
        scale = width ** -0.5
        self.extra_class_embedding = nn.Parameter(scale * torch.randn(m - 1, width))
        self.extra_positional_embedding = nn.Parameter(scale * torch.randn(m - 1, width))

    def _embeds(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        x = x.reshape(x.shape[0], x.shape[1], -1).permute(0, 2, 1)  # [B, P, W]
        cls = torch.cat([self.class_embedding[None], self.extra_class_embedding], 0).to(x.dtype)  # [m, W]
        x = torch.cat([cls.expand(x.shape[0], -1, -1), x], dim=1)
        pos = torch.cat([self.positional_embedding[:1], self.extra_positional_embedding,
                         self.positional_embedding[1:]], 0)
        x = self.patch_dropout(x + pos.to(x.dtype))
        return self.ln_pre(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.transformer(self._embeds(x))
        tokens = self.ln_post(x[:, :self.n_class_tokens])  # [B, m, W]
        return (tokens @ self.proj).flatten(1)  # [B, m * n]


class MultiTokenTextTransformer(TextTransformer):
    """open_clip's text tower is causal and pooled at EOT, so a class token at position 0 (the paper's BERT [CLS])
    would see nothing. We take spec 2.7.4 option (b): one learned class embedding replicated m times and inserted
    right *after* EOT (positions eot+1 .. eot+m, distinct positional embeddings: the context grows by m rows), pads
    shifted behind; causal attention lets each copy see the whole caption. Output ``ln_final`` of the m positions,
    then the shared ``text_projection`` -> n."""

    n_class_tokens: int

    def _add_tokens(self, m: int) -> None:
        if self.cls_emb is not None or self.attn_mask is None or not isinstance(self.text_projection, nn.Parameter):
            raise ValueError("multi-class-token text tower needs open_clip's causal CLIP text transformer")
        self.n_class_tokens = int(m)
        self.mt_class_embedding = nn.Parameter(0.02 * torch.randn(self.width))  # token_embedding's init std
        self.extra_positional_embedding = nn.Parameter(0.01 * torch.randn(m, self.width))  # positional's std

    def forward(self, text: torch.Tensor) -> torch.Tensor:
        B, L = text.shape
        m, W = self.n_class_tokens, self.width
        cast = self.transformer.get_cast_dtype()
        x = self.token_embedding(text).to(cast)
        x = torch.cat([x, self.mt_class_embedding.to(cast).expand(B, m, W)], 1)  # [B, L + m, W]
        eot = text.argmax(dim=-1, keepdim=True)  # [B, 1] (EOT has the highest id, as open_clip pools)
        j = torch.arange(L + m, device=text.device)[None]
        src = torch.where(j <= eot, j, torch.where(j <= eot + m, L + j - eot - 1, j - m))  # insert after EOT
        x = x.gather(1, src[..., None].expand(-1, -1, W))
        x = x + torch.cat([self.positional_embedding, self.extra_positional_embedding], 0).to(cast)
        mask = torch.full((L + m, L + m), float("-inf"), device=x.device).triu_(1)
        x = self.ln_final(self.transformer(x, attn_mask=mask))
        idx = eot + 1 + torch.arange(m, device=text.device)[None]  # [B, m]
        tokens = x.gather(1, idx[..., None].expand(-1, -1, W))
        return (tokens @ self.text_projection).flatten(1)  # [B, m * n]


def make_multitoken(clip: nn.Module, m: int) -> nn.Module:
    """Turn the towers of an open_clip ``CustomTextCLIP`` into m-class-token towers in place; returns it.

    open_clip builds the towers (``force_custom_text=True`` gives a ``.text`` TextTransformer module); here their
    ``__class__`` is swapped and the new parameters added, so every open_clip weight keeps its name and
    initialisation. The towers' [B, m * n] output is what the CLIP loss with ``distance: ps_negtrace`` and
    ``subspheres: m`` reads: it normalises each n-chunk and sums the m cosines (PS(n, m), Table 1), the paper's
    ``einsum('ikc,jkc->ij')`` on per-token normalised features.
    """
    if m < 1:
        raise ValueError(f"class_tokens must be >= 1, got {m}")
    if not hasattr(clip, "text") or not isinstance(clip.text, TextTransformer) or \
            not isinstance(clip.visual, VisionTransformer):
        raise ValueError("multi-class-token CLIP needs a ViT image tower and open_clip's custom text tower "
                         "(create_model(..., force_custom_text=True))")
    clip.visual.__class__ = MultiTokenVisionTransformer
    clip.visual._add_tokens(m)
    clip.text.__class__ = MultiTokenTextTransformer
    clip.text._add_tokens(m)
    return clip
