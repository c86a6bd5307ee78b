"""Real models the zoo does not hold, tried as a new user would: each built from its library's own
code (torchvision, timm, transformers) with deterministic random weights (never downloaded),
exported with ``kiln.executorch.save`` in one call, loaded with ``kiln.load`` and run on the CPU
through ExecuTorch, against eager PyTorch on the same inputs. It checks that Kiln's coverage is
general, not fitted to bench/zoo.py: each row should be one Kiln delegate with nothing left to
ExecuTorch and an error near the precision's rounding.

    python bench/heldout.py                          # every model, fp32
    python bench/heldout.py --models t5,codegen --precision fp16 --json out.json

Each model runs in a process of its own (a crash or a hang costs one row, ``--timeout``).
bench/models.py times 30 of them on the GPU (``--models heldout``) at :func:`use_gpu_sizes`.
Transformer stacks are cut to two layers (a T5 decoder to six: its cross-attention k and v of every
layer read one tensor), vocabularies to 1024 rows and text to 64 tokens; widths are the library
defaults or the named checkpoint's; batch-norm running statistics are drawn at random (as in the
zoo) so that folding them is not a no-op. The error is ``|kiln - eager| / |eager|`` (L2, the
largest over the outputs) against the float32 model in eager PyTorch. ``--precision fp16`` /
``bf16`` exports that float32 model with ``precision=`` (Kiln converts the weights; the
documented route: a model converted with ``.half()`` first can branch on float16 values, which
torch.export refuses, as transformers' BART does); ``scale`` is the largest ``|eager|``, to
spot an output that is zero by construction.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
import warnings

import torch
import torch.nn as nn

VOCAB = 1024
SEQ = 64
LAYERS = 2  # transformer layers of the transformers models that do not name their own


def use_gpu_sizes() -> None:
    """The sizes bench/models.py's held-out configs time on the GPU: six layers, 128 tokens."""
    global SEQ, LAYERS
    SEQ, LAYERS = 128, 6


def _hf(cfg_name, model_name, layers=None, **kw):
    import transformers

    layers = LAYERS if layers is None else layers

    cfg = getattr(transformers, cfg_name)(**kw)
    for k in ("num_hidden_layers", "n_layer", "num_layers"):
        if hasattr(cfg, k) and k not in kw:
            setattr(cfg, k, layers)
    if hasattr(cfg, "vocab_size"):
        cfg.vocab_size = min(cfg.vocab_size, VOCAB)
    if getattr(cfg, "pad_token_id", None) is not None and cfg.pad_token_id >= cfg.vocab_size:
        cfg.pad_token_id = 0
    return _sdpa_model(model_name, cfg)


def _sdpa_model(model_name, cfg):
    """transformers' model_name on cfg with sdpa attention, or eager where it has no sdpa form."""
    import transformers

    cfg._attn_implementation = "sdpa"
    try:
        return getattr(transformers, model_name)(cfg)
    except ValueError:
        cfg._attn_implementation = "eager"
        return getattr(transformers, model_name)(cfg)


class _Text(nn.Module):
    """last_hidden_state of a transformers text model (with a padding mask when given one)."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, ids, mask=None):
        kw = {"input_ids": ids} if mask is None else {"input_ids": ids, "attention_mask": mask}
        return (self.m(**kw).last_hidden_state,)


class _Named(nn.Module):
    """last_hidden_state of a transformers model called with named inputs."""

    def __init__(self, m, *names):
        super().__init__()
        self.m = m
        self.names = names

    def forward(self, x0, x1=None):  # named parameters: torch.export's dynamic_shapes match them
        xs = (x0,) if x1 is None else (x0, x1)
        return (self.m(**dict(zip(self.names, xs, strict=True))).last_hidden_state,)


class _Tuple(nn.Module):
    """A vision model's output(s) as a tuple of tensors."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x):
        o = self.m(x)
        if isinstance(o, dict):
            return tuple(o.values())
        return tuple(o) if isinstance(o, (tuple, list)) else (o,)


def _ids(n=None):
    return torch.randint(0, VOCAB, (1, SEQ if n is None else n))


def _text(m, mask=False):
    if not mask:
        return _Text(m), (_ids(),)
    am = torch.ones(1, SEQ, dtype=torch.long)
    am[0, -SEQ // 4 :] = 0
    return _Text(m), (_ids(), am)


def _image(m, size=224):
    return _Tuple(m), (torch.randn(1, 3, size, size),)


def _tv(name, **kw):
    import torchvision.models as tvm

    return _image(getattr(tvm, name)(weights=None, **kw), 299 if name == "inception_v3" else 224)


def _timm(name, **kw):
    import timm

    # pooled features: a classifier head some timm models initialize to zeros
    return _image(timm.create_model(name, pretrained=False, num_classes=0, **kw))


def _seq2seq(m, enc=40, dec=12):
    return _Named(m, "input_ids", "decoder_input_ids"), (_ids(enc), _ids(dec))


MODELS = {
    # torchvision
    "shufflenet_v2": ("torchvision", lambda: _tv("shufflenet_v2_x1_0")),
    "squeezenet1_1": ("torchvision", lambda: _tv("squeezenet1_1")),
    "googlenet": ("torchvision", lambda: _tv("googlenet", aux_logits=False, init_weights=True)),
    "inception_v3": (
        "torchvision",
        lambda: _tv("inception_v3", aux_logits=False, init_weights=True),
    ),
    "mnasnet0_5": ("torchvision", lambda: _tv("mnasnet0_5")),
    "efficientnet_v2_s": ("torchvision", lambda: _tv("efficientnet_v2_s")),
    "swin_v2_t": ("torchvision", lambda: _tv("swin_v2_t")),
    "resnext50_32x4d": ("torchvision", lambda: _tv("resnext50_32x4d")),
    "mobilenet_v3_small": ("torchvision", lambda: _tv("mobilenet_v3_small")),
    "deeplabv3_mobilenet_v3": (
        "torchvision",
        lambda: _image(
            __import__(
                "torchvision.models.segmentation", fromlist=["x"]
            ).deeplabv3_mobilenet_v3_large(weights=None, weights_backbone=None, aux_loss=False)
        ),
    ),
    # timm
    "eva02_tiny": ("timm", lambda: _timm("eva02_tiny_patch14_224")),
    "poolformer_s12": ("timm", lambda: _timm("poolformer_s12")),
    "mixer_s16": ("timm", lambda: _timm("mixer_s16_224")),
    "xcit_nano": ("timm", lambda: _timm("xcit_nano_12_p16_224")),
    "pvt_v2_b0": ("timm", lambda: _timm("pvt_v2_b0")),
    "edgenext_xx_small": ("timm", lambda: _timm("edgenext_xx_small")),
    "fastvit_t8": ("timm", lambda: _timm("fastvit_t8")),
    "repvit_m1": ("timm", lambda: _timm("repvit_m1")),
    "efficientformerv2_s0": ("timm", lambda: _timm("efficientformerv2_s0")),
    "coatnet_0": ("timm", lambda: _timm("coatnet_0_rw_224")),
    "cait_xxs24": ("timm", lambda: _timm("cait_xxs24_224")),
    "vit_small_reg4": ("timm", lambda: _timm("vit_small_patch14_reg4_dinov2", img_size=224)),
    "ghostnetv2": ("timm", lambda: _timm("ghostnetv2_100")),
    "rexnet_100": ("timm", lambda: _timm("rexnet_100")),
    "nf_resnet26": ("timm", lambda: _timm("nf_resnet26")),
    "res2net50": ("timm", lambda: _timm("res2net50_26w_4s")),
    "inception_next_tiny": ("timm", lambda: _timm("inception_next_tiny")),
    "hgnetv2_b0": ("timm", lambda: _timm("hgnetv2_b0")),
    "mobilenetv4_small": ("timm", lambda: _timm("mobilenetv4_conv_small")),
    "convformer_s18": ("timm", lambda: _timm("convformer_s18")),
    # transformers: decoders (called as a user calls them: their default cache included)
    "phi3": (
        "transformers",
        lambda: _text(
            _hf(
                "Phi3Config",
                "Phi3Model",
                hidden_size=1024,
                intermediate_size=2816,
                num_attention_heads=16,
            )
        ),
    ),
    "qwen3": (
        "transformers",
        lambda: _text(
            _hf(
                "Qwen3Config",
                "Qwen3Model",
                hidden_size=1024,
                intermediate_size=3072,
                num_attention_heads=16,
                num_key_value_heads=8,
                head_dim=128,
            )
        ),
    ),
    "gemma2": (
        "transformers",
        lambda: _text(
            _hf(
                "Gemma2Config",
                "Gemma2Model",
                hidden_size=1152,
                intermediate_size=6912,
                num_attention_heads=4,
                num_key_value_heads=1,
                head_dim=256,
                sliding_window=32,
            )
        ),
    ),
    "gemma3": (
        "transformers",
        lambda: _text(
            _hf(
                "Gemma3TextConfig",
                "Gemma3TextModel",
                hidden_size=1152,
                intermediate_size=6912,
                num_attention_heads=4,
                num_key_value_heads=1,
                head_dim=256,
                sliding_window=32,
            )
        ),
    ),
    "olmo2": (
        "transformers",
        lambda: _text(
            _hf(
                "Olmo2Config",
                "Olmo2Model",
                hidden_size=1024,
                intermediate_size=2816,
                num_attention_heads=16,
            )
        ),
    ),
    "starcoder2": (
        "transformers",
        lambda: _text(
            _hf(
                "Starcoder2Config",
                "Starcoder2Model",
                hidden_size=1024,
                intermediate_size=4096,
                num_attention_heads=16,
                num_key_value_heads=4,
            )
        ),
    ),
    "gptj": (
        "transformers",
        lambda: _text(_hf("GPTJConfig", "GPTJModel", n_embd=1024, n_head=16, rotary_dim=32)),
    ),
    "codegen": (
        "transformers",
        lambda: _text(_hf("CodeGenConfig", "CodeGenModel", n_embd=1024, n_head=16, rotary_dim=32)),
    ),
    "gpt_bigcode": (
        "transformers",
        lambda: _text(
            _hf("GPTBigCodeConfig", "GPTBigCodeModel", n_embd=1024, n_head=16, multi_query=True)
        ),
    ),
    "cohere": (
        "transformers",
        lambda: _text(
            _hf(
                "CohereConfig",
                "CohereModel",
                hidden_size=1024,
                intermediate_size=2816,
                num_attention_heads=16,
            )
        ),
    ),
    "smollm_135m": (
        "transformers",
        lambda: _text(
            _hf(
                "LlamaConfig",
                "LlamaModel",
                hidden_size=576,
                intermediate_size=1536,
                num_attention_heads=9,
                num_key_value_heads=3,
            )
        ),
    ),
    "mixtral": (  # mixture of experts: 4 experts, 2 per token (the default grouped_mm experts)
        "transformers",
        lambda: _text(
            _hf(
                "MixtralConfig",
                "MixtralModel",
                hidden_size=512,
                intermediate_size=1024,
                num_attention_heads=8,
                num_key_value_heads=4,
                num_local_experts=4,
                num_experts_per_tok=2,
            )
        ),
    ),
    "qwen2_moe": (  # experts and a shared expert
        "transformers",
        lambda: _text(
            _hf(
                "Qwen2MoeConfig",
                "Qwen2MoeModel",
                hidden_size=512,
                intermediate_size=1024,
                moe_intermediate_size=256,
                shared_expert_intermediate_size=512,
                num_attention_heads=8,
                num_key_value_heads=4,
                num_experts=8,
                num_experts_per_tok=2,
            )
        ),
    ),
    "mamba": (  # selective state space (conv1d, softplus, the scan unrolled)
        "transformers",
        lambda: _text(_hf("MambaConfig", "MambaModel", hidden_size=256, state_size=16)),
    ),
    # transformers: encoders, encoder-decoders, vision, audio
    "mobilebert": ("transformers", lambda: _text(_hf("MobileBertConfig", "MobileBertModel"), True)),
    "xlm_roberta": (
        "transformers",
        lambda: _text(_hf("XLMRobertaConfig", "XLMRobertaModel"), True),
    ),
    "modernbert": (
        "transformers",
        lambda: _text(
            _hf(
                "ModernBertConfig",
                "ModernBertModel",
                global_attn_every_n_layers=2,
                local_attention=32,
            ),
            True,
        ),
    ),
    "roformer": ("transformers", lambda: _text(_hf("RoFormerConfig", "RoFormerModel"), True)),
    "camembert": ("transformers", lambda: _text(_hf("CamembertConfig", "CamembertModel"), True)),
    "bart_encoder": (
        "transformers",
        lambda: _text(_hf("BartConfig", "BartModel").get_encoder(), True),
    ),
    "bart": ("transformers", lambda: _seq2seq(_hf("BartConfig", "BartModel"))),
    "marian": (
        "transformers",
        lambda: _seq2seq(
            _hf("MarianConfig", "MarianModel", decoder_start_token_id=0, pad_token_id=0)
        ),
    ),
    "t5": (
        "transformers",
        lambda: _seq2seq(_hf("T5Config", "T5Model", num_layers=2, num_decoder_layers=6)),
    ),
    "whisper": (
        "transformers",
        lambda: (
            _Named(
                _hf(
                    "WhisperConfig",
                    "WhisperModel",
                    d_model=384,
                    encoder_attention_heads=6,
                    decoder_attention_heads=6,
                    encoder_ffn_dim=1536,
                    decoder_ffn_dim=1536,
                    encoder_layers=2,
                    decoder_layers=2,
                ),
                "input_features",
                "decoder_input_ids",
            ),
            (torch.randn(1, 80, 3000), _ids(8)),
        ),
    ),
    "hf_resnet": ("transformers", lambda: _image(_hf("ResNetConfig", "ResNetModel"))),
    "dinov2_registers": (
        "transformers",
        lambda: (
            _Named(
                _hf(
                    "Dinov2WithRegistersConfig",
                    "Dinov2WithRegistersModel",
                    hidden_size=384,
                    num_attention_heads=6,
                ),
                "pixel_values",
            ),
            (torch.randn(1, 3, 224, 224),),
        ),
    ),
    "yolos": (
        "transformers",
        lambda: (
            _Named(
                _hf(
                    "YolosConfig",
                    "YolosModel",
                    hidden_size=384,
                    num_attention_heads=6,
                    image_size=[224, 224],
                ),
                "pixel_values",
            ),
            (torch.randn(1, 3, 224, 224),),
        ),
    ),
    "siglip_vision": (
        "transformers",
        lambda: (
            _Named(_hf("SiglipVisionConfig", "SiglipVisionModel"), "pixel_values"),
            (torch.randn(1, 3, 224, 224),),
        ),
    ),
    "hubert": (
        "transformers",
        lambda: (
            _Named(_hf("HubertConfig", "HubertModel"), "input_values"),
            (torch.randn(1, 16000),),
        ),
    ),
    "data2vec_audio": (
        "transformers",
        lambda: (
            _Named(_hf("Data2VecAudioConfig", "Data2VecAudioModel"), "input_values"),
            (torch.randn(1, 16000),),
        ),
    ),
}

# The second list: 78 more, each a pattern the first did not hold (3-D
# convolutions, LeakyReLU, fold, local and halo attention, sliding-window patches, ...).


def _tv_seg(name):
    import torchvision.models.segmentation as seg

    return _image(getattr(seg, name)(weights=None, weights_backbone=None, aux_loss=False))


def _tv_video(name, shape=(1, 3, 8, 112, 112)):
    import torchvision.models.video as video

    return _Tuple(getattr(video, name)(weights=None)), (torch.randn(*shape),)


class _Flow(nn.Module):
    """RAFT's last flow estimate for a pair of frames."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, a, b):
        return (self.m(a, b)[-1],)


def _raft():
    import torchvision.models.optical_flow as flow

    frames = (torch.randn(1, 3, 128, 128), torch.randn(1, 3, 128, 128))
    return _Flow(flow.raft_small(weights=None)), frames


def _detr(cfg_name, model_name, **kw):
    """A transformers detector's decoder states (deformable attention: grid_sample)."""
    import transformers

    m = getattr(transformers, model_name)(getattr(transformers, cfg_name)(**kw))
    return _Named(m, "pixel_values"), (torch.randn(1, 3, 320, 320),)


def _hf_named(cfg, model, name, x, **kw):
    return _Named(_hf(cfg, model, **kw), name), (x,)


def _transformers_model(cfg_name, model_name, **kw):
    """A transformers model with the config's own layer count and vocabulary (not _hf's)."""
    import transformers

    return _sdpa_model(model_name, getattr(transformers, cfg_name)(**kw))


MODELS.update(
    {
        "vgg11_bn": ("torchvision", lambda: _tv("vgg11_bn")),
        "alexnet": ("torchvision", lambda: _tv("alexnet")),
        "wide_resnet50_2": ("torchvision", lambda: _tv("wide_resnet50_2")),
        "regnet_x_400mf": ("torchvision", lambda: _tv("regnet_x_400mf")),
        "fcn_resnet50": ("torchvision", lambda: _tv_seg("fcn_resnet50")),
        **{
            n: ("torchvision", lambda n=n: _tv_video(n))
            for n in ("r3d_18", "r2plus1d_18", "mc3_18")
        },
        "s3d": (  # 3-D max and average pooling
            "torchvision",
            lambda: _tv_video("s3d", (1, 3, 16, 224, 224)),
        ),
        "mvit_v2_s": ("torchvision", lambda: _tv_video("mvit_v2_s", (1, 3, 16, 224, 224))),
        "swin3d_t": ("torchvision", lambda: _tv_video("swin3d_t")),
        "raft_small": ("torchvision", _raft),
        "rt_detr": ("transformers", lambda: _detr("RTDetrConfig", "RTDetrModel")),
        "deformable_detr": (
            "transformers",
            lambda: _detr(
                "DeformableDetrConfig",
                "DeformableDetrModel",
                use_timm_backbone=True,
                use_pretrained_backbone=False,
                backbone="resnet50",
            ),
        ),
        **{
            n: ("timm", lambda t=t, kw=kw: _timm(t, **kw))
            for n, t, kw in [
                ("resnetv2_50x1_bit", "resnetv2_50x1_bit", {}),
                ("cspdarknet53", "cspdarknet53", {}),
                ("dla34", "dla34", {}),
                ("hrnet_w18_small", "hrnet_w18_small", {}),
                ("tresnet_m", "tresnet_m", {}),
                ("volo_d1", "volo_d1_224", {}),
                ("gmlp_s16", "gmlp_s16_224", {}),
                ("resmlp_12", "resmlp_12_224", {}),
                ("convit_tiny", "convit_tiny", {}),
                ("crossvit_tiny", "crossvit_tiny_240", {}),
                ("pit_ti", "pit_ti_224", {}),
                ("mvitv2_tiny", "mvitv2_tiny", {}),
                ("efficientvit_b0", "efficientvit_b0", {}),
                ("efficientvit_m0", "efficientvit_m0", {}),
                ("tiny_vit_5m", "tiny_vit_5m_224", {}),
                ("nextvit_small", "nextvit_small", {}),
                ("twins_svt_small", "twins_svt_small", {}),
                ("visformer_tiny", "visformer_tiny", {}),
                ("gcvit_xxtiny", "gcvit_xxtiny", {}),
                ("davit_tiny", "davit_tiny", {}),
                ("focalnet_tiny_srf", "focalnet_tiny_srf", {}),
                ("hiera_tiny", "hiera_tiny_224", {}),
                ("mambaout_femto", "mambaout_femto", {}),
                ("starnet_s1", "starnet_s1", {}),
                ("convmixer_768_32", "convmixer_768_32", {}),
                ("botnet26t", "botnet26t_256", {"img_size": 224}),
                ("lambda_resnet26t", "lambda_resnet26t", {}),
                ("resnest14d", "resnest14d", {}),
                ("skresnet18", "skresnet18", {}),
                ("ecaresnet26t", "ecaresnet26t", {}),
                ("mixnet_s", "mixnet_s", {}),
                ("dpn68", "dpn68", {}),
                ("xception41", "xception41", {}),
                ("repvgg_a0", "repvgg_a0", {}),
                ("mobileone_s0", "mobileone_s0", {}),
                ("ese_vovnet19b_dw", "ese_vovnet19b_dw", {}),
                ("coat_lite_tiny", "coat_lite_tiny", {}),
                ("deit3_small", "deit3_small_patch16_224", {}),
                ("efficientformer_l1", "efficientformer_l1", {}),
                ("vit_siglip", "vit_base_patch16_siglip_224", {}),
                ("rdnet_tiny", "rdnet_tiny", {}),
            ]
        },
        "halonet26t": (  # (its halo windows need 256 x 256)
            "timm",
            lambda: _image(
                __import__("timm").create_model("halonet26t", pretrained=False, num_classes=0),
                256,
            ),
        ),
        "gpt_neo": (  # global and local attention
            "transformers",
            lambda: _text(
                _hf(
                    "GPTNeoConfig",
                    "GPTNeoModel",
                    hidden_size=768,
                    num_heads=12,
                    num_layers=2,
                    attention_types=[[["global", "local"], 1]],
                    window_size=32,
                )
            ),
        ),
        "phi": (
            "transformers",
            lambda: _text(
                _hf(
                    "PhiConfig",
                    "PhiModel",
                    hidden_size=1024,
                    intermediate_size=4096,
                    num_attention_heads=16,
                )
            ),
        ),
        "granite": (
            "transformers",
            lambda: _text(
                _hf(
                    "GraniteConfig",
                    "GraniteModel",
                    hidden_size=1024,
                    intermediate_size=2816,
                    num_attention_heads=16,
                    num_key_value_heads=4,
                )
            ),
        ),
        "olmoe": (
            "transformers",
            lambda: _text(
                _hf(
                    "OlmoeConfig",
                    "OlmoeModel",
                    hidden_size=512,
                    intermediate_size=1024,
                    num_attention_heads=8,
                    num_experts=8,
                    num_experts_per_tok=2,
                )
            ),
        ),
        "mpt": (
            "transformers",
            lambda: _text(_hf("MptConfig", "MptModel", d_model=768, n_heads=12)),
        ),
        "xglm": (
            "transformers",
            lambda: _text(
                _hf("XGLMConfig", "XGLMModel", d_model=768, attention_heads=12, ffn_dim=3072)
            ),
        ),
        "funnel": (  # pooling between blocks
            "transformers",
            lambda: _text(
                _transformers_model(
                    "FunnelConfig", "FunnelBaseModel", block_sizes=[1, 1, 1], vocab_size=VOCAB
                ),
                True,
            ),
        ),
        "squeezebert": (
            "transformers",
            lambda: _text(_hf("SqueezeBertConfig", "SqueezeBertModel"), True),
        ),
        "convbert": ("transformers", lambda: _text(_hf("ConvBertConfig", "ConvBertModel"), True)),
        "esm": (  # GELU written with erf, rotary
            "transformers",
            lambda: _text(
                _hf(
                    "EsmConfig",
                    "EsmModel",
                    vocab_size=VOCAB,
                    hidden_size=480,
                    num_attention_heads=20,
                    intermediate_size=1920,
                    position_embedding_type="rotary",
                    pad_token_id=1,
                    mask_token_id=32,
                ),
                True,
            ),
        ),
        "big_bird": (
            "transformers",
            lambda: _text(
                _hf("BigBirdConfig", "BigBirdModel", attention_type="original_full"), True
            ),
        ),
        "nystromformer": (
            "transformers",
            lambda: _text(_hf("NystromformerConfig", "NystromformerModel"), True),
        ),
        "hf_mobilevit": (
            "transformers",
            lambda: _image(_hf("MobileViTConfig", "MobileViTModel"), 256),
        ),
        "cvt": ("transformers", lambda: _image(_hf("CvtConfig", "CvtModel"))),
        "swiftformer": (
            "transformers",
            lambda: _image(_hf("SwiftFormerConfig", "SwiftFormerModel")),
        ),
        "dpt": (  # depth estimation: a ViT and its reassembling head
            "transformers",
            lambda: (
                _Tuple(
                    _hf(
                        "DPTConfig",
                        "DPTForDepthEstimation",
                        hidden_size=384,
                        num_attention_heads=6,
                        intermediate_size=1536,
                        num_hidden_layers=4,
                        backbone_out_indices=[0, 1, 2, 3],
                    )
                ),
                (torch.randn(1, 3, 224, 224),),
            ),
        ),
        "glpn": ("transformers", lambda: _image(_hf("GLPNConfig", "GLPNForDepthEstimation"))),
        **{
            n: (  # tubelet embeddings: 3-D convolutions
                "transformers",
                lambda c=c, m=m: _hf_named(
                    c,
                    m,
                    "pixel_values",
                    torch.randn(1, 8, 3, 112, 112),
                    num_frames=8,
                    image_size=112,
                ),
            )
            for n, c, m in [
                ("vivit", "VivitConfig", "VivitModel"),
                ("videomae", "VideoMAEConfig", "VideoMAEModel"),
            ]
        },
        "wav2vec2_conformer": (
            "transformers",
            lambda: _hf_named(
                "Wav2Vec2ConformerConfig",
                "Wav2Vec2ConformerModel",
                "input_values",
                torch.randn(1, 16000),
                position_embeddings_type="rotary",
                vocab_size=32,
            ),
        ),
        "wavlm": (
            "transformers",
            lambda: _hf_named("WavLMConfig", "WavLMModel", "input_values", torch.randn(1, 16000)),
        ),
        "ast": (  # audio spectrogram transformer
            "transformers",
            lambda: _hf_named("ASTConfig", "ASTModel", "input_values", torch.randn(1, 1024, 128)),
        ),
        "sew": (
            "transformers",
            lambda: _hf_named("SEWConfig", "SEWModel", "input_values", torch.randn(1, 16000)),
        ),
        "patchtst": (  # time series: unfold into patches, batch norm over transposed rows
            "transformers",
            lambda: _hf_named(
                "PatchTSTConfig",
                "PatchTSTModel",
                "past_values",
                torch.randn(1, 512, 7),
                num_input_channels=7,
                context_length=512,
                patch_length=16,
                patch_stride=16,
            ),
        ),
    }
)


def _is_mask(t: torch.Tensor) -> bool:
    return not t.is_floating_point() and bool(((t == 0) | (t == 1)).all())


def _like(t: torch.Tensor, batch: int, seq: int | None, gen: torch.Generator) -> torch.Tensor:
    """A fresh random tensor of t's kind: batch rows; token ids and masks (integer, rank 2) of
    `seq` columns when seq is given."""
    shape = [batch, *t.shape[1:]]
    if seq is not None and not t.is_floating_point() and t.dim() == 2:
        shape[1] = seq
    if t.is_floating_point():
        return torch.randn(shape, generator=gen, dtype=t.dtype)
    if _is_mask(t):
        m = torch.ones(shape, dtype=t.dtype)
        m[0, -max(1, shape[1] // 4) :] = 0  # the first row pads its last quarter
        return m
    return torch.randint(0, VOCAB, shape, generator=gen, dtype=t.dtype)


def _dynamic(inputs) -> tuple:
    """dynamic_shapes for the inputs: a batch of 1..8 for every input, and a length of 2..512 for
    token ids and masks (one length per distinct example length: ids and mask share theirs)."""
    batch = torch.export.Dim("batch", min=1, max=8)
    seqs: dict[int, object] = {}
    out = []
    for t in inputs:
        d = {0: batch}
        if not t.is_floating_point() and t.dim() == 2:
            d[1] = seqs.setdefault(t.shape[1], torch.export.Dim(f"len{len(seqs)}", min=2, max=512))
        out.append(d)
    return tuple(out)


def run_one(name: str, precision: str, workdir: str, dynamic: bool = False) -> dict:
    import kiln
    from kiln.executorch import save

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python", "tests"))
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import zoo
    from conftest import delegation_summary

    t0 = time.time()
    torch.manual_seed(0)
    module, inputs = MODELS[name][1]()
    module = module.eval()
    zoo._randomize_bn_stats_(module, torch.Generator().manual_seed(2))
    gen = torch.Generator().manual_seed(1)
    runs = [inputs]
    options = {}
    if dynamic:  # exported at batch 2, run there and at batch 1 with 37 tokens
        inputs = tuple(_like(t, 2, None, gen) for t in inputs)
        runs = [inputs, tuple(_like(t, 1, 37, gen) for t in inputs)]
        options["dynamic_shapes"] = _dynamic(inputs)
    path = os.path.join(workdir, f"{name}.pte")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prog = save(module, path, inputs, precision=precision, quiet=True, **options)
    # dims ExecuTorch's lowering fixed at the example's size (export warns): run that size only
    fixed = [str(w.message) for w in caught if "fixed it at" in str(w.message)]
    if fixed:
        runs = runs[:1]
    s = delegation_summary(prog)
    program = kiln.load(path)
    err = scale = 0.0
    for run in runs:
        with torch.no_grad():  # the reference: the float32 model (a float16 CPU run can overflow)
            want = module(*run)
        got = program.forward(*run)
        for g, w in zip(got, want, strict=True):
            w, g = w.float(), g.float()
            e = float((g - w).norm() / w.norm().clamp_min(1e-30))
            err = e if e != e or err != err else max(err, e)  # a NaN is kept, not skipped by max
            scale = max(scale, float(w.abs().max()))
    os.remove(path)
    return {
        "model": name,
        "library": MODELS[name][0],
        "precision": precision,
        "dynamic": dynamic,
        "fixed_by_lowering": fixed,
        "kiln": s["kiln"],
        "other": s["other"],
        "outside": sorted({str(o).split("::")[-1] for o in s["ops"]}),
        "error": err,
        "scale": scale,
        "seconds": round(time.time() - t0, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="", help="comma-separated names (default: all)")
    ap.add_argument("--precision", default="fp32", choices=("fp32", "fp16", "bf16"))
    ap.add_argument(
        "--dynamic",
        action="store_true",
        help="dynamic batch (1..8) and token lengths (2..512): exported at batch 2, run there "
        "and at batch 1 with 37 tokens",
    )
    ap.add_argument("--timeout", type=int, default=400, help="seconds per model")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # the child process's model
    ap.add_argument("--workdir", default="/tmp", help="where the .pte files are written")
    a = ap.parse_args()
    if a.one:
        try:
            rec = run_one(a.one, a.precision, a.workdir, a.dynamic)
        except Exception as e:  # reported as the row's failure
            rec = {
                "model": a.one,
                "library": MODELS[a.one][0],
                "precision": a.precision,
                "failure": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}",
                "trace": traceback.format_exc()[-2000:],
            }
        print("HELDOUT " + json.dumps(rec))
        return 0
    names = [n for n in a.models.split(",") if n] or list(MODELS)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        ap.error(f"unknown models {unknown}; known: {', '.join(MODELS)}")
    rows = []
    print("| model | library | Kiln delegates | ops left to ExecuTorch | error | scale | s |")
    print("|---|---|---|---|---|---|---|")
    for n in names:
        cmd = [
            sys.executable,
            __file__,
            "--one",
            n,
            "--precision",
            a.precision,
            "--workdir",
            a.workdir,
        ] + (["--dynamic"] if a.dynamic else [])
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout).stdout
            line = [x for x in out.splitlines() if x.startswith("HELDOUT ")]
            rec = json.loads(line[-1][8:]) if line else {"model": n, "failure": "no result"}
        except subprocess.TimeoutExpired:
            rec = {"model": n, "failure": f"over {a.timeout} s"}
        rec.setdefault("library", MODELS[n][0])
        rows.append(rec)
        if "failure" in rec:
            print(f"| {n} | {rec['library']} | FAILED: {rec['failure']} | | | | |", flush=True)
        else:
            other = f" + {rec['other']} other" if rec["other"] else ""
            if rec.get("fixed_by_lowering"):
                other += " (a dynamic size fixed by ExecuTorch's to_edge: run at the example's)"
            print(
                f"| {n} | {rec['library']} | {rec['kiln']}{other} | "
                f"{', '.join(rec['outside']) or 'none'} | {rec['error']:.1e} | "
                f"{rec['scale']:.3g} | {rec['seconds']} |",
                flush=True,
            )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    ok = sum(1 for r in rows if "failure" not in r and r["kiln"] == 1 and not r["outside"])
    print(f"\n{ok} of {len(rows)} whole in one Kiln delegate")
    return 0 if ok == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
