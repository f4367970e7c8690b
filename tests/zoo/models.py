"""The model zoo shared by tests/zoo/zoo.py and bench/zoo: real architectures from torchvision
and torch.nn, built with random weights (a fixed seed; never downloaded) at sizes small enough
for a 2-core machine.

Each entry of ZOO is a Spec: a constructor of the network (returns logits), its input and target
generators and its loss. Dropout and stochastic depth are switched off, so that a training step
is deterministic and the same in every system.
"""

import collections

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# optimisers: the zoo.py optimiser cases this model is checked with (None: all), for models where
# one optimiser's check measures float32 chaos rather than the runtime (see mobilenet_v3_small).
Spec = collections.namedtuple("Spec", "build inputs batch classes per_token note optimisers", defaults=(None,))


def _no_randomness(net):
    """Replaces dropout by identity and sets stochastic-depth rates to 0 (in place)."""
    for name, child in list(net.named_children()):
        if isinstance(child, nn.Dropout):
            setattr(net, name, nn.Identity())
        else:
            _no_randomness(child)
    for m in net.modules():
        if type(m).__name__ == "StochasticDepth":
            m.p = 0.0
        if isinstance(m, nn.MultiheadAttention):
            m.dropout = 0.0
    return net


def image(channels, size):
    def make(rng, n):
        return {"x": rng.standard_normal((n, channels, size, size)).astype(np.float32)}
    return make


def tokens(seq, vocab):
    def make(rng, n):
        return {"tokens": rng.integers(0, vocab, size=(n, seq)).astype(np.int64)}
    return make


def sequence(seq, features):
    def make(rng, n):
        return {"x": rng.standard_normal((n, seq, features)).astype(np.float32)}
    return make


class EncoderClassifier(nn.Module):
    """Token embedding + learnt positions, nn.TransformerEncoder (post-LN, ReLU), mean pooling,
    linear head."""

    seq, vocab, dim, heads, ffn, layers, classes = 8, 32, 32, 2, 64, 2, 10

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(self.vocab, self.dim)
        self.pos = nn.Parameter(0.1 * torch.randn(self.seq, self.dim))
        layer = nn.TransformerEncoderLayer(self.dim, self.heads, self.ffn, dropout=0.0,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, self.layers, enable_nested_tensor=False)
        self.head = nn.Linear(self.dim, self.classes)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens) + self.pos).mean(dim=1))


class CausalDecoder(nn.Module):
    """GPT-style: token embedding + learnt positions, nn.TransformerEncoder layers (pre-LN, GELU)
    under a causal attention mask, final LayerNorm, vocabulary head; next-token logits."""

    seq, vocab, dim, heads, ffn, layers = 8, 32, 32, 2, 64, 2

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(self.vocab, self.dim)
        self.pos = nn.Parameter(0.1 * torch.randn(self.seq, self.dim))
        layer = nn.TransformerEncoderLayer(self.dim, self.heads, self.ffn, dropout=0.0,
                                           activation="gelu", batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, self.layers, enable_nested_tensor=False)
        self.ln = nn.LayerNorm(self.dim)
        self.head = nn.Linear(self.dim, self.vocab)
        # Not persistent: the mask is a constant, not state.
        mask = torch.triu(torch.full((self.seq, self.seq), float("-inf")), diagonal=1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, tokens):
        x = self.blocks(self.embed(tokens) + self.pos, mask=self.mask)
        return self.head(self.ln(x))


class RecurrentClassifier(nn.Module):
    """One-layer nn.LSTM or nn.GRU over a sequence of feature vectors; linear head on the last
    step's output."""

    seq, features, hidden, classes = 6, 8, 16, 10

    def __init__(self, cell):
        super().__init__()
        self.rnn = cell(self.features, self.hidden, batch_first=True)
        self.head = nn.Linear(self.hidden, self.classes)

    def forward(self, x):
        y, _ = self.rnn(x)
        return self.head(y[:, -1])


def _resnet18():
    import torchvision
    return torchvision.models.resnet18(num_classes=10)


def _mobilenet_v2():
    import torchvision
    return torchvision.models.mobilenet_v2(num_classes=10)


def _mobilenet_v3_small():
    import torchvision
    return torchvision.models.mobilenet_v3_small(num_classes=10)


def _efficientnet_b0():
    import torchvision
    return torchvision.models.efficientnet_b0(num_classes=10)


def _mnasnet():
    import torchvision
    return torchvision.models.mnasnet1_0(num_classes=10)


def _shufflenet_v2():
    import torchvision
    return torchvision.models.shufflenet_v2_x1_0(num_classes=10)


def _squeezenet():
    import torchvision
    return torchvision.models.squeezenet1_1(num_classes=10)


def _regnet():
    import torchvision
    return torchvision.models.regnet_x_400mf(num_classes=10)


def _vit_small():
    from torchvision.models.vision_transformer import VisionTransformer
    return VisionTransformer(image_size=16, patch_size=4, num_layers=2, num_heads=2,
                             hidden_dim=32, mlp_dim=64, num_classes=10)


def _swin_small():
    from torchvision.models.swin_transformer import SwinTransformer
    return SwinTransformer(patch_size=[2, 2], embed_dim=16, depths=[2, 2], num_heads=[2, 2],
                           window_size=[2, 2], stochastic_depth_prob=0.0, num_classes=10)


def _swin_t():
    import torchvision
    return torchvision.models.swin_t(num_classes=10)


def conv_bn_relu_pool(channels, size):
    """A plain CNN for the bench sweep: 3 x (conv3x3-BN-ReLU-maxpool2) at `channels` channels,
    global average pooling, linear head."""
    class Plain(nn.Module):
        def __init__(self):
            super().__init__()
            layers, c_in = [], 3
            for _ in range(3):
                layers += [nn.Conv2d(c_in, channels, 3, padding=1, bias=False),
                           nn.BatchNorm2d(channels), nn.ReLU(), nn.MaxPool2d(2)]
                c_in = channels
            self.features = nn.Sequential(*layers)
            self.head = nn.Linear(channels, 10)

        def forward(self, x):
            return self.head(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))

    return Plain()


# The zoo of the parity test (tests/zoo/zoo.py): small inputs so that every model trains in a
# few seconds. batch: samples per step.
ZOO = {
    # 64x64 and batch 8, not smaller: with BatchNorm over 4 values per channel (1x1 maps,
    # batch 4) float32 rounding alone moves ResNet's weights as much as training does.
    "resnet18": Spec(_resnet18, image(3, 64), 8, 10, False, "torchvision resnet18, 64x64"),
    "mobilenet_v2": Spec(_mobilenet_v2, image(3, 64), 8, 10, False,
                         "torchvision mobilenet_v2, 64x64 (BatchNorm on 2x2 maps: chaotic)"),
    # AdamW is not checked: v3's classifier starts with tiny weights, so many gradients are near
    # AdamW's eps (1e-8), where the update m / (sqrt(v) + eps) is as sensitive to float32 rounding
    # as the gradient is small; after one step torch's own float32 and float64 runs already differ
    # by a third of a step in some weights, and after three they agree or not by chance. Our
    # gradients of the first step are within 1.7x torch32's own error of torch64's (measured by
    # recovering them from an SGD step with lr 1e6).
    "mobilenet_v3_small": Spec(_mobilenet_v3_small, image(3, 64), 8, 10, False,
                               "torchvision mobilenet_v3_small, 64x64 (hard swish, squeeze-excitation)",
                               ("sgd-momentum",)),
    "efficientnet_b0": Spec(_efficientnet_b0, image(3, 64), 8, 10, False,
                            "torchvision efficientnet_b0, 64x64, no dropout/stochastic depth"),
    "squeezenet1_1": Spec(_squeezenet, image(3, 64), 8, 10, False,
                          "torchvision squeezenet1_1, 64x64 (fire modules: Concat of two convolutions)"),
    "regnet_x_400mf": Spec(_regnet, image(3, 64), 8, 10, False,
                           "torchvision regnet_x_400mf, 64x64 (grouped convolutions)"),
    "vit": Spec(_vit_small, image(3, 16), 4, 10, False,
                "torchvision VisionTransformer: 16x16 images, 4x4 patches, 2 layers, dim 32"),
    "swin": Spec(_swin_small, image(3, 16), 4, 10, False,
                 "torchvision SwinTransformer: 2x2 patches, window 2, dim 16, depths 2+2"),
    "transformer_encoder": Spec(EncoderClassifier, tokens(EncoderClassifier.seq, EncoderClassifier.vocab),
                                4, 10, False, "nn.TransformerEncoder, 2 layers, dim 32, mean-pool classifier"),
    "gpt": Spec(CausalDecoder, tokens(CausalDecoder.seq, CausalDecoder.vocab), 4, CausalDecoder.vocab,
                True, "causal nn.TransformerEncoder (pre-LN, GELU), 2 layers, dim 32, next-token loss"),
    "lstm": Spec(lambda: RecurrentClassifier(nn.LSTM), sequence(6, 8), 4, 10, False,
                 "nn.LSTM(8, 16) classifier over 6 steps"),
    "gru": Spec(lambda: RecurrentClassifier(nn.GRU), sequence(6, 8), 4, 10, False,
                "nn.GRU(8, 16) classifier over 6 steps"),
}


def build(name, seed=1234):
    """The network \\p name with weights from \\p seed, dropout and stochastic depth off."""
    torch.manual_seed(seed)
    net = _no_randomness(ZOO[name].build())
    # torchvision starts some heads at zero (ViT's classifier); logits of zero would make the
    # inference comparison vacuous.
    with torch.no_grad():
        for p in net.parameters():
            if p.dim() >= 2 and not p.any():
                p.normal_(0.0, 0.02)
    return net


def dataset(name, rng, n):
    """n samples of model \\p name's inputs and its integer targets (key "target")."""
    spec = ZOO[name]
    data = spec.inputs(rng, n)
    if spec.per_token:
        seq = next(iter(data.values())).shape[1]
        data["target"] = rng.integers(0, spec.classes, size=(n, seq)).astype(np.int64)
    else:
        data["target"] = rng.integers(0, spec.classes, size=(n,)).astype(np.int64)
    return data


def loss(logits, target):
    """Cross-entropy; per token when the logits have a sequence axis."""
    if logits.dim() == 3:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
    return F.cross_entropy(logits, target)


class WithLoss(nn.Module):
    """forward(inputs..., target) -> scalar loss, so that the loss is inside the exported graph."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, *args):
        *inputs, target = args
        return loss(self.net(*inputs), target)


# The mobile nets of bench/zoo, at full size (224x224 images).
MOBILE = {
    "mobilenet_v2": _mobilenet_v2,
    "mobilenet_v3_small": _mobilenet_v3_small,
    "efficientnet_b0": _efficientnet_b0,
    "mnasnet": _mnasnet,
    "shufflenet_v2": _shufflenet_v2,
    "swin_t": _swin_t,
}
