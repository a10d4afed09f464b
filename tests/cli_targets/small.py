"""Small targets for the ``segc`` command's tests (tests/test_cli*.py): a function,
an ``nn.Module`` with two blocks, and a function that evaluates while traced."""

import mlx.core as mx
import mlx.nn as nn


def mlp(x: mx.array, w: mx.array) -> mx.array:
    h = mx.maximum(x @ w, 0.0)
    return mx.exp(h).sum(axis=-1)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def __call__(self, x: mx.array) -> mx.array:
        return self.b(nn.relu(self.a(x)))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        mx.random.seed(0)
        self.layers = [Block() for _ in range(3)]

    def __call__(self, x: mx.array) -> mx.array:
        for layer in self.layers:
            x = layer(x)
        return x


net = Net()
mx.eval(net.parameters())


def item_inside(x: mx.array) -> mx.array:
    return x * x.sum().item()


def branch_inside(x: mx.array) -> mx.array:
    if x.sum() > 0:
        return x
    return -x
