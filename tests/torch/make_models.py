#!/usr/bin/env python3
"""Writes the TorchScript models the torch tests train, with their data and PyTorch's own
losses training the same scripted module (same initial weights, data and optimizer).
Usage: make_models.py OUTDIR. Nothing binary is committed: the tests run this first.

OUTDIR/regression.pt      MLP regression, forward(inputs [B,6], targets [B,3]) -> mse loss
OUTDIR/regression_x.f32   STEPS*BATCH samples of 6 floats; regression_y.f32: 3 floats each
OUTDIR/regression_<opt>.txt  PyTorch's loss per step, micro-batch BATCH, one step per batch
OUTDIR/classifier.pt      MLP classifier, integer class ids as targets (cross-entropy)
OUTDIR/classifier_logits.pt  the same classifier (same weights) as forward(inputs) -> logits
OUTDIR/unused.pt          the regression MLP with a branch forward never takes
OUTDIR/dropout.pt         the regression MLP with dropout (train mode vs eval mode)
OUTDIR/lm.pt              token LM (embedding + linear, cross-entropy), vocab 256
OUTDIR/lm_logits.pt       the same LM (same weights) as forward(inputs) -> logits [B, T, vocab]
OUTDIR/blocks.pt          the regression as a sequence of blocks (a Sequential, a ModuleList's
                          items, a head; ZeRO stage 3 gathers one block at a time)
OUTDIR/blocks_logits.pt   a top-level nn.Sequential classifier, forward(inputs) -> logits
OUTDIR/digits_cnn.pt      small CNN for scikit-learn's 8x8 digits (inputs [B,8,8], class ids)
OUTDIR/wrong_arity.pt (three arguments), vector_loss.pt, no_params.pt, replaces_data.pt: the contract's error cases"""
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

STEPS, BATCH, N_IN, N_OUT = 20, 8, 6, 3
OPTIMIZERS = {  # the ds_config optimizer sections of the tests name the same settings
    "adamw": lambda p: torch.optim.AdamW(p, lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01),
    "sgd": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
}


class Regression(nn.Module):
    def __init__(self, n_out=N_OUT):
        super().__init__()
        self.fc1 = nn.Linear(N_IN, 16)
        self.fc2 = nn.Linear(16, n_out)

    def forward(self, inputs, targets):  # the loss in fp32 also when trained in bf16
        return F.mse_loss(self.fc2(torch.tanh(self.fc1(inputs))).float(), targets)


class Classifier(Regression):
    def __init__(self):
        super().__init__(n_out=4)

    def forward(self, inputs, targets):
        return F.cross_entropy(self.fc2(torch.relu(self.fc1(inputs))), targets)


class ClassifierLogits(Classifier):
    def forward(self, inputs):  # the app applies the cross-entropy
        return self.fc2(torch.relu(self.fc1(inputs)))


class Dropout(Regression):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.5)

    def forward(self, inputs, targets):
        return F.mse_loss(self.fc2(self.drop(torch.tanh(self.fc1(inputs)))), targets)


class Unused(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(N_IN, 16)
        self.extra = nn.Linear(16, 16)
        self.fc2 = nn.Linear(16, N_OUT)

    def forward(self, inputs, targets):
        h = torch.tanh(self.fc1(inputs))
        if bool(inputs.abs().max() > 1e6):  # never: extra gets no gradient
            h = self.extra(h)
        return F.mse_loss(self.fc2(h), targets)


class TokenLm(nn.Module):
    def __init__(self, vocab=256, dim=32):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, inputs, targets):
        logits = self.head(self.wte(inputs))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


class TokenLmLogits(TokenLm):
    def forward(self, inputs):
        return self.head(self.wte(inputs))


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        return torch.tanh(self.fc(x))


class Blocks(nn.Module):
    """Blocks stem.0, blocks.0, blocks.1, head (stem.1 has no parameters), then the loss."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Linear(N_IN, 16), nn.Tanh())
        self.blocks = nn.ModuleList([Block(16), Block(16)])
        self.head = nn.Linear(16, N_OUT)

    def forward(self, inputs, targets):
        h = self.stem(inputs)
        for block in self.blocks:
            h = block(h)
        return F.mse_loss(self.head(h).float(), targets)


def blocks_logits():
    return nn.Sequential(nn.Linear(N_IN, 16), nn.ReLU(), nn.Linear(16, 4))


class DigitsCnn(nn.Module):
    """scikit-learn's 8x8 digits: inputs [B, 8, 8] float, targets [B] class ids."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 4 * 4, 10)

    def forward(self, inputs, targets):
        h = F.max_pool2d(torch.relu(self.conv(inputs.unsqueeze(1))), 2)
        return F.cross_entropy(self.fc(h.flatten(1)), targets)


class WrongArity(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(N_IN, 1)

    def forward(self, inputs, targets, weights):
        return (self.fc(inputs) * weights).mean()


class VectorLoss(Regression):
    def forward(self, inputs, targets):
        return F.mse_loss(self.fc2(torch.tanh(self.fc1(inputs))), targets, reduction="none")


class ReplacesData(Regression):
    def forward(self, inputs, targets):
        with torch.no_grad():  # swaps fc1.weight's memory for a copy: dstrain refuses
            self.fc1.weight.set_(self.fc1.weight.detach().clone())
        return F.mse_loss(self.fc2(torch.tanh(self.fc1(inputs))), targets)


class NoParams(nn.Module):
    def forward(self, inputs, targets):
        return F.mse_loss(inputs, targets)


def pytorch_losses(path, x, y, make_optimizer):
    model = torch.jit.load(path)  # the very module dstrain loads
    opt = make_optimizer(model.parameters())
    losses = []
    for s in range(STEPS):
        loss = model(x[s * BATCH:(s + 1) * BATCH], y[s * BATCH:(s + 1) * BATCH])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main(out):
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    models = {}
    for name, cls in [("regression", Regression), ("classifier", Classifier), ("unused", Unused), ("dropout", Dropout), ("lm", TokenLm), ("digits_cnn", DigitsCnn),
                      ("blocks", Blocks), ("blocks_logits", blocks_logits),
                      ("wrong_arity", WrongArity), ("vector_loss", VectorLoss), ("no_params", NoParams),
                      ("replaces_data", ReplacesData)]:
        models[name] = cls()
        torch.jit.script(models[name]).save(os.path.join(out, name + ".pt"))
    for name, cls in [("classifier", ClassifierLogits), ("lm", TokenLmLogits)]:  # the logits form, same weights
        twin = cls()
        twin.load_state_dict(models[name].state_dict())
        torch.jit.script(twin).save(os.path.join(out, name + "_logits.pt"))
    x = torch.randn(STEPS * BATCH, N_IN)
    y = torch.sin(x[:, :N_OUT]) + 0.1 * torch.randn(STEPS * BATCH, N_OUT)
    x.numpy().tofile(os.path.join(out, "regression_x.f32"))
    y.numpy().tofile(os.path.join(out, "regression_y.f32"))
    for opt_name, make_optimizer in OPTIMIZERS.items():
        losses = pytorch_losses(os.path.join(out, "regression.pt"), x, y, make_optimizer)
        with open(os.path.join(out, f"regression_{opt_name}.txt"), "w") as f:
            f.write("\n".join(repr(v) for v in losses) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
