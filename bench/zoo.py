"""Kiln's real-model zoo: architectures built from their libraries' own code (torchvision, timm,
Hugging Face transformers) with deterministic random weights, never downloaded.

    import zoo
    zoo.names()                                  # every entry, in a fixed order
    zoo.describe("bert")                         # one line about it
    module, inputs, dynamic = zoo.build("bert", depth=2, batch=1)

``build(name, depth=None, batch=1, dtype=torch.float32, seq=None, vocab=None, seed=0)`` returns
``(module in eval mode, example inputs (a tuple), dynamic_shapes or None)``:

- widths (hidden sizes, heads, channels, image and patch sizes) are the real ones;
- ``depth`` cuts the stack for CPU tests: transformer layers (``num_hidden_layers``, ViT
  layers), or blocks per stage for staged vision models (Swin, MaxViT, ConvNeXt, RegNet,
  ResNet, DenseNet, EfficientNet, MobileNet use their whole published stage layout and ignore
  it); ``None`` keeps the published depth;
- ``vocab`` caps a text model's vocabulary (the embedding table's rows: not a width) so that
  CPU tests do not carry a 128k x 2048 table; ``None`` keeps the published size;
- ``seq`` is the text length (default 128) or, for audio, the number of samples / frames;
- weights: ``torch.manual_seed(seed)`` before construction (the libraries' own initializers),
  then batch-norm running statistics are drawn from the same generator so that folding them is
  not a no-op;
- ``dynamic_shapes`` describes a dynamic batch (and sequence, for text models) in the form
  ``torch.export.export`` takes, with bounds (GPT-2: the sequence only, see _seq_dynamic);
  ``None`` where the model cannot take one.

Inputs are random (images N(0, 1); token ids uniform over the vocabulary; encoders also get an
attention mask whose last row pads its final quarter). transformers models use
``attn_implementation="sdpa"`` and return ``last_hidden_state`` only (a tuple of one tensor),
detection/segmentation wrappers return plain tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn

DEFAULT_SEQ = 128
MAX_BATCH = 8
MAX_SEQ = 512


@dataclass(frozen=True)
class Entry:
    name: str
    family: str  # "cnn", "vit", "seg", "det", "encoder", "decoder", "audio"
    library: str  # "torchvision", "timm", "transformers"
    description: str
    make: Callable  # make(depth, vocab) -> nn.Module
    inputs: Callable  # inputs(module, batch, seq, dtype, gen) -> tuple
    dynamic: Callable | None  # dynamic(inputs) -> dynamic_shapes
    default_seq: int | None = None


_ENTRIES: dict[str, Entry] = {}


def _entry(name, family, library, description, inputs, dynamic=None, default_seq=None):
    def deco(fn):
        _ENTRIES[name] = Entry(name, family, library, description, fn, inputs, dynamic, default_seq)
        return fn

    return deco


def names(family: str | None = None) -> list[str]:
    """Every zoo entry (optionally of one family), in a fixed order."""
    return [n for n, e in _ENTRIES.items() if family is None or e.family == family]


def entry(name: str) -> Entry:
    try:
        return _ENTRIES[name]
    except KeyError:
        raise KeyError(f"no zoo model '{name}'; the zoo has: {', '.join(_ENTRIES)}") from None


def describe(name: str) -> str:
    e = entry(name)
    return f"{e.name}: {e.description} ({e.library})"


# --- inputs and dynamic shapes


def _image(size: int):
    def fn(module, batch, seq, dtype, gen):
        return (torch.randn(batch, 3, size, size, generator=gen).to(dtype),)

    return fn


def _batch_dynamic(inputs):
    b = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    return ({0: b},)


def _text(with_mask: bool):
    def fn(module, batch, seq, dtype, gen):
        vocab = module.config.vocab_size
        ids = torch.randint(0, vocab, (batch, seq), generator=gen)
        if not with_mask:
            return (ids,)
        mask = torch.ones(batch, seq, dtype=torch.int64)
        mask[-1, seq - seq // 4 :] = 0  # the last row is padded
        return (ids, mask)

    return fn


def _text_dynamic(inputs):
    b = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    s = torch.export.Dim("seq", min=2, max=MAX_SEQ)
    return tuple({0: b, 1: s} for _ in inputs)


def _seq_dynamic(inputs):
    """A dynamic sequence only: ExecuTorch 1.5's to_edge specializes the batch of a tensor split
    along its last dimension (GPT-2's fused QKV projection) to the example's."""
    s = torch.export.Dim("seq", min=2, max=MAX_SEQ)
    return tuple({1: s} for _ in inputs)


# --- wrappers: plain tensor outputs for export


class _HF(nn.Module):
    """A transformers text model returning only last_hidden_state (a tuple of one tensor)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.config = model.config

    def forward(self, input_ids, attention_mask=None):
        if attention_mask is None:
            return (self.model(input_ids=input_ids).last_hidden_state,)
        return (self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state,)


class _HFVision(_HF):
    def forward(self, pixel_values):
        return (self.model(pixel_values=pixel_values).last_hidden_state,)


class _HFAudio(_HF):
    def __init__(self, model, input_name):
        super().__init__(model)
        self._input_name = input_name

    def forward(self, x):
        return (self.model(**{self._input_name: x}).last_hidden_state,)


class _Seg(nn.Module):
    """A torchvision segmentation model returning the 'out' map."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return (self.model(x)["out"],)


class _Features(nn.Module):
    """A backbone returning its feature maps (a dict) as a tuple."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return tuple(self.model(x).values())


# --- torchvision


def _tv(fn_name, **kw):
    import torchvision.models as tvm

    return getattr(tvm, fn_name)(weights=None, **kw)


@_entry("resnet50", "cnn", "torchvision", "ResNet-50 v1.5, 224x224", _image(224), _batch_dynamic)
def _resnet50(depth, vocab):
    return _tv("resnet50")


@_entry(
    "mobilenet_v2", "cnn", "torchvision", "MobileNetV2 1.0, 224x224", _image(224), _batch_dynamic
)
def _mobilenet_v2(depth, vocab):
    return _tv("mobilenet_v2")


@_entry(
    "mobilenet_v3_large",
    "cnn",
    "torchvision",
    "MobileNetV3-Large (hardswish, squeeze-excite), 224x224",
    _image(224),
    _batch_dynamic,
)
def _mobilenet_v3(depth, vocab):
    return _tv("mobilenet_v3_large")


@_entry(
    "efficientnet_b0",
    "cnn",
    "torchvision",
    "EfficientNet-B0 (SiLU, squeeze-excite), 224x224",
    _image(224),
    _batch_dynamic,
)
def _efficientnet_b0(depth, vocab):
    return _tv("efficientnet_b0")


@_entry(
    "regnet_y_400mf",
    "cnn",
    "torchvision",
    "RegNetY-400MF (grouped convs, SE)",
    _image(224),
    _batch_dynamic,
)
def _regnet(depth, vocab):
    return _tv("regnet_y_400mf")


@_entry(
    "convnext_tiny",
    "cnn",
    "torchvision",
    "ConvNeXt-T (7x7 depthwise, channels-last LayerNorm, layer scale), 224x224",
    _image(224),
    _batch_dynamic,
)
def _convnext(depth, vocab):
    if depth is None:
        return _tv("convnext_tiny")
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt

    d = max(1, depth)
    cfg = [
        CNBlockConfig(96, 192, min(3, d)),
        CNBlockConfig(192, 384, min(3, d)),
        CNBlockConfig(384, 768, min(9, d)),
        CNBlockConfig(768, None, min(3, d)),
    ]
    return ConvNeXt(cfg, stochastic_depth_prob=0.1)


@_entry(
    "densenet121",
    "cnn",
    "torchvision",
    "DenseNet-121 (concatenation), 224x224",
    _image(224),
    _batch_dynamic,
)
def _densenet(depth, vocab):
    return _tv("densenet121")


@_entry(
    "vit_b_16",
    "vit",
    "torchvision",
    "ViT-B/16 (d 768, 12 heads, MLP 3072), 224x224",
    _image(224),
    _batch_dynamic,
)
def _vit_b_16(depth, vocab):
    from torchvision.models.vision_transformer import VisionTransformer

    return VisionTransformer(
        image_size=224,
        patch_size=16,
        num_layers=12 if depth is None else depth,
        num_heads=12,
        hidden_dim=768,
        mlp_dim=3072,
    )


@_entry(
    "swin_t",
    "vit",
    "torchvision",
    "Swin-T (shifted 7x7 windows, relative position bias), 224x224",
    _image(224),
    _batch_dynamic,
)
def _swin_t(depth, vocab):
    from torchvision.models.swin_transformer import SwinTransformer

    depths = [2, 2, 6, 2]
    if depth is not None:
        depths = [min(d, max(2, depth)) for d in depths]  # 2 keeps a shifted block per stage
    return SwinTransformer(
        patch_size=[4, 4],
        embed_dim=96,
        depths=depths,
        num_heads=[3, 6, 12, 24],
        window_size=[7, 7],
        stochastic_depth_prob=0.2,
    )


@_entry(
    "maxvit_t",
    "vit",
    "torchvision",
    "MaxViT-T (MBConv + block and grid attention), 224x224",
    _image(224),
    None,  # the export specializes the batch (to the example's): static batch only
)
def _maxvit_t(depth, vocab):
    from torchvision.models.maxvit import MaxVit

    layers = [2, 2, 5, 2]
    if depth is not None:
        layers = [min(n, max(1, depth)) for n in layers]
    return MaxVit(
        input_size=(224, 224),
        stem_channels=64,
        partition_size=7,
        block_channels=[64, 128, 256, 512],
        block_layers=layers,
        head_dim=32,
        stochastic_depth_prob=0.2,
    )


@_entry(
    "lraspp_mobilenet_v3",
    "seg",
    "torchvision",
    "LR-ASPP MobileNetV3-Large segmentation (bilinear upsampling), 224x224",
    _image(224),
    _batch_dynamic,
)
def _lraspp(depth, vocab):
    import torchvision.models.segmentation as seg

    return _Seg(seg.lraspp_mobilenet_v3_large(weights=None, weights_backbone=None))


@_entry(
    "resnet50_fpn",
    "det",
    "torchvision",
    "Faster R-CNN's ResNet-50 FPN backbone (nearest upsampling, 5 maps), 224x224",
    _image(224),
    _batch_dynamic,
)
def _resnet50_fpn(depth, vocab):
    from torchvision.models.detection.backbone_utils import resnet_fpn_backbone

    return _Features(resnet_fpn_backbone(backbone_name="resnet50", weights=None))


# --- timm


def _timm(name, **kw):
    import timm

    return timm.create_model(name, pretrained=False, **kw)


@_entry(
    "deit_small",
    "vit",
    "timm",
    "DeiT-S/16 (d 384, 6 heads), 224x224",
    _image(224),
    _batch_dynamic,
)
def _deit_small(depth, vocab):
    kw = {} if depth is None else {"depth": depth}
    return _timm("deit_small_patch16_224", **kw)


@_entry(
    "resnet26d",
    "cnn",
    "timm",
    "ResNet-26-D (deep stem, avg-pool shortcut), 224x224",
    _image(224),
    _batch_dynamic,
)
def _resnet26d(depth, vocab):
    return _timm("resnet26d")


@_entry(
    "mobilevitv2_050",
    "vit",
    "timm",
    "MobileViTv2-0.5 (separable self-attention, GroupNorm, unfold), 256x256",
    _image(256),
    None,  # the export specializes the batch (to the example's): static batch only
)
def _mobilevitv2(depth, vocab):
    return _timm("mobilevitv2_050")


# --- transformers


def _hf_config(cls_name, depth, vocab, **kw):
    import transformers

    cfg = getattr(transformers, cls_name)(**kw)
    if depth is not None:
        cfg.num_hidden_layers = depth
    if vocab is not None and hasattr(cfg, "vocab_size"):
        cfg.vocab_size = min(cfg.vocab_size, vocab)
    cfg._attn_implementation = "sdpa"
    return cfg


def _hf_model(model_cls, cfg):
    import transformers

    return getattr(transformers, model_cls)(cfg)


@_entry(
    "bert",
    "encoder",
    "transformers",
    "BertModel, bert-base (d 768, 12 heads, 12 layers), with a padding mask",
    _text(True),
    _text_dynamic,
    DEFAULT_SEQ,
)
def _bert(depth, vocab):
    return _HF(_hf_model("BertModel", _hf_config("BertConfig", depth, vocab)))


@_entry(
    "roberta",
    "encoder",
    "transformers",
    "RobertaModel, roberta-base (d 768, padding-aware position ids), with a padding mask",
    _text(True),
    _text_dynamic,
    DEFAULT_SEQ,
)
def _roberta(depth, vocab):
    cfg = _hf_config(
        "RobertaConfig",
        depth,
        vocab,
        vocab_size=50265,
        max_position_embeddings=514,
        type_vocab_size=1,
        pad_token_id=1,
    )
    return _HF(_hf_model("RobertaModel", cfg))


@_entry(
    "distilbert",
    "encoder",
    "transformers",
    "DistilBertModel, distilbert-base (d 768, 6 layers), with a padding mask",
    _text(True),
    _text_dynamic,
    DEFAULT_SEQ,
)
def _distilbert(depth, vocab):
    cfg = _hf_config("DistilBertConfig", None, vocab)
    if depth is not None:
        cfg.n_layers = depth
    return _HF(_hf_model("DistilBertModel", cfg))


@_entry(
    "albert",
    "encoder",
    "transformers",
    "AlbertModel, albert-base-v2 (factorized embedding 128 -> 768, one layer's weights shared by "
    "all 12), with a padding mask",
    _text(True),
    _text_dynamic,
    DEFAULT_SEQ,
)
def _albert(depth, vocab):
    cfg = _hf_config(
        "AlbertConfig",
        depth,
        vocab,
        vocab_size=30000,
        embedding_size=128,
        hidden_size=768,
        num_attention_heads=12,
        intermediate_size=3072,
        num_hidden_layers=12,
        hidden_act="gelu_new",
    )
    if depth is not None:
        cfg.num_hidden_layers = depth
    return _HF(_hf_model("AlbertModel", cfg))


@_entry(
    "electra",
    "encoder",
    "transformers",
    "ElectraModel, electra-base-discriminator (d 768, 12 heads, 12 layers), with a padding mask",
    _text(True),
    _text_dynamic,
    DEFAULT_SEQ,
)
def _electra(depth, vocab):
    cfg = _hf_config(
        "ElectraConfig",
        depth,
        vocab,
        embedding_size=768,
        hidden_size=768,
        num_attention_heads=12,
        intermediate_size=3072,
    )
    return _HF(_hf_model("ElectraModel", cfg))


@_entry(
    "mpnet",
    "encoder",
    "transformers",
    "MPNetModel, mpnet-base (d 768, relative position buckets shared by the layers), with a "
    "padding mask",
    _text(True),
    _text_dynamic,
    DEFAULT_SEQ,
)
def _mpnet(depth, vocab):
    cfg = _hf_config("MPNetConfig", depth, vocab)
    cfg._attn_implementation = "eager"
    return _HF(_hf_model("MPNetModel", cfg))


@_entry(
    "t5_encoder",
    "encoder",
    "transformers",
    "T5EncoderModel, t5-base (d 768, 12 heads, 12 layers, relative position buckets), with a "
    "padding mask",
    _text(True),
    _text_dynamic,
    DEFAULT_SEQ,
)
def _t5_encoder(depth, vocab):
    cfg = _hf_config("T5Config", depth, vocab, vocab_size=32128, d_model=768, d_kv=64, d_ff=3072)
    cfg.num_heads = 12
    cfg.num_layers = depth if depth is not None else 12
    return _HF(_hf_model("T5EncoderModel", cfg))


@_entry(
    "deberta_v2",
    "encoder",
    "transformers",
    "DebertaV2Model, deberta-v3-base (d 768, 12 heads, 12 layers, log-bucketed relative "
    "positions, p2c and c2p attention), with a padding mask",
    _text(True),
    _text_dynamic,
    DEFAULT_SEQ,
)
def _deberta_v2(depth, vocab):
    cfg = _hf_config(
        "DebertaV2Config",
        depth,
        vocab,
        vocab_size=128100,
        hidden_size=768,
        num_attention_heads=12,
        intermediate_size=3072,
        max_position_embeddings=512,
        type_vocab_size=0,
        relative_attention=True,
        position_buckets=256,
        max_relative_positions=-1,
        norm_rel_ebd="layer_norm",
        share_att_key=True,
        pos_att_type=["p2c", "c2p"],
        position_biased_input=False,
    )
    cfg._attn_implementation = "eager"  # DeBERTa has no sdpa form in transformers
    return _HF(_hf_model("DebertaV2Model", cfg))


@_entry(
    "hf_vit",
    "encoder",
    "transformers",
    "ViTModel, vit-base-patch16-224 (d 768, 12 layers, pooler off)",
    _image(224),
    _batch_dynamic,
)
def _hf_vit(depth, vocab):
    import transformers

    cfg = _hf_config("ViTConfig", depth, None)
    return _HFVision(transformers.ViTModel(cfg, add_pooling_layer=False))


@_entry(
    "clip_vision",
    "encoder",
    "transformers",
    "CLIPVisionModel, clip-vit-base-patch32 vision tower (d 768, quick GELU)",
    _image(224),
    _batch_dynamic,
)
def _clip_vision(depth, vocab):
    cfg = _hf_config("CLIPVisionConfig", depth, None)
    return _HFVision(_hf_model("CLIPVisionModel", cfg))


class _HFLogits(_HF):
    """A transformers vision model returning its logits (a segmentation head's map)."""

    def forward(self, pixel_values):
        return (self.model(pixel_values=pixel_values).logits,)


@_entry(
    "dinov2_small",
    "vit",
    "transformers",
    "Dinov2Model, dinov2-small widths (d 384, 6 heads, patch 14, layer scale), 224x224",
    _image(224),
    _batch_dynamic,
)
def _dinov2_small(depth, vocab):
    cfg = _hf_config(
        "Dinov2Config",
        depth,
        None,
        hidden_size=384,
        num_hidden_layers=12,
        num_attention_heads=6,
        mlp_ratio=4,
        patch_size=14,
        image_size=224,
        layerscale_value=1.0,
    )
    return _HFVision(_hf_model("Dinov2Model", cfg))


@_entry(
    "swinv2_tiny",
    "vit",
    "transformers",
    "Swinv2Model, swinv2-tiny-patch4-window8-256 (cosine attention, log-spaced continuous "
    "position bias MLP), 256x256",
    _image(256),
    _batch_dynamic,
)
def _swinv2_tiny(depth, vocab):
    depths = [2, 2, 6, 2] if depth is None else [1, 1, depth, 1]
    cfg = _hf_config(
        "Swinv2Config",
        None,
        None,
        image_size=256,
        embed_dim=96,
        depths=depths,
        num_heads=[3, 6, 12, 24],
        window_size=8,
    )
    cfg._attn_implementation = "eager"  # Swin-V2 has no sdpa form in transformers
    return _HFVision(_hf_model("Swinv2Model", cfg))


@_entry(
    "convnextv2_tiny",
    "cnn",
    "transformers",
    "ConvNextV2Model, convnextv2-tiny (7x7 depthwise, channels-last LayerNorm, global response "
    "normalization), 224x224",
    _image(224),
    _batch_dynamic,
)
def _convnextv2_tiny(depth, vocab):
    depths = [3, 3, 9, 3] if depth is None else [1, 1, depth, 1]
    cfg = _hf_config(
        "ConvNextV2Config", None, None, depths=depths, hidden_sizes=[96, 192, 384, 768]
    )
    cfg._attn_implementation = "eager"  # (no attention: transformers refuses "sdpa" for it)
    return _HFVision(_hf_model("ConvNextV2Model", cfg))


@_entry(
    "segformer_b0",
    "seg",
    "transformers",
    "SegformerForSemanticSegmentation, mit-b0 (efficient attention with spatial reduction, "
    "Mix-FFN depthwise convs, all-MLP decode head with bilinear upsampling), 512x512",
    _image(512),
    _batch_dynamic,
)
def _segformer_b0(depth, vocab):
    depths = [2, 2, 2, 2] if depth is None else [1, 1, depth, 1]
    cfg = _hf_config(
        "SegformerConfig",
        None,
        None,
        depths=depths,
        hidden_sizes=[32, 64, 160, 256],
        decoder_hidden_size=256,
        num_labels=150,
    )
    cfg._attn_implementation = "eager"
    return _HFLogits(_hf_model("SegformerForSemanticSegmentation", cfg))


@_entry(
    "beit_base",
    "vit",
    "transformers",
    "BeitModel, beit-base-patch16-224 (relative position bias per layer, layer scale, mean "
    "pooling), 224x224",
    _image(224),
    _batch_dynamic,
)
def _beit_base(depth, vocab):
    cfg = _hf_config(
        "BeitConfig",
        depth,
        None,
        use_relative_position_bias=True,
        use_absolute_position_embeddings=False,
        layer_scale_init_value=0.1,
        use_mean_pooling=True,
    )
    cfg._attn_implementation = "eager"
    return _HFVision(_hf_model("BeitModel", cfg))


@_entry(
    "levit_128s",
    "vit",
    "transformers",
    "LevitModel, levit-128S (convolutional stem, attention with learned biases gathered by "
    "offset, subsampling attention, batch-normed linears, hard-swish), 224x224",
    _image(224),
    None,  # the export specializes the batch (to the example's): static batch only
)
def _levit_128s(depth, vocab):
    depths = [2, 3, 4] if depth is None else [min(depth, 2), min(depth, 3), min(depth, 4)]
    cfg = _hf_config(
        "LevitConfig",
        None,
        None,
        hidden_sizes=[128, 256, 384],
        num_attention_heads=[4, 6, 8],
        depths=depths,
        key_dim=[16, 16, 16],
    )
    cfg._attn_implementation = "eager"
    return _HFVision(_hf_model("LevitModel", cfg))


def _whisper_inputs(module, batch, seq, dtype, gen):
    n_mels = module.config.num_mel_bins
    frames = 2 * module.config.max_source_positions
    return (torch.randn(batch, n_mels, frames, generator=gen).to(dtype),)


@_entry(
    "whisper_encoder",
    "audio",
    "transformers",
    "WhisperEncoder, whisper-base (d 512, 8 heads, conv1d front end), 30 s of 80 mel bins",
    _whisper_inputs,
    _batch_dynamic,
)
def _whisper_encoder(depth, vocab):
    import transformers

    cfg = _hf_config(
        "WhisperConfig",
        None,
        None,
        d_model=512,
        encoder_layers=6,
        encoder_attention_heads=8,
        encoder_ffn_dim=2048,
        decoder_layers=1,
        decoder_attention_heads=8,
        decoder_ffn_dim=2048,
    )
    if depth is not None:
        cfg.encoder_layers = depth
    enc = transformers.WhisperModel(cfg).get_encoder()
    enc.config = cfg
    return _HFAudio(enc, "input_features")


def _audio_inputs(module, batch, seq, dtype, gen):
    return (torch.randn(batch, seq, generator=gen).to(dtype),)


@_entry(
    "wav2vec2",
    "audio",
    "transformers",
    "Wav2Vec2Model, wav2vec2-base (7 conv1d + GroupNorm front end, d 768), 1 s at 16 kHz",
    _audio_inputs,
    _batch_dynamic,
    16000,
)
def _wav2vec2(depth, vocab):
    cfg = _hf_config("Wav2Vec2Config", depth, None)
    return _HFAudio(_hf_model("Wav2Vec2Model", cfg), "input_values")


@_entry(
    "gpt2",
    "decoder",
    "transformers",
    "GPT2Model, gpt2 small (d 768, 12 heads, 12 layers), causal, no cache",
    _text(False),
    _seq_dynamic,
    DEFAULT_SEQ,
)
def _gpt2(depth, vocab):
    cfg = _hf_config("GPT2Config", None, vocab, use_cache=False)
    if depth is not None:
        cfg.n_layer = depth
    return _HF(_hf_model("GPT2Model", cfg))


def _decoder_cfg(cls_name, depth, vocab, **kw):
    return _hf_config(cls_name, depth, vocab, use_cache=False, **kw)


@_entry(
    "bloom",
    "decoder",
    "transformers",
    "BloomModel, bloom-560m widths (d 1024, 16 heads, 24 layers, ALiBi position biases), causal, "
    "no cache",
    _text(False),
    _text_dynamic,
    DEFAULT_SEQ,
)
def _bloom(depth, vocab):
    cfg = _decoder_cfg("BloomConfig", None, vocab, vocab_size=250880, hidden_size=1024, n_head=16)
    cfg.n_layer = depth if depth is not None else 24
    cfg._attn_implementation = "eager"  # BLOOM has no sdpa form in transformers
    return _HF(_hf_model("BloomModel", cfg))


@_entry(
    "gpt_neox",
    "decoder",
    "transformers",
    "GPTNeoXModel, pythia-160m widths (d 768, 12 heads, rotary on a quarter of each head, "
    "parallel residual), causal, no cache",
    _text(False),
    _seq_dynamic,  # its fused QKV split: to_edge specializes the batch, as for GPT-2
    DEFAULT_SEQ,
)
def _gpt_neox(depth, vocab):
    cfg = _decoder_cfg(
        "GPTNeoXConfig",
        depth,
        vocab,
        vocab_size=50304,
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
        rotary_pct=0.25,
        use_parallel_residual=True,
        max_position_embeddings=2048,
    )
    return _HF(_hf_model("GPTNeoXModel", cfg))


@_entry(
    "opt",
    "decoder",
    "transformers",
    "OPTModel, opt-125m (d 768, 12 heads, ReLU FFN 3072, learned positions offset by 2), "
    "causal, no cache",
    _text(False),
    _text_dynamic,
    DEFAULT_SEQ,
)
def _opt(depth, vocab):
    cfg = _decoder_cfg(
        "OPTConfig",
        depth,
        vocab,
        vocab_size=50272,
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        ffn_dim=3072,
        word_embed_proj_dim=768,
        max_position_embeddings=2048,
    )
    return _HF(_hf_model("OPTModel", cfg))


@_entry(
    "falcon_rw",
    "decoder",
    "transformers",
    "FalconModel, falcon-rw-1b widths (d 2048, 32 heads, ALiBi, fused QKV), causal, no cache",
    _text(False),
    _seq_dynamic,  # its fused QKV split: to_edge specializes the batch, as for GPT-2
    DEFAULT_SEQ,
)
def _falcon_rw(depth, vocab):
    cfg = _decoder_cfg(
        "FalconConfig",
        depth,
        vocab,
        vocab_size=50304,
        hidden_size=2048,
        num_hidden_layers=24,
        num_attention_heads=32,
        alibi=True,
        multi_query=False,
        new_decoder_architecture=False,
        parallel_attn=False,
        bias=True,
    )
    return _HF(_hf_model("FalconModel", cfg))


@_entry(
    "stablelm",
    "decoder",
    "transformers",
    "StableLmModel, stablelm-3b-4e1t widths (d 2560, 32 heads, rotary on a quarter of each "
    "head, LayerNorm, SwiGLU 6912), causal, no cache",
    _text(False),
    _text_dynamic,
    DEFAULT_SEQ,
)
def _stablelm(depth, vocab):
    cfg = _decoder_cfg(
        "StableLmConfig",
        depth,
        vocab,
        vocab_size=50304,
        hidden_size=2560,
        intermediate_size=6912,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        partial_rotary_factor=0.25,
    )
    return _HF(_hf_model("StableLmModel", cfg))


@_entry(
    "llama",
    "decoder",
    "transformers",
    "LlamaModel, Llama-3.2-1B widths (d 2048, 32 heads, 8 KV heads, SwiGLU 8192, RoPE), no cache",
    _text(False),
    _text_dynamic,
    DEFAULT_SEQ,
)
def _llama(depth, vocab):
    cfg = _decoder_cfg(
        "LlamaConfig",
        depth,
        vocab,
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        tie_word_embeddings=True,
    )
    return _HF(_hf_model("LlamaModel", cfg))


@_entry(
    "qwen2",
    "decoder",
    "transformers",
    "Qwen2Model, Qwen2-0.5B widths (d 896, 14 heads, 2 KV heads, QKV bias), no cache",
    _text(False),
    _text_dynamic,
    DEFAULT_SEQ,
)
def _qwen2(depth, vocab):
    cfg = _decoder_cfg(
        "Qwen2Config",
        depth,
        vocab,
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
    )
    return _HF(_hf_model("Qwen2Model", cfg))


@_entry(
    "mistral",
    "decoder",
    "transformers",
    "MistralModel, Mistral-7B widths (d 4096, 32 heads, 8 KV heads, SwiGLU 14336), no cache",
    _text(False),
    _text_dynamic,
    DEFAULT_SEQ,
)
def _mistral(depth, vocab):
    cfg = _decoder_cfg(
        "MistralConfig",
        depth,
        vocab,
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        sliding_window=None,
    )
    return _HF(_hf_model("MistralModel", cfg))


@_entry(
    "gemma",
    "decoder",
    "transformers",
    "GemmaModel, gemma-2b widths (d 2048, 8 heads, 1 KV head of 256, GeGLU 16384), no cache",
    _text(False),
    _text_dynamic,
    DEFAULT_SEQ,
)
def _gemma(depth, vocab):
    cfg = _decoder_cfg(
        "GemmaConfig",
        depth,
        vocab,
        vocab_size=256000,
        hidden_size=2048,
        intermediate_size=16384,
        num_hidden_layers=18,
        num_attention_heads=8,
        num_key_value_heads=1,
        head_dim=256,
    )
    return _HF(_hf_model("GemmaModel", cfg))


# --- building


def _randomize_bn_stats_(module: nn.Module, gen: torch.Generator) -> None:
    for m in module.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.running_mean is not None:
            with torch.no_grad():
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=gen) * 0.1)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=gen) + 0.5)


def build(
    name: str,
    depth: int | None = None,
    batch: int = 1,
    dtype: torch.dtype = torch.float32,
    seq: int | None = None,
    vocab: int | None = None,
    seed: int = 0,
):
    """(module in eval mode, example inputs, dynamic_shapes or None) for one zoo entry."""
    e = entry(name)
    if depth is not None and depth < 1:
        raise ValueError(f"depth must be >= 1 or None, got {depth}")
    torch.manual_seed(seed)
    module = e.make(depth, vocab)
    _randomize_bn_stats_(module, torch.Generator().manual_seed(seed + 2))
    module = module.eval().to(dtype)
    inputs = make_inputs(name, module, batch=batch, dtype=dtype, seq=seq, seed=seed + 1)
    dynamic = e.dynamic(inputs) if e.dynamic is not None else None
    return module, inputs, dynamic


def make_inputs(
    name: str,
    module: nn.Module,
    batch: int = 1,
    dtype: torch.dtype = torch.float32,
    seq: int | None = None,
    seed: int = 1,
):
    """Random inputs for a built zoo model (other seeds give fresh inputs of the same kind)."""
    e = entry(name)
    gen = torch.Generator().manual_seed(seed)
    seq = seq if seq is not None else (e.default_seq or DEFAULT_SEQ)
    return e.inputs(module, batch, seq, dtype, gen)


if __name__ == "__main__":
    for n in names():
        print(describe(n))
